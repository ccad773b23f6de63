"""verify_joint(judge_float64=True): a float32 difference told apart as rounding or as an error."""

from __future__ import annotations

import copy

import torch
from torch import nn

import predispatch_func as pf


class _ConvBatchNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8)

    def forward(self, x):
        return self.bn(self.conv(x)).relu()


def _built():
    torch.manual_seed(0)
    return _ConvBatchNorm().train(), (torch.randn(4, 3, 16, 16) * 3 + 1,)


def _loss(out):
    return out.pow(2).mean()


CORE = pf.OpSet.core_aten()


def test_a_lowering_that_rounds_elsewhere_is_judged_rounding():
    """Under core_aten, batch norm's backward sums in other ops than eager's kernel: at a tolerance
    tighter than float32's rounding the program differs, and the judge calls it rounding."""
    model, args = _built()
    reference = copy.deepcopy(model)
    ep = pf.export_joint(model, args, loss_fn=_loss, target=CORE)
    report = pf.verify_joint(ep, reference, args, loss_fn=_loss, calls=2, target=CORE, rtol=1e-7, atol=1e-9,
                             judge_float64=True)
    assert not report.ok, "the tolerance was meant to catch float32 rounding: the case tests less than it says"
    assert report.rounding is not None and report.rounding.equal_in_float64 and report.rounding.rounding, report
    assert "judged against float64: rounding" in str(report)
    for name, p in model.named_parameters():  # the caller's model untouched
        assert torch.equal(p, reference.get_parameter(name))


def test_a_wrong_program_is_not_judged_rounding():
    """A program whose graph computes something else (the convolution's result scaled by 1.001: a
    wrong lowering's kind of error) differs in float32 far beyond eager's own rounding: not rounding."""
    model, args = _built()
    reference = copy.deepcopy(model)
    ep = pf.export_joint(model, args, loss_fn=_loss, target=CORE)
    _scaled_after(ep, "convolution")
    report = pf.verify_joint(ep, reference, args, loss_fn=_loss, calls=1, target=CORE, judge_float64=True)
    assert not report.ok and report.rounding is not None
    assert not report.rounding.rounding and report.rounding.worst_ratio > 100, report


def test_nothing_is_judged_where_nothing_differs():
    model, args = _built()
    reference = copy.deepcopy(model)
    ep = pf.export_joint(model, args, loss_fn=_loss)
    report = pf.verify_joint(ep, reference, args, loss_fn=_loss, judge_float64=True)
    assert report.ok and report.rounding is None


class _Float32Inside(nn.Module):
    """Builds a float32 tensor of its own, as raft builds its grids: no float64 copy runs."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return torch.mm(x, self.fc.weight.float().t())  # in a float64 copy: double @ float raises


def _scaled_after(ep, op_name: str) -> None:
    """The program's first ``op_name`` node's result scaled by 1.001 for its users (not the output)."""
    graph = ep.graph_module.graph
    node = next(n for n in graph.nodes if n.op == "call_function" and op_name in str(n.target))
    with graph.inserting_after(node):
        scaled = graph.call_function(torch.ops.aten.mul.Tensor, (node, 1.001))
    node.replace_all_uses_with(scaled, delete_user_cb=lambda user: user is not scaled and user.op != "output")
    ep.graph_module.recompile()


def test_a_model_that_cannot_run_in_float64_is_not_judged_rounding():
    torch.manual_seed(0)
    model, args = _Float32Inside(), (torch.randn(3, 4),)
    reference = copy.deepcopy(model)
    ep = pf.export_joint(model, args, loss_fn=_loss)
    _scaled_after(ep, "mm")
    report = pf.verify_joint(ep, reference, args, loss_fn=_loss, judge_float64=True)
    assert not report.ok and report.rounding is not None and not report.rounding.rounding
    assert "the float64 copy could not run" in str(report)
