"""The ``pf_autograd_function`` HOP: a custom ``torch.autograd.Function`` in the IR.

One call holds the user's forward and backward as two functional subgraphs::

    results = pf_autograd_function(fwd, bwd, "ScaleGrad", n_outputs, n_results,
                                   non_differentiable, grads_for, *operands)
    # fwd(*operands)                  -> (*results, *saved)
    # bwd(*saved, *grads_of_outputs)  -> one gradient per operand listed in grads_for

``results`` are the Function's tensor outputs, then the operands its forward
wrote without ``mark_dirty`` (new values; the caller's graph writes them back).
``n_outputs`` counts the first group, which alone takes part in the backward;
``n_results`` counts both groups.
``non_differentiable`` lists results that never require grad (``ctx.mark_non_differentiable``
and the written-operand group). ``grads_for`` lists the operands the backward
returns a gradient for (the others get ``None``).

Calling it runs an autograd.Function whose backward is ``bwd``, so
``ep.module()`` trains with the user's gradient. Re-exporting that module
traces this Function like any user Function (``function_trace.py``), giving
the same call again.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import _torch_compat as tc


class _Apply(torch.autograd.Function):
    """The runtime: ``fwd`` as forward (autograd runs it with grad off), ``bwd`` as backward."""

    @staticmethod
    def forward(ctx, fwd, bwd, n_outputs: int, n_results: int, non_differentiable: tuple,
                grads_for: tuple, *operands):
        flat = tuple(fwd(*operands))
        results, saved = flat[:n_results], flat[n_results:]
        ctx.save_for_backward(*saved)
        ctx.bwd, ctx.n_outputs, ctx.grads_for, ctx.n_operands = bwd, n_outputs, grads_for, len(operands)
        ctx.mark_non_differentiable(*(results[i] for i in non_differentiable))
        return results

    @staticmethod
    def backward(ctx, *grads):
        computed = tuple(ctx.bwd(*ctx.saved_tensors, *grads[:ctx.n_outputs]))
        per_operand: list[Any] = [None] * ctx.n_operands
        for position, grad in zip(ctx.grads_for, computed):
            per_operand[position] = grad
        return (None,) * 6 + tuple(per_operand)


class AutogradFunctionHOP(tc.HigherOrderOperator):
    def __init__(self) -> None:
        super().__init__("pf_autograd_function")

    def __call__(self, fwd, bwd, name: str, n_outputs: int, n_results: int,
                 non_differentiable: tuple, grads_for: tuple, *operands):
        return _Apply.apply(fwd, bwd, n_outputs, n_results, tuple(non_differentiable),
                            tuple(grads_for), *operands)


pf_autograd_function = AutogradFunctionHOP()
