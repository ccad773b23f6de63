"""Backend op sets: ``OpSet`` and ``export(..., target=)``.

Every exported program is replayed against the reference (outputs, written-back
buffers, gradients) and checked for membership in its target, in every graph.
"""

import re
import warnings

import pytest
import torch

import predispatch_func as pf
from predispatch_func.graphs import all_graph_modules
from tests.support.reference import call_targets, export_checked, graph_code

aten = torch.ops.aten
BACKEND = pf.OpSet.core_aten() | pf.OpSet.from_names(
    ["aten.linear.default", "aten.layer_norm.default", "aten.softmax.int", "aten.gelu.default",
     "aten.scaled_dot_product_attention.default"], name="backend")


# --- OpSet ------------------------------------------------------------------------


def test_core_aten_is_torchs_core_tag_plus_functional_twins():
    core = pf.OpSet.core_aten()
    tagged = {op for op in core if torch.Tag.core in op.tags}
    assert len(tagged) > 150 and aten.add.Tensor in core and aten.convolution.default in core
    assert aten.linear.default not in core and aten.add_.Tensor not in core
    assert set(core) - tagged == {aten._native_batch_norm_legit_functional.default}


def test_names_resolve_overloads_and_packets():
    one = pf.OpSet.from_names(["aten.add.Tensor", "torch.ops.aten.mul.Tensor", "aten::sub.Tensor"])
    assert set(one) == {aten.add.Tensor, aten.mul.Tensor, aten.sub.Tensor}
    packet = pf.OpSet.from_names(["aten.softmax"])
    assert set(packet) == {getattr(aten.softmax, o) for o in aten.softmax.overloads()}
    assert len(packet) >= 2 and "aten.softmax.int" in packet
    with pytest.raises(ValueError, match=r"'aten.softmx.int'.*'aten.nope'"):
        pf.OpSet.from_names(["aten.softmx.int", "aten.add.Tensor", "aten.nope"])


def test_file_with_comments_and_set_algebra(tmp_path):
    path = tmp_path / "my_backend.txt"
    path.write_text("# my backend\n@core_aten\naten.linear.default   # fast GEMM\n\n"
                    "aten.softmax.int\n")
    target = pf.OpSet.from_file(path)
    assert target == pf.OpSet.core_aten() | pf.OpSet.from_names(["aten.linear.default", "aten.softmax.int"])
    assert pf.OpSet.parse(str(path)) == target and pf.OpSet.parse("core_aten") == pf.OpSet.core_aten()
    smaller = target.difference("aten.linear.default")
    assert "aten.linear.default" not in smaller and len(smaller) == len(target) - 1
    assert target.union("aten.linear") - pf.OpSet.from_names(["aten.linear"]) == smaller


# --- export(..., target=) ---------------------------------------------------------


