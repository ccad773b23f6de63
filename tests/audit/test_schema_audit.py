"""The schema audit: what it finds, what it decides, the shipped table, the CLI."""

import dataclasses
import json

import pytest
import torch

from predispatch_func import _torch_compat as tc
from predispatch_func import cli, schema_audit
from predispatch_func.artifacts import program_facts
from predispatch_func.schema_audit import audit_custom_op, forget_custom_audits, shipped_decision
from predispatch_func.schema_audit import table as audit_table
from predispatch_func.schema_audit.runner import audit_many, audit_op, overloads_in
from predispatch_func.schema_audit.tagger import DECOMPOSE, KEEP, LIES, apply_overrides, tag
from predispatch_func.torch_support import SUPPORTED_TORCH_RELEASES
from tests.support import custom_ops_for_audit  # noqa: F401  (registers the auditdemo namespace)
from tests.support.reference import export_checked, graph_code
from tests.support.torch_release import torch_release

A = torch.ops.aten
DEMO = torch.ops.auditdemo


def _audit(op):
    """Audit in a forked child, as the CLI does: a torch segfault must not take pytest with it."""
    (result,) = audit_many([op])
    return tag(op, result)


# --- what the audit finds -------------------------------------------------------------


@pytest.mark.parametrize("op", [A.type_as.default, A.einsum.default, A.sum_to_size.default],
                         ids=str)
def test_finds_composites_that_return_their_input(op):
    entry = _audit(op)
    assert entry.verdict == "lies_alias", entry
    assert entry.decision == DECOMPOSE
    assert "schema:identity" in entry.evidence  # found on the identity fast path


def _torch_tagged_composites():
    return [op for op in overloads_in("aten")
            if tc.has_composite_implicit_kernel(op) and tc.torch_tag_maybe_aliasing(op)]


def test_torch_tags_a_dozen_composites():
    assert len(_torch_tagged_composites()) >= 10


@pytest.mark.parametrize("op", _torch_tagged_composites(), ids=str)
def test_finds_every_composite_torch_tags_maybe_aliasing(op):
    entry = _audit(op)
    assert entry.verdict in LIES, entry
    assert entry.decision == DECOMPOSE


@pytest.mark.parametrize("op", [A.reshape.default, A.to.dtype, A.contiguous.default], ids=str)
def test_declared_alias_that_is_sometimes_fresh_is_maybe_alias(op):
    entry = _audit(op)
    assert entry.verdict == "maybe_alias", entry
    assert "alias on" in entry.evidence and "fresh on" in entry.evidence
    assert entry.decision == DECOMPOSE


@pytest.mark.parametrize("op", [A.linear.default, A.layer_norm.default, A.softmax.int,
                                A.scaled_dot_product_attention.default, A.matmul.default], ids=str)
def test_keeps_honest_composites(op):
    entry = _audit(op)
    assert entry.verdict == "honest", entry
    assert entry.decision == KEEP
    assert entry.runs >= 3


def test_kernel_that_writes_running_stats_without_bang():
    (result,) = audit_many([A.native_batch_norm.default])
    assert result.verdict == "lies_mutation", result
    assert "running_mean written" in result.evidence
    if torch_release() >= (2, 15):  # it checks its arguments now
        assert not result.crashes
        assert any("running_mean must be defined in evaluation mode" in e for e in result.errors), result
    else:  # it segfaults on the no-stats eval samples: the runner isolates them
        assert result.crashes, "expected torch to crash on the no-stats eval samples"


def test_rrelu_with_noise_now_declares_its_write():
    noise = A.rrelu_with_noise.default._schema.arguments[1]
    assert noise.alias_info is not None and noise.alias_info.is_write
    assert audit_op(A.rrelu_with_noise.default).verdict not in LIES


def test_crashing_op_costs_only_itself():
    crashes, honest = audit_many([DEMO.crashes.default, DEMO.honest_double.default], use_opinfo=False)
    assert crashes.verdict == "untested" and "crashed the interpreter" in crashes.evidence
    assert honest.verdict == "honest"


_hang_lib = torch.library.Library("auditdemo_hang", "DEF")  # noqa: TOR901
_hang_lib.define("sleeps(Tensor x) -> Tensor")


def _sleeps(x):
    import time

    time.sleep(60)
    return x


