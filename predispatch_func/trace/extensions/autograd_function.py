"""The ``pf_autograd_function`` HOP: a custom ``torch.autograd.Function`` in the IR.

One call holds the user's forward and backward as two functional subgraphs::

    (*results, *saved) = pf_autograd_function(fwd, bwd, "ScaleGrad", n_outputs, n_results,
                                              non_differentiable, grads_for, *operands)
    # fwd(*operands)                  -> (*results, *saved)
    # bwd(*saved, *grads_of_outputs)  -> one gradient per operand listed in grads_for

``results`` are the Function's tensor outputs, then the operands its forward
wrote without ``mark_dirty`` (new values; the caller's graph writes them back).
``n_outputs`` counts the first group, which alone takes part in the backward;
``n_results`` counts both groups. ``saved`` are what the backward reads; the
call returns them too (never differentiable) so that the call is one pure
function of its operands at every level of torch's dispatcher.
``non_differentiable`` lists results that never require grad (``ctx.mark_non_differentiable``
and the written-operand group). ``grads_for`` lists the operands the backward
returns a gradient for (the others get ``None``).

Calling it (the Autograd rule) runs an autograd.Function whose backward is
``bwd``, so ``ep.module()`` trains with the user's gradient. Below autograd
the call stays one node under every tracer: torch's (``run_decompositions``,
``torch.export.export`` of ``ep.module()``) through the rules registered here,
ours through ``function_calls.retrace_call``. Either way the bodies are traced
again by the tracer in progress, so its decompositions apply inside them.
"""

from __future__ import annotations

from typing import Any

import torch

from ... import _torch_compat as tc
from .fakes import fresh_like, output_values
from .function_calls import retrace_call

_N_CONSTANTS = 5  # name, n_outputs, n_results, non_differentiable, grads_for


class _Apply(torch.autograd.Function):
    """The runtime: the call below autograd as forward, ``bwd`` as backward."""

    @staticmethod
    def forward(ctx, fwd, bwd, constants: tuple, saved_out: list, *operands):
        with tc.below_autograd():
            flat = tuple(pf_autograd_function(fwd, bwd, *constants, *operands))
        _, n_outputs, n_results, non_differentiable, grads_for = constants
        results, saved = flat[:n_results], flat[n_results:]
        ctx.save_for_backward(*saved)
        ctx.bwd, ctx.n_outputs, ctx.grads_for, ctx.n_operands = bwd, n_outputs, grads_for, len(operands)
        ctx.mark_non_differentiable(*(results[i] for i in non_differentiable))
        saved_out.extend(s.detach() for s in saved)
        return results

    @staticmethod
    def backward(ctx, *grads):
        return (None,) * 4 + operand_grads(ctx, grads)


def operand_grads(ctx: Any, grads: tuple) -> tuple:
    """The user's backward (``ctx.bwd``) on the saved tensors and the outputs' gradients, placed
    at the operand each one is for (``ctx.grads_for``); None for the others."""
    computed = tuple(ctx.bwd(*ctx.saved_tensors, *grads[:ctx.n_outputs]))
    per_operand: list[Any] = [None] * ctx.n_operands
    for position, grad in zip(ctx.grads_for, computed):
        per_operand[position] = grad
    return tuple(per_operand)


class AutogradFunctionHOP(tc.HigherOrderOperator):
    def __init__(self) -> None:
        super().__init__("pf_autograd_function")

    def __call__(self, fwd, bwd, name: str, n_outputs: int, n_results: int,
                 non_differentiable: tuple, grads_for: tuple, *operands):
        constants = (name, n_outputs, n_results, tuple(non_differentiable), tuple(grads_for))
        traced = retrace_call(self, fwd, bwd, constants, list(operands))
        if traced is not None:  # our own trace (re-exporting a program that holds this call)
            return traced
        return super().__call__(fwd, bwd, *constants, *operands)


pf_autograd_function = AutogradFunctionHOP()


@pf_autograd_function.py_impl(tc.HopRules.AUTOGRAD)
def _autograd_rule(fwd, bwd, *rest):
    constants, operands = rest[:_N_CONSTANTS], rest[_N_CONSTANTS:]
    saved: list[torch.Tensor] = []
    results = _Apply.apply(fwd, bwd, tuple(constants), saved, *operands)
    return (*results, *saved)


@pf_autograd_function.py_impl(tc.HopRules.DENSE)
def _dense_rule(fwd, bwd, *rest):
    return tuple(fwd(*rest[_N_CONSTANTS:]))


@pf_autograd_function.py_impl(tc.FakeTensorMode)
def _fake_rule(mode, fwd, bwd, *rest):
    with mode:
        return tuple(fwd(*rest[_N_CONSTANTS:]))


@pf_autograd_function.py_functionalize_impl
def _functional_rule(ctx, fwd, bwd, *rest):
    constants, operands = rest[:_N_CONSTANTS], rest[_N_CONSTANTS:]
    unwrapped = ctx.unwrap_tensors(list(operands))
    with ctx.redispatch_to_next():
        out = pf_autograd_function(ctx.functionalize(fwd), bwd, *constants, *unwrapped)
    return ctx.wrap_tensors(out)


@pf_autograd_function.py_impl(tc.HopRules.proxy_mode_type())
def _proxy_rule(mode, fwd, bwd, *rest):
    """Record one call; both bodies traced again by the tracer in progress."""
    constants, operands = tuple(rest[:_N_CONSTANTS]), list(rest[_N_CONSTANTS:])
    _, n_outputs, n_results, _, _ = constants
    fwd_gm = tc.HopRules.trace_nested(fwd, *operands)
    vals = output_values(fwd_gm)
    saved = [fresh_like(v) for v in vals[n_results:]]
    grads = [fresh_like(v, contiguous=True) for v in vals[:n_outputs]]
    bwd_gm = tc.HopRules.trace_nested(bwd, *saved, *grads)
    results = [fresh_like(v) for v in vals]
    tc.record_hop_call(pf_autograd_function,
                       [("autograd_function_fwd", fwd_gm), ("autograd_function_bwd", bwd_gm)],
                       constants, operands, results, tracer=mode.tracer)
    return tuple(results)