class Block(torch.nn.Module):
    """Composites a backend may keep, an in-place activation, a no_grad buffer update,
    a lying composite (``type_as`` returns its input) followed by an in-place op."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.ln = torch.nn.LayerNorm(8)
        self.register_buffer("seen", torch.zeros(8))

    def forward(self, x):
        y = torch.nn.functional.silu(self.ln(self.lin(x)), inplace=True)
        with torch.no_grad():
            self.seen.add_(y.mean(0))
            w = torch.softmax(y, -1)
        y = y.type_as(x)
        y.mul_(2)
        return torch.nn.functional.gelu(y) * w, x.t().reshape(-1)


def _regions(ep):
    return sorted(n.target.name() for _, gm in all_graph_modules(ep.graph_module)
                  for n in gm.graph.nodes if isinstance(n.target, torch._ops.HigherOrderOperator))


def test_core_aten_target_lowers_everything_and_keeps_the_region():
    model, x = Block(), torch.randn(4, 8)
    ep = export_checked(model, (x,), target=pf.OpSet.core_aten())
    assert pf.verify(ep, model, (x,), target=pf.OpSet.core_aten()).ok
    ops = call_targets(ep)
    assert {"aten.addmm.default", "aten.native_layer_norm.default", "aten._softmax.default"} <= ops
    assert not ops & {"aten.linear.default", "aten.layer_norm.default", "aten.silu.default"}
    assert _regions(ep) == ["pf_grad_region"]
    assert "_softmax" in graph_code(ep).split("# grad_region_0")[1]


def test_backend_target_keeps_its_honest_composites_and_warns_on_a_lying_one():
    model, x = Block(), torch.randn(4, 8)
    target = BACKEND | pf.OpSet.from_names(["aten.type_as.default"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ep = export_checked(model, (x,), target=target)
    ops = call_targets(ep)
    assert {"aten.linear.default", "aten.layer_norm.default", "aten.softmax.int", "aten.gelu.default"} <= ops
    assert "aten.type_as.default" not in ops
    lying = [w for w in caught if issubclass(w.category, pf.opsets.TargetMemberDecomposed)]
    assert [str(w.message).split()[0] for w in lying] == ["aten.type_as.default"]
    assert pf.verify(ep, target=target).ok


def test_program_trains_through_module():
    model, x = Block(), torch.randn(4, 8)
    ep = export_checked(model, (x,), target=BACKEND)
    program = ep.module()
    out, _ = program(x)
    out.sum().backward()
    grads = {k: p.grad for k, p in program.named_parameters()}
    assert all(g is not None and g.abs().sum() > 0 for g in grads.values()), grads


def test_unreachable_target_names_each_op_and_the_users_line():
    class Gate(torch.nn.Module):
        def forward(self, x):
            a = torch.sigmoid(x)
            return torch.cumsum(a, 0) + torch.tanh(a)

    target = pf.OpSet.core_aten() - pf.OpSet.from_names(["aten.sigmoid.default", "aten.tanh.default"])
    with pytest.raises(pf.UnsupportedError) as info:
        pf.export(Gate(), (torch.randn(3),), target=target)
    assert info.value.kind is pf.Refusal.OP_NOT_IN_TARGET
    message = str(info.value)
    assert re.search(r"aten\.sigmoid\.default: .*\n.*test_opsets\.py\", line \d+.*torch\.sigmoid\(x\)",
                     message), message
    assert re.search(r"aten\.tanh\.default: .*\n.*test_opsets\.py\", line \d+.*torch\.tanh\(a\)",
                     message), message
    assert "aten.cumsum" not in message and message.count("aten.") == 2


def test_verify_reports_ops_outside_the_target():
    model, x = Block(), torch.randn(4, 8)
    ep = pf.export(model, (x,))
    report = pf.verify(ep, target=pf.OpSet.core_aten())
    assert not report.ok and any("aten.linear.default" in p for p in report.problems)
    assert any(p.startswith("grad_region_0:") and "softmax" in p for p in report.problems), report


# --- predispatch-func ops ------------------------------------------------------------


def make_gate():
    """A factory for the CLI: linear + softmax under no_grad + zeta against a number (torch
    decomposes ``special_zeta.other_scalar`` only into prims; ``var_mean`` was the example
    until ours lowered it)."""

    class Gate(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            y = self.lin(x)
            with torch.no_grad():
                w = torch.softmax(y, -1)
            return torch.special.zeta(y * w + 2, 2.0)

    return Gate(), (torch.randn(3, 4),)


def _ops_json(capsys, *argv):
    import json

    from predispatch_func.cli import main

    rc = main(["ops", *argv, "--json"])
    return rc, {row["op"]: row for row in json.loads(capsys.readouterr().out)}


def test_ops_cli_lists_ops_and_what_a_target_lacks(capsys, tmp_path):
    rc, rows = _ops_json(capsys, "tests.opsets.test_opsets:make_gate")
    assert rc == 0 and rows["aten.linear.default"]["composite"] == "kept (audit)"
    assert rows["aten.linear.default"]["count"] == 1 and rows["aten.linear.default"]["has_decomposition"]
    where = rows["aten.softmax.int"]["where"]
    assert len(where) == 1 and where[0].startswith("<root> (Gate) test_opsets.py:") and "torch.softmax" in where[0]

    rc, rows = _ops_json(capsys, "tests.opsets.test_opsets:make_gate", "--target", "core_aten")
    assert rc == 1  # zeta against a number cannot be lowered into Core ATen
    assert rows["aten.mul.Tensor"]["in_target"] is True
    assert rows["aten.linear.default"]["missing_why"].startswith("decomposes")
    assert "prims" in rows["aten.special_zeta.other_scalar"]["missing_why"]

    model, args = make_gate()
    path = tmp_path / "gate.pt2"
    torch.export.save(pf.export(model, args), path)
    rc, from_file = _ops_json(capsys, "--program", str(path), "--target", "core_aten")
    assert rc == 0 and from_file.keys() == rows.keys()


def _ops_table(width, *argv):
    import argparse

    from rich.console import Console

    from predispatch_func.commands.ops import run as cmd_ops

    console = Console(width=width, record=True, color_system=None)
    ns = argparse.Namespace(factory="tests.opsets.test_opsets:make_gate", program=None, target=None, json=False, wide=False)
    for flag in argv:
        setattr(ns, flag.lstrip("-"), flag.startswith("--wide") or getattr(ns, flag.lstrip("-")))
    cmd_ops(ns, console)
    return console.export_text()


@pytest.mark.parametrize("width", [80, 100])
def test_ops_table_reads_well_at_80_columns(width):
    text = _ops_table(width)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= width
    for op in ("aten.linear.default", "aten.softmax.int"):
        assert any(op in line for line in lines), op  # never broken across lines
    for header in ("calls", "core", "composite", "decomp"):
        assert header in text  # never squeezed to an ellipsis
    places = [line.strip() for line in lines if "test_opsets.py:" in line]
    assert places and all(re.fullmatch(r"\S+ \(\w+\) test_opsets\.py:\d+", p) for p in places), places


def test_ops_table_wide_shows_source_lines_and_a_wide_terminal_a_where_column():
    assert "torch.softmax" in _ops_table(80, "--wide")
    wide_terminal = _ops_table(200)
    row = next(line for line in wide_terminal.splitlines() if "aten.softmax.int" in line)
    assert "test_opsets.py:" in row  # the place is in the op's row


def test_core_aten_target_lowers_inside_torch_cond_branches():
    class Branchy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            return torch.cond(x.sum() > 0, lambda v: torch.softmax(self.lin(v), -1),
                              lambda v: torch.nn.functional.silu(v), (x,))

    for x in (torch.randn(3, 4).abs(), -torch.randn(3, 4).abs()):
        model = Branchy()
        ep = export_checked(model, (x,), target=pf.OpSet.core_aten())
        assert _regions(ep) == ["cond"]
        assert {"aten.addmm.default", "aten._softmax.default", "aten.sigmoid.default"} <= call_targets(ep)
        assert pf.verify(ep, target=pf.OpSet.core_aten()).ok
