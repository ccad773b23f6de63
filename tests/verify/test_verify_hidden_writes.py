"""``pf.verify`` runs the graph itself on copies of its inputs and reports any input it
changed: a kept op whose kernel writes an input its schema does not mark passes the
schema check and even the replay (the kernel writes the real buffer, as eager does)."""

import torch

import predispatch_func as pf
from predispatch_func.hidden_writes import inputs_the_graph_writes
from predispatch_func.verify import copy_without_history

_LIB = torch.library.Library("pf_hidden_writes_test", "DEF")
_LIB.define("bump(Tensor x) -> Tensor")  # lies: the kernel writes ``x``
_LIB.impl("bump", lambda x: x.add_(1).mul(2), "CompositeExplicitAutograd")
_LIB.impl("bump", lambda x: torch.empty_like(x), "Meta")


class BumpsItsBuffer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(3))

    def forward(self, x):
        return torch.ops.pf_hidden_writes_test.bump(self.count) + x


class Honest(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(3))

    def forward(self, x):
        self.count.add_(1)
        return self.count * 2 + x


def test_a_kept_op_writing_a_buffer_it_does_not_declare_is_reported():
    model, x = BumpsItsBuffer(), torch.randn(3)
    ep = pf.export(model, (x,))
    report = pf.verify(ep, model, (x,))
    assert not report.ok
    assert any("writes its input b_count" in p for p in report.problems), report.problems
    assert torch.equal(model.count, torch.zeros(3)), "neither export nor verify may write the model"


def test_a_declared_write_is_not_a_hidden_one():
    model, x = Honest(), torch.randn(3)
    ep = pf.export(model, (x,))
    report = pf.verify(ep, model, (x,))
    assert report.ok, report.problems
    assert "the graph writes none of its inputs" in report.checked
    assert inputs_the_graph_writes(copy_without_history(ep)[0], (x,), {}, seed=0) == []


def test_the_check_leaves_the_callers_rng_and_inputs_alone():
    model, x = BumpsItsBuffer(), torch.randn(3)
    ep = pf.export(model, (x,))
    x_before, rng = x.clone(), torch.get_rng_state()
    assert inputs_the_graph_writes(copy_without_history(ep)[0], (x,), {}, seed=3) == ["b_count"]
    assert torch.equal(torch.get_rng_state(), rng)
    assert torch.equal(x, x_before)


def test_torchs_batch_norm_kernels_that_write_undeclared_are_traced_with_their_writes_said():
    """Two of torch's own: ``native_batch_norm.out`` (functionalized into ``native_batch_norm``,
    which torch tags as lying) and ``batch_norm_update_stats`` (untagged). Found by the
    conformance run's check above; each program now declares the running statistics' writes and
    equals eager over three calls (tests/support/cases_core.py)."""
    from tests.support.cases_core import CASES
    from tests.support.reference import export_case, mutations

    programs = {"batch_norm_out_variant_writes_running_stats":  # each: the contract, the graph writing
                export_case("batch_norm_out_variant_writes_running_stats"),  # none of its inputs, a replay
                "batch_norm_update_stats_writes_running_stats":
                export_case("batch_norm_update_stats_writes_running_stats")}
    for name, ep in programs.items():
        model, args, _ = CASES[name].build()
        pf.verify(ep, model, args, calls=3, raise_on_failure=True)
        after_autograd = pf.export(model, args, pre_dispatch=False)  # the same restatement after autograd
        pf.verify(after_autograd, model, args, calls=3, raise_on_failure=True)
        assert ("BUFFER_MUTATION", "mean") in mutations(after_autograd), name
        assert ("BUFFER_MUTATION", "mean") in mutations(ep) and ("BUFFER_MUTATION", "var") in mutations(ep), name
        assert not {str(n.target) for n in ep.graph.nodes} & {
            "aten.native_batch_norm.default", "aten.batch_norm_update_stats.default"}, name