_hang_lib.impl("sleeps", _sleeps, "CompositeImplicitAutograd")


def test_hanging_op_times_out_and_the_audit_goes_on(monkeypatch):
    from predispatch_func.schema_audit import runner

    monkeypatch.setattr(runner, "OP_TIMEOUT_S", 1.0)
    hung, honest = audit_many([torch.ops.auditdemo_hang.sleeps.default, DEMO.honest_double.default],
                              use_opinfo=False)
    assert hung.verdict == "untested" and "timed out after 1s" in hung.evidence
    assert honest.verdict == "honest"


def test_audit_leaves_rng_and_grad_mode_alone():
    rng = torch.get_rng_state()
    audit_op(A.dropout.default)
    assert torch.equal(rng, torch.get_rng_state())
    assert torch.is_grad_enabled()


# --- custom namespaces: audited when export first meets them ------------------------------


def test_custom_composite_returning_its_input_is_caught():
    entry = audit_custom_op(DEMO.returns_input.default)
    assert entry.verdict == "lies_alias" and entry.decision == DECOMPOSE, entry


def test_custom_composite_writing_an_undeclared_input_is_caught():
    entry = audit_custom_op(DEMO.bumps_input.default)
    assert entry.verdict == "lies_mutation" and entry.decision == DECOMPOSE, entry
    assert "input x written" in entry.evidence


def test_alias_of_an_argument_other_than_the_declared_one_is_a_lie():
    entry = audit_custom_op(DEMO.aliases_the_other.default)
    assert entry.verdict == "lies_alias", entry
    assert "result is input y" in entry.evidence


class CustomLiesThenInplace(torch.nn.Module):
    def forward(self, x):
        y = DEMO.returns_input(x)
        y.mul_(3)
        z = DEMO.bumps_input(x)
        z.add_(1)
        return DEMO.honest_double(y) + z


def test_export_with_lying_custom_ops_equals_eager():
    forget_custom_audits()
    ep = export_checked(CustomLiesThenInplace(), (torch.randn(3),))
    decisions = program_facts(ep.graph_module).composite_decisions
    assert decisions["auditdemo.returns_input.default"] == ("decompose", "schema audit")
    assert decisions["auditdemo.bumps_input.default"] == ("decompose", "schema audit")
    assert decisions["auditdemo.honest_double.default"] == ("keep", "audit")
    code = graph_code(ep)
    assert "auditdemo.honest_double.default" in code and "returns_input" not in code
    assert [s.kind.name for s in ep.graph_signature.output_specs][0] == "USER_INPUT_MUTATION"


# --- the shipped table and the exporter --------------------------------------------------


def test_shipped_table_is_not_stale():
    problems = audit_table.staleness(audit_table.load())
    assert not problems, "rebuild with scripts/build_audit_table.py:\n" + "\n".join(problems[:20])


def test_staleness_notices_another_torch_and_changed_schemas():
    shipped = audit_table.load()
    entries = dict(shipped.entries)
    entries.pop("aten.type_as.default")
    entries["aten.linear.default"] = dataclasses.replace(entries["aten.linear.default"], schema="x")
    entries["aten.not_an_op.default"] = dataclasses.replace(entries["aten.matmul.default"],
                                                            op="aten.not_an_op.default")
    stale = audit_table.AuditTable("2.12.0", "0" * 40, entries)
    text = "\n".join(audit_table.staleness(stale))
    for expected in ("torch 2.12.0", "commit 000000000000", "composite aten.type_as.default is not",
                     "aten.linear.default changed schema", "aten.not_an_op.default is in the table"):
        assert expected in text


KEY_OPS = [A.type_as.default, A.einsum.default, A.sum_to_size.default, A.dropout.default,
           A.reshape.default, A.to.dtype, A.contiguous.default, A.linear.default,
           A.layer_norm.default, A.softmax.int, A.scaled_dot_product_attention.default,
           A.matmul.default, A.batch_norm.default]


@pytest.mark.parametrize("op", KEY_OPS, ids=str)
def test_shipped_table_agrees_with_a_live_audit(op):
    live = _audit(op)
    shipped = audit_table.load().entries[str(op)]
    assert (shipped.verdict, shipped.decision) == (live.verdict, live.decision)
    assert shipped_decision(op) == live.decision


