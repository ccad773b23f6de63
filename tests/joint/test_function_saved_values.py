"""Custom ``autograd.Function``s in a training step, by what their backward reads: the operand, the
output, an intermediate, saved with ``save_for_backward`` or kept as a ``ctx`` attribute.

A Function that saved its own output (``ctx.save_for_backward(y); return y``, the usual form of a
hand-written sigmoid, exp or attention kernel) had its output marked non-differentiable in the
joint trace (the output and the saved value were one tensor): the loss needed no grad (refused,
misleadingly), or, where another path reached the loss, the Function's gradient was silently
dropped. Each pattern here is checked against eager over two steps, plain and under Core ATen,
and with an optimizer; every model also adds a path that bypasses the Function, so a dropped
gradient shows as a wrong one.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import predispatch_func as pf
from tests.joint.reference import export_joint_checked


class SaveOutput(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = torch.sigmoid(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return g * y * (1 - y)


class SaveOutputAndInput(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = x.exp()
        ctx.save_for_backward(x, y)
        return y

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        return g * y + 0.0 * x


class SaveOutputTwice(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = torch.tanh(x)
        ctx.save_for_backward(y, y)
        return y

    @staticmethod
    def backward(ctx, g):
        y, also_y = ctx.saved_tensors
        return g * (1 - y * also_y)


class OutputOnCtx(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = torch.sigmoid(x)
        ctx.y = y
        return y

    @staticmethod
    def backward(ctx, g):
        return g * ctx.y * (1 - ctx.y)


class DetachedOutputOnCtx(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = x.exp()
        ctx.y = y.detach()
        return y

    @staticmethod
    def backward(ctx, g):
        return g * ctx.y


class IntermediateOnCtx(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        doubled = x * 2
        ctx.doubled = doubled
        return doubled.sin()

    @staticmethod
    def backward(ctx, g):
        return g * ctx.doubled.cos() * 2


class InputOnCtx(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.x = x
        return x * x

    @staticmethod
    def backward(ctx, g):
        return 2 * g * ctx.x


class TwoOutputsOneSaved(torch.autograd.Function):
    """Two differentiable outputs; the backward reads the second."""

    @staticmethod
    def forward(ctx, x):
        y, z = x.sin(), x.exp()
        ctx.save_for_backward(x, z)
        return y, z

    @staticmethod
    def backward(ctx, gy, gz):
        x, z = ctx.saved_tensors
        return gy * x.cos() + gz * z


class SavedOutputBesideIndices(torch.autograd.Function):
    """A differentiable output it saves and a non-differentiable one (as ``sort``/``max``)."""

    @staticmethod
    def forward(ctx, x):
        values, indices = x.sort(dim=-1)
        ctx.save_for_backward(values, indices)
        ctx.mark_non_differentiable(indices)
        return values, indices

    @staticmethod
    def backward(ctx, g, _):
        values, indices = ctx.saved_tensors
        return torch.zeros_like(g).scatter(-1, indices, g) * (1 + 0 * values)


FUNCTIONS = [SaveOutput, SaveOutputAndInput, SaveOutputTwice, OutputOnCtx, DetachedOutputOnCtx,
             IntermediateOnCtx, InputOnCtx, TwoOutputsOneSaved, SavedOutputBesideIndices]


class Step(nn.Module):
    """The Function on a linear layer's output, plus a path beside it to the loss."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn
        self.lin, self.beside = nn.Linear(4, 4), nn.Linear(4, 1)

    def forward(self, x):
        out = self.fn.apply(self.lin(x))
        first = out[0] if isinstance(out, tuple) else out
        rest = sum(o.sum() for o in out[1:] if o.is_floating_point()) if isinstance(out, tuple) else 0.0
        return first.pow(2).mean() + rest * 0.1 + self.beside(x).mean()


def _step(fn):
    torch.manual_seed(0)
    return Step(fn), (torch.randn(3, 4),)


@pytest.mark.parametrize("target", [None, "core_aten"])
@pytest.mark.parametrize("fn", FUNCTIONS, ids=lambda f: f.__name__)
def test_function_trains_as_eager_whatever_its_backward_reads(fn, target):
    model, args = _step(fn)
    export_joint_checked(model, args, target=pf.OpSet.core_aten() if target else None)


@pytest.mark.parametrize("fn", [SaveOutput, OutputOnCtx, TwoOutputsOneSaved], ids=lambda f: f.__name__)
def test_function_saving_its_output_steps_with_an_optimizer_as_eager(fn):
    model, args = _step(fn)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    export_joint_checked(model, args, optimizer=optimizer, calls=3)


def test_the_saved_output_keeps_the_functions_gradient_in_the_program():
    """The gradient of ``lin`` runs through the user's backward (``y * (1 - y)``), not around it."""
    model, args = _step(SaveOutput)
    ep = pf.export_joint(model, args)
    ops = [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]
    assert "aten.rsub.Scalar" in ops, ops  # the user's ``1 - y``
    grads = [s.target for s in ep.graph_signature.output_specs if s.kind.name == "GRADIENT_TO_PARAMETER"]
    assert set(grads) == {"lin.weight", "lin.bias", "beside.weight", "beside.bias"}


class _DataWrittenAfterTheCall(nn.Module):
    """Writes the Function's output through ``.data`` after the call: eager's backward then reads
    the written storage (no version bump), a program the value the Function returned."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn
        self.w = nn.Parameter(torch.randn(3))

    def forward(self, x):
        y = self.fn.apply(self.w)
        y.data.mul_(1.5)
        return (y * x).sum()


@pytest.mark.parametrize("fn", [SaveOutput, OutputOnCtx], ids=lambda f: f.__name__)
@pytest.mark.parametrize("entry", ["export", "export_joint"])
def test_a_data_write_to_an_output_the_function_saved_is_refused_by_name(fn, entry):
    """Was silently wrong (the gradient of ``w`` off by the write), as for an ATen op saving its result."""
    torch.manual_seed(0)
    model, args = _DataWrittenAfterTheCall(fn), (torch.randn(3),)
    with pytest.raises(pf.UnsupportedError, match=rf"autograd.Function {fn.__name__} \(as its result\) saved"):
        getattr(pf, entry)(model, args)


def test_a_data_write_to_an_output_the_function_did_not_save_trains_as_eager():
    """Not refused where the backward does not read the output (``InputOnCtx`` reads its operand)."""
    torch.manual_seed(0)
    export_joint_checked(_DataWrittenAfterTheCall(InputOnCtx), (torch.randn(3),))
