"""Our autograd extension HOPs replayed in a joint trace, so the backward runs them.

A ``pf_autograd_function`` call (a custom ``torch.autograd.Function``, or a tensor hook,
trace/extensions/hooks.py) holds the user's forward and backward as subgraphs. Recorded as one call,
it would give the joint trace nothing to differentiate; replayed here, its forward body
runs inline (recorded as forward ops) inside an autograd.Function whose backward runs the
backward body when the engine reaches it (recorded as backward ops): the program's
gradient is the user's backward, as in eager. ``pf_require_grad`` (``requires_grad_()``
in forward) gives a new leaf that requires grad, as eager's flag. A tensor subclass built or read
apart in forward (``flat_apply``, ``export.access_subclass_inner_tensor``) is refused for now.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import _torch_compat as tc
from ..regions.ops import pf_grad_region
from ..trace.extensions.autograd_function import operand_grads, pf_autograd_function
from ..trace.extensions.hooks import pf_require_grad
from .errors import JointError, JointProblem


class _ReplayedFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, fwd, bwd, constants: tuple, *operands):
        _, n_outputs, n_results, non_differentiable, grads_for = constants
        if _holds_grad_region(fwd):  # its markers must start from the grad mode the body runs in
            with torch.set_grad_enabled(False):
                flat = tuple(fwd(*operands))
        else:
            flat = tuple(fwd(*operands))
        results, saved = flat[:n_results], flat[n_results:]
        ctx.save_for_backward(*saved)
        ctx.bwd, ctx.n_outputs, ctx.grads_for, ctx.n_operands = bwd, n_outputs, grads_for, len(operands)
        # an output the user saved (or kept on ctx) is one tensor in both groups: returned again as
        # itself and marked non-differentiable, it made the output so too (the loss then needed no
        # grad, or its gradient silently skipped the Function), so the saved group gets an alias
        returned_saved = tuple(s.detach() if any(s is r for r in results) else s for s in saved)
        ctx.mark_non_differentiable(*(results[i] for i in non_differentiable), *returned_saved)
        return (*results, *returned_saved)

    @staticmethod
    def backward(ctx, *grads):
        return (None, None, None, *operand_grads(ctx, grads))


def _holds_grad_region(body: torch.fx.GraphModule) -> bool:
    return any(node.target is pf_grad_region for node in body.graph.nodes)


def replay_extension(target: Any, args: tuple) -> tuple[bool, Any]:
    """``(True, result)`` when ``target`` is one of our extension HOPs, replayed; else ``(False, None)``.

    A Function's forward runs with grad off, set by autograd where the joint trace records no
    marker; a grad region in its body records its entry and its exit (back to off). Around such a
    body the trace records the grad mode off before it and back on after it, so the joint graph's
    markers agree with the modes the ops ran in."""
    if target is pf_autograd_function:
        fwd, bwd, *rest = args
        constants, operands = tuple(rest[:5]), rest[5:]
        result = _ReplayedFunction.apply(fwd, bwd, constants, *operands)
        if _holds_grad_region(fwd):
            torch.set_grad_enabled(torch.is_grad_enabled())  # recorded: the caller's mode again
        return True, result
    if target is pf_require_grad:
        (value,) = args
        return True, value if value.requires_grad else target(value).requires_grad_(True)
    if tc.is_flat_apply(target) or target is tc.ACCESS_SUBCLASS_INNER_TENSOR:
        what = "builds a tensor subclass" if tc.is_flat_apply(target) else "reads an inner tensor of a tensor subclass"
        raise JointError(
            f"export_joint: forward {what} ({getattr(target, '__name__', target)} in its program): the joint "
            "trace replays the forward where these calls reach the subclass's own dispatch, which they were "
            "not written for (torch.export desugars them first), and a joint program runs without autograd, "
            "where TwoTensor's constructor refuses inner tensors that differ in requires_grad; do it outside "
            "the model, or export the forward alone (pf.export)", kind=JointProblem.UNSUPPORTED_MODEL)
    return False, None


__all__ = ["replay_extension"]