def test_shipped_decision_answers_from_the_table():
    assert shipped_decision(A.type_as.default) == DECOMPOSE
    assert shipped_decision(A.linear.default) == KEEP
    assert shipped_decision(A.unsafe_split.Tensor) == DECOMPOSE  # a kernel that lies
    assert set(audit_table.load().entries) == {str(op) for op in overloads_in("aten")}


class TypeAsLinear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x, z):
        y = x.type_as(z)
        y.mul_(3)
        return self.lin(y)


def test_exporter_obeys_the_table():
    ep = export_checked(TypeAsLinear(), (torch.randn(2, 3), torch.randn(2, 3)))
    decisions = program_facts(ep.graph_module).composite_decisions
    assert decisions["aten.type_as.default"] == ("decompose", "schema audit")
    assert decisions["aten.linear.default"] == ("keep", "audit")
    assert "aten.linear.default" in graph_code(ep)


# --- one table per supported torch; lazily audited on another torch ------------------------


def test_every_supported_torch_ships_its_table():
    assert audit_table.shipped_releases() == list(SUPPORTED_TORCH_RELEASES)
    for release in SUPPORTED_TORCH_RELEASES:
        table = audit_table.load_release(release)
        assert audit_table.release_of(table.torch_version) == release
        assert table.entries["aten.type_as.default"].decision == DECOMPOSE
        assert table.entries["aten.linear.default"].decision == KEEP


def test_the_installed_torch_reads_its_own_table():
    assert audit_table.table_path().name == f"aten-{audit_table.installed_release()}.json"
    assert audit_table.release_of(audit_table.load().torch_version) == audit_table.installed_release()


@pytest.fixture
def torch_without_table(monkeypatch, tmp_path):
    """A torch this package ships no audit table for: an empty table folder, a fresh cache."""
    shipped = audit_table.load()
    monkeypatch.setattr(audit_table, "TABLES_DIR", tmp_path / "no-tables")
    monkeypatch.setenv("PREDISPATCH_FUNC_CACHE", str(tmp_path / "cache"))
    schema_audit.use_aten_entries(None)
    yield tmp_path / "cache", shipped
    schema_audit.use_aten_entries(None)


def test_without_a_table_composites_are_audited_when_met_and_cached(torch_without_table):
    cache, shipped_table = torch_without_table
    with pytest.warns(schema_audit.NoShippedAuditTable, match="audited the first time an export meets it"):
        ep = export_checked(TypeAsLinear(), (torch.randn(2, 3), torch.randn(2, 3)))
    decisions = program_facts(ep.graph_module).composite_decisions
    assert decisions["aten.type_as.default"] == ("decompose", "schema audit")
    assert decisions["aten.linear.default"] == ("keep", "audit")
    lazily = schema_audit._aten_entries()
    assert lazily.lazy and {"aten.type_as.default", "aten.linear.default"} <= set(lazily.audited_now)
    assert len(lazily.audited_now) < 20  # only what the export met, not all of aten
    # a later process answers from the cache file, auditing nothing
    (cache_file,) = cache.glob("audit-aten-*.json")
    again = schema_audit.AtenEntries.lazily(cache_file)
    assert again.get(A.type_as.default).decision == DECOMPOSE and not again.audited_now
    # and the lazy verdicts are the shipped table's
    shipped = shipped_table.entries
    for name in lazily.audited_now:
        assert (again._entries[name].verdict, again._entries[name].decision) == \
            (shipped[name].verdict, shipped[name].decision), name


def test_diff_between_releases_lists_changed_and_new_ops():
    before = audit_table.load_release(SUPPORTED_TORCH_RELEASES[0])
    entries = dict(before.entries)
    entries["aten.linear.default"] = dataclasses.replace(entries["aten.linear.default"], verdict="lies_alias",
                                                         decision=DECOMPOSE)
    removed = entries.pop("aten.type_as.default")
    after = audit_table.AuditTable("9.9.9", "", entries)
    changes = {c.op: c.what for c in audit_table.diff(before, after)}
    assert changes == {"aten.linear.default": "verdict", "aten.type_as.default": "removed"}
    assert {c.op: c.what for c in audit_table.diff(after, before)}["aten.type_as.default"] == "new"
    assert removed.composite


