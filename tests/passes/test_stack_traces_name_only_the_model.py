"""Every node's ``stack_trace``, in every graph of a program, holds the model's frames only: not
the frames of this package (the joint program's loss wrapper, a HOP body traced by fx under our
torch-function modes) nor dynamo's generated graphs; and it still names the user's line."""

from __future__ import annotations

import os

import torch

import predispatch_func as pf
from predispatch_func.graphs import all_graph_modules
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


def _check(ep: torch.export.ExportedProgram, *, bodies_named: bool = True) -> None:
    traces = [(where, trace) for where, trace in _traces(ep) if "loss_fn(out)" not in trace]
    assert traces
    ours = [(where, trace) for where, trace in traces if _PACKAGE in trace]
    assert ours == [], ours[0]
    assert any("the linear's line" in trace for _, trace in traces)
    if bodies_named:
        assert any(where != "<top>" and "the cond's line" in trace for where, trace in traces), traces


def test_forward_program_and_cond_bodies():
    _check(export_checked(_Branching(), (torch.randn(3, 4),)))  # replayed against eager too


def test_joint_program_with_a_loss_function():
    """The loss's own nodes name the joint's call of ``loss_fn`` (ours: fx records ``forward``
    frames only, and a loss function's frame is not one); the model's nodes name the model, with
    no frame of the joint's wrapper around it."""
    _check(pf.export_joint(_Branching(), (torch.randn(3, 4),), loss_fn=lambda out: out.pow(2).mean()),
           bodies_named=False)  # the joint's cond bodies carry no stack traces yet
