"""Every node's ``stack_trace``, in every graph of a program, holds the model's frames only: not
the frames of this package (the joint program's loss wrapper, a HOP body traced by fx under our
torch-function modes) nor dynamo's generated graphs; and it still names the user's line."""

from __future__ import annotations

import os

import pytest
import torch

import predispatch_func as pf
from predispatch_func.graphs import all_graph_modules
from tests.joint.reference import export_joint_checked
from tests.support.reference import export_checked

_PACKAGE = os.path.dirname(os.path.abspath(pf.__file__)) + os.sep


class _Branching(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)  # the linear's line
        return torch.cond(y.sum() > 0, lambda t: t.sin() * 2, lambda t: t.cos() + 1, (y,))  # the cond's line


def _traces(ep: torch.export.ExportedProgram) -> list[tuple[str, str]]:
    return [(where, node.meta["stack_trace"]) for where, gm in all_graph_modules(ep.graph_module)
            for node in gm.graph.nodes if node.op == "call_function" and node.meta.get("stack_trace")]


def _check(ep: torch.export.ExportedProgram) -> None:
    traces = _traces(ep)
    assert traces
    ours = [(where, trace) for where, trace in traces if _PACKAGE in trace]
    assert ours == [], ours[0]
    assert any("the linear's line" in trace for _, trace in traces)
    assert any(where != "<top>" and "the cond's line" in trace for where, trace in traces), traces


def test_forward_program_and_cond_bodies():
    _check(export_checked(_Branching(), (torch.randn(3, 4),)))  # replayed against eager too


def _loss(out: torch.Tensor) -> torch.Tensor:
    return out.pow(2).mean()  # the loss's line


def test_joint_program_with_a_loss_function():
    """The loss's nodes name the user's loss function; the model's nodes name the model, with no
    frame of the joint's wrapper around it; the cond's branches, forward and backward, name the
    cond's line."""
    ep = export_joint_checked(_Branching(), (torch.randn(3, 4),), loss_fn=_loss)  # steps replayed against eager
    _check(ep)
    top = [n for n in ep.graph.nodes if n.op == "call_function"]
    assert [n.target for n in top if "the loss's line" in n.meta["stack_trace"]
            and not n.meta.get("autograd_backward")] == [torch.ops.aten.pow.Tensor_Scalar, torch.ops.aten.mean.default]
    for _, gm in all_graph_modules(ep.graph_module):
        for node in gm.graph.nodes:
            assert node.op != "call_function" or node.meta.get("stack_trace"), (gm, node)


def _mse_loss(out: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.mse_loss(out, torch.ones_like(out))  # lowered under core_aten


@pytest.mark.parametrize("target", [None, "core_aten"])
def test_joint_backward_nodes_are_named_after_their_forward_op(target):
    """A backward op carries the stack trace, module stack and ``seq_nr`` of the forward node
    whose autograd node ran it, and ``autograd_backward`` (as torch's joint tracing marks it):
    the linear's weight gradient names the linear, not the cond beside it in the graph; also
    where a lowering into the target records the backward ops (and copies metadata of its own)."""
    ep = export_joint_checked(_Branching(), (torch.randn(3, 4),), loss_fn=_mse_loss,
                              target=pf.OpSet.core_aten() if target else None)
    top = [n for n in ep.graph.nodes if n.op == "call_function"]
    backward = [n for n in top if n.meta.get("autograd_backward")]
    forward = [n for n in top if not n.meta.get("autograd_backward")]
    linear_nodes = [n for n in forward if list(n.meta["nn_module_stack"]) == ["L__self__", "L__self__lin"]]
    linear = linear_nodes[0]  # aten.linear; lowered: its permute and addmm
    weight_grad = next(n for n in backward if n.target is torch.ops.aten.mm.default)
    assert "the linear's line" in weight_grad.meta["stack_trace"]
    assert list(weight_grad.meta["nn_module_stack"]) == ["L__self__", "L__self__lin"]
    assert weight_grad.meta["seq_nr"] in {n.meta["seq_nr"] for n in linear_nodes}
    cond_backward = [n for n in backward if n.target is torch.ops.higher_order.cond]
    assert len(cond_backward) == 1 and "the cond's line" in cond_backward[0].meta["stack_trace"]
    assert forward.index(linear) < forward.index(next(n for n in forward if n.target is torch.ops.higher_order.cond))
    assert min(top.index(n) for n in backward) > top.index(forward[-1]), "a backward node inside the forward"


def test_joint_optimizer_update_names_no_line_of_the_user():
    """The optimizer's update comes from torch.optim's code, not the model's: its nodes carry no
    stack trace (not the line of the gradient they read) and are not backward nodes."""
    model = _Branching()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ep = export_joint_checked(model, (torch.randn(3, 4),), loss_fn=_loss, optimizer=optimizer, calls=3)
    top = [n for n in ep.graph.nodes if n.op == "call_function"]
    last_backward = max(i for i, n in enumerate(top) if n.meta.get("autograd_backward"))
    update = top[last_backward + 1:]
    assert update and all(not n.meta.get("stack_trace") and not n.meta.get("autograd_backward") for n in update)
    assert all(list(n.meta["nn_module_stack"]) == ["L__self__"] for n in update)
    assert not any("pf_no_user_line" in n.meta for n in top)
