"""``torch.func`` transforms inside forward (``torch.vmap``, ``torch.func.grad``, ``vjp``,
``jvp``, ``jacrev``, ``jacfwd``, ``hessian``; ``create_block_mask`` and
``associative_scan(combine_mode="generic")`` call ``torch.vmap``), traced below autograd.

functorch runs a transform's levels below the PreDispatch key: a batched op
reaches our functional mode there as a logical op on a BatchedTensor, and the
batching rule then unwraps it and dispatches the plain op again, below
PreDispatch, on a functional tensor that no functional mode sees there (torch:
"Attempting to use FunctionalTensor on its own"). torch.export keeps vmap as
calls that change functorch's global nesting level, which is not functional;
its ``run_decompositions`` traces those calls below autograd, where the
transforms have run. We do the same, for the length of each outermost level
only: the plain ATen ops the transforms issue (batching rules, the backward of
``grad``) are functionalized and recorded by the same tracer, and autograd
records them as it records eager's. Grad-mode changes inside are still recorded
as regions by the pre-dispatch trace around the level.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from ... import _torch_compat as tc
from ...mode_capabilities import TracesBelowAutograd


def _below_autograd_when_pre_dispatch() -> contextlib.AbstractContextManager[Any]:
    if torch.compiler.is_dynamo_compiling():  # dynamo capturing a HOP body traces the transform its own way
        return contextlib.nullcontext()
    mode = tc.active_functional_mode()
    twin = mode.twin_below_autograd() if isinstance(mode, TracesBelowAutograd) else None
    if twin is None:  # not our trace, or already below autograd (a nested level)
        return contextlib.nullcontext()
    return tc.trace_moved_below_autograd(twin)


@contextlib.contextmanager
def func_transforms_traced_below_autograd() -> Iterator[None]:
    with tc.func_transform_levels_wrapped(_below_autograd_when_pre_dispatch):
        yield