def test_cli_diff_between_shipped_releases(capsys):
    oldest, newest = SUPPORTED_TORCH_RELEASES[0], SUPPORTED_TORCH_RELEASES[-1]
    rows = _cli_json(capsys, "--diff", oldest, "--against", newest)
    expected = audit_table.diff(audit_table.load_release(oldest), audit_table.load_release(newest))
    assert [(r["op"], r["change"]) for r in rows] == [(c.op, c.what) for c in expected]
    assert cli.main(["audit", "--diff", oldest, "--against", newest]) == 0
    assert f"torch {oldest} -> {newest}" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="no audit table shipped for torch 1.0.0"):
        cli.main(["audit", "--diff", "1.0.0"])


def test_user_override_is_applied_and_shown():
    entry = _audit(A.linear.default)
    (overridden,) = apply_overrides([entry], {"aten.linear.default": DECOMPOSE})
    assert (overridden.decision, overridden.override, overridden.audit_decision) == (DECOMPOSE, DECOMPOSE, KEEP)
    with pytest.raises(ValueError):
        apply_overrides([entry], {"aten.linear.default": "maybe"})


# --- CLI ---------------------------------------------------------------------------------


def _cli_json(capsys, *argv):
    assert cli.main(["audit", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_cli_json_one_op(capsys):
    (row,) = _cli_json(capsys, "--op", "aten.type_as")
    assert row["op"] == "aten.type_as.default"
    assert (row["verdict"], row["decision"]) == ("lies_alias", "decompose")
    assert row["evidence"] and row["torch_keeps"] is True


def test_cli_json_says_on_which_layouts_a_composite_lies(capsys):
    rows = {r["op"]: r for r in _cli_json(capsys, "--op", "aten.to_sparse_bsr.default", "--op",
                                          "aten.to_sparse.sparse_dim", "--op", "aten.type_as.default")}
    assert rows["aten.to_sparse_bsr.default"]["decision"] == "decompose"
    assert rows["aten.to_sparse_bsr.default"]["lies_on_layouts"] == ["sparse_bsr"]
    assert "sparse_coo" in rows["aten.to_sparse.sparse_dim"]["lies_on_layouts"]
    assert rows["aten.type_as.default"]["lies_on_layouts"] == ["strided"]


def test_cli_verdict_filter_and_override(capsys):
    rows = _cli_json(capsys, "--op", "aten.reshape.default", "--op", "aten.linear.default",
                     "--verdict", "honest", "--override", "aten.linear.default=decompose")
    assert [r["op"] for r in rows] == ["aten.linear.default"]
    assert rows[0]["decision"] == "decompose" and rows[0]["audit_decision"] == "keep"


def test_cli_audits_a_users_namespace(capsys):
    rows = _cli_json(capsys, "--import", "tests.support.custom_ops_for_audit", "--namespace", "auditdemo")
    verdicts = {r["op"]: r["verdict"] for r in rows}
    assert verdicts == {"auditdemo.aliases_the_other.default": "lies_alias",
                        "auditdemo.bumps_input.default": "lies_mutation",
                        "auditdemo.crashes.default": "untested",
                        "auditdemo.honest_double.default": "honest",
                        "auditdemo.returns_input.default": "lies_alias"}


@pytest.mark.parametrize("width", [80, 200])
def test_audit_table_reads_well_at_any_width(width):
    from rich.console import Console

    from predispatch_func.schema_audit.report import render_table

    entries = [_audit(A.type_as.default), _audit(A.scaled_dot_product_attention.default)]
    console = Console(width=width, record=True, color_system=None)
    render_table(entries, console)
    lines = console.export_text().splitlines()
    assert max(len(line) for line in lines) <= width
    for entry in entries:  # op names never broken across lines
        assert any(entry.op in line for line in lines), entry.op
    assert any("lies_alias" in line for line in lines)


def test_cli_table_and_summary(capsys):
    assert cli.main(["audit", "--op", "aten.type_as", "--op", "aten.linear"]) == 0
    out = capsys.readouterr().out
    assert "lies_alias" in out and "honest" in out
    assert "2 composites" in out and "1 composites lie" in out
    assert "would keep 1 of them" in out


# --- samples and checker, piece by piece -------------------------------------------------


def test_identity_profile_aims_at_the_no_op_paths():
    from predispatch_func.schema_audit.samples import schema_samples

    by_source = {s.source: s for s in schema_samples(A.einsum.default)[0]}
    assert by_source["schema:identity"].args[0] == "ij->ji"  # permutation only
    assert len(by_source["schema:identity"].args[1]) == 1  # one-element list
    (x, size) = next(s for s in schema_samples(A.sum_to_size.default)[0] if s.source == "schema:identity").args
    assert list(x.shape) == size  # same size
    x, p, train = next(s for s in schema_samples(A.dropout.default)[0] if s.source == "schema:identity").args
    assert (p, train) == (0.0, False)  # zero probability, eval mode


def test_materialize_gives_fresh_tensors_with_the_same_strides():
    from predispatch_func.schema_audit.samples import schema_samples

    sample = next(s for s in schema_samples(A.contiguous.default)[0] if s.source == "schema:non-contiguous")
    (a,), _ = sample.materialize()
    (b,), _ = sample.materialize()
    assert a.data_ptr() != b.data_ptr() and not a.is_contiguous() and a.stride() == b.stride()


def test_out_overload_gets_outs_shaped_by_its_functional_sibling():
    from predispatch_func.schema_audit.samples import schema_samples

    sample = next(s for s in schema_samples(A.fft_fft.out)[0] if s.source == "schema:identity")
    assert sample.outs_from is A.fft_fft.default
    args, kwargs = sample.materialize()
    assert kwargs["out"].dtype == torch.complex64
    assert audit_op(A.fft_fft.out).verdict == "honest"


def test_checker_sees_a_view_that_is_not_the_same_object():
    from predispatch_func.schema_audit.checker import check
    from predispatch_func.schema_audit.samples import Sample

    sample = Sample("test", (torch.randn(2, 3),), {})
    assert check(A.transpose.int, [Sample("test", (torch.randn(2, 3), 0, 1), {})]).verdict == "honest"
    lied = check(A.einsum.default, [Sample("test", ("ij->ji", [torch.randn(2, 3)]), {})])
    assert lied.verdict == "lies_alias" and "shares storage with input tensors[0]" in lied.evidence
    assert check(A.clone.default, [sample]).verdict == "honest"


class RecurrentAndBag(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = torch.nn.LSTM(3, 4)
        self.gru = torch.nn.GRU(4, 4)
        self.bag = torch.nn.EmbeddingBag(10, 3)

    def forward(self, x, idx, offsets):
        y, _ = self.lstm(x)
        z, _ = self.gru(y)
        return z.sum() + self.bag(idx, offsets).sum()


def test_composites_audited_through_recipes_are_kept_and_replay():
    args = (torch.randn(2, 1, 3), torch.tensor([1, 2, 3, 4]), torch.tensor([0, 2]))
    ep = export_checked(RecurrentAndBag(), args)
    decisions = program_facts(ep.graph_module).composite_decisions
    for name in ("aten.lstm.input", "aten.gru.input", "aten.embedding_bag.padding_idx"):
        assert decisions[name] == ("keep", "audit"), decisions


# --- layouts: what dense samples cannot show -----------------------------------------


@pytest.mark.parametrize("op, found_on", [
    (A.to_sparse_csr.default, "sparse_"), (A.to_sparse_csc.default, "sparse_csc"),
    (A.gather_backward.default, "True"),  # sparse_grad=True: a COO result whose values view grad
], ids=str)
def test_composites_that_alias_only_on_sparse_tensors_are_caught(op, found_on):
    """Dense runs alone called these honest (a sparse tensor has no plain storage, and
    dense inputs take the fresh path); the audit now runs sparse layouts and compares
    indices and values storages."""
    entry = _audit(op)
    assert entry.verdict == "lies_alias", entry
    assert found_on in entry.evidence and entry.decision == DECOMPOSE
    shipped = audit_table.load().entries[str(op)]
    assert (shipped.verdict, shipped.decision) == ("lies_alias", DECOMPOSE)


def test_an_accepted_layout_no_sample_ran_on_is_untested():
    """``linear`` has sparse kernels; the samples ran it on COO, CSR, CSC and BSR
    inputs but no BSC one: untested there, not honest."""
    entry = _audit(A.linear.default)
    assert entry.verdict == "honest" and entry.decision == KEEP
    assert "sparse_bsc" in entry.untested_layouts and "sparse_coo" not in entry.untested_layouts
    assert audit_table.load().entries["aten.linear.default"].untested_layouts == entry.untested_layouts


# the composites that return their input only when it is already in the layout (and blocksize or
# sparse_dim) asked for: the layout samples convert with other parameters, which they refuse
_SAME_LAYOUT_IDENTITIES = [(A.to_sparse.sparse_dim, "sparse_coo"), (A.to_sparse_bsr.default, "sparse_bsr"),
                           (A.to_sparse_bsc.default, "sparse_bsc")]


@pytest.mark.parametrize("op, layout", _SAME_LAYOUT_IDENTITIES, ids=str)
def test_conversions_that_return_a_sparse_input_itself_are_caught_and_say_on_which_layout(op, layout):
    """Were honest and kept: no sample ever ran them on a sparse input they accept."""
    entry = _audit(op)
    assert (entry.verdict, entry.decision) == ("lies_alias", DECOMPOSE), entry
    assert "result is input self" in entry.evidence and layout in entry.evidence
    assert layout in entry.lies_on_layouts and "strided" not in entry.lies_on_layouts
    shipped = audit_table.load().entries[str(op)]
    assert (shipped.verdict, shipped.decision, shipped.lies_on_layouts) == (
        entry.verdict, entry.decision, entry.lies_on_layouts)


def test_fbgemm_fp16_packing_writes_its_input_where_the_build_has_fbgemm():
    """``fbgemm_pack_gemm_matrix_fp16`` clamps its (contiguous) input in place to float16's range:
    a write its schema does not declare, seen only on values beyond that range."""
    op = A.fbgemm_pack_gemm_matrix_fp16.default
    w = torch.tensor([[7e4, -1e5, 1.0], [2.0, 3.0, 7e4]])
    entry = _audit(op)
    if not tc.has_fbgemm():  # the op raises everywhere: untested, so decomposed all the same
        assert (entry.verdict, entry.decision) == ("untested", DECOMPOSE), entry
        return
    before = w.clone()
    op(w)
    assert not torch.equal(w, before)  # eager, as the audit saw it
    assert (entry.verdict, entry.decision, entry.lies_on_layouts) == ("lies_mutation", DECOMPOSE, ["strided"])
    assert "input input written" in entry.evidence and "beyond-float16" in entry.evidence
    assert audit_table.load().entries[str(op)].decision == DECOMPOSE


def test_sparse_samples_are_fresh_and_keep_their_layout():
    from predispatch_func.schema_audit.sample_sources import samples_for

    samples, _ = samples_for(A.to_sparse_csr.default)
    sparse = [s for s in samples if s.layout != "strided"]
    assert {s.layout for s in sparse} >= {"sparse_coo", "sparse_csr", "sparse_csc"}
    s = next(s for s in sparse if s.layout == "sparse_csr")
    (a, *_), _ = s.materialize()
    (b, *_), _ = s.materialize()
    assert a.layout == torch.sparse_csr and a.values().data_ptr() != b.values().data_ptr()


def test_kept_composite_on_an_untested_layout_is_decomposed():
    """The exporter obeys the audit per layout: ``keep`` holds for the layouts it ran."""
    from predispatch_func.trace.composite_policy import CompositePolicy

    policy = CompositePolicy(audit_lookup=lambda op: KEEP, untested_layouts=lambda op: ["sparse_csr"])
    dense = torch.randn(2, 3)
    assert not policy.should_decompose(A.linear.default, (dense, torch.randn(4, 3)), {})
    policy = CompositePolicy(audit_lookup=lambda op: KEEP, untested_layouts=lambda op: ["sparse_csr"])
    assert policy.should_decompose(A.linear.default, (dense.to_sparse_csr(), torch.randn(4, 3)), {})
    assert policy.decisions["aten.linear.default"] == ("decompose", "the schema audit never ran it on sparse_csr inputs")
    policy = CompositePolicy(audit_lookup=lambda op: KEEP, untested_layouts=lambda op: ["sparse_csr"])
    assert not policy.should_decompose(A.linear.default, (dense.to_sparse(), torch.randn(4, 3)), {})
