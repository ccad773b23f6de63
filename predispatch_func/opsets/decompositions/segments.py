"""``segment_reduce`` and its backward: reductions over consecutive runs of an axis.

The runs are given by ``lengths`` (or ``offsets``, their running sums); each
element's run is the number of run ends at or before it. Each run reduces
through a mask (run by element), so empty runs give the reduction's identity:
``-inf``/``inf`` for max/min, 0 for sum, 1 for prod, NaN for mean. An
``initial`` value joins every run as the kernel joins it: into max, min, sum
and prod, and into mean's numerator only (``(sum + initial) / length``; an
empty run gives ``initial``). The backward is the kernel's: sum and mean spread
the gradient (mean over the run's length); max and min share it among the
elements equal to the result; prod takes ``output / x``, or, in a run with one
zero, the product of the rest at the zero.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ... import _torch_compat as tc

aten = torch.ops.aten


def _runs(lengths: Any, offsets: Any, size: int, axis: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """(each element's run, the run-by-element mask, each run's length), or None for batched runs."""
    if lengths is None:
        if offsets is None or offsets.dim() != 1:
            return None
        lengths = offsets[1:] - offsets[:-1]
    if lengths.dim() != 1:
        return None
    ends = torch.cumsum(lengths, 0)
    position = torch.arange(size, device=lengths.device)
    run = (position.unsqueeze(-1) >= ends.unsqueeze(0)).sum(-1)
    mask = run.unsqueeze(0) == torch.arange(lengths.size(0), device=lengths.device).unsqueeze(-1)
    return run, mask, lengths


def _broadcast_mask(mask: torch.Tensor, rest: int) -> torch.Tensor:
    """(runs, size) -> (runs, size, 1, ...) against the data moved to (size, ...)."""
    return mask.reshape(*mask.shape, *([1] * rest))


def segment_reduce(data: torch.Tensor, reduce: str, *, lengths: Any = None, indices: Any = None, offsets: Any = None,
                   axis: int = 0, unsafe: bool = False, initial: Any = None) -> Any:
    axis = axis % data.dim()
    found = _runs(lengths, offsets, data.size(axis), axis)
    if found is None or indices is not None:
        return NotImplemented
    _, mask, length = found
    moved = data.movedim(axis, 0)
    picked = _broadcast_mask(mask, moved.dim() - 1)
    shape = (length.size(0), *moved.shape[1:])
    run_length = length.reshape(-1, *([1] * (moved.dim() - 1))).to(data.dtype)
    if reduce in ("max", "min"):
        identity = float("-inf") if reduce == "max" else float("inf")
        values = torch.where(picked, moved.unsqueeze(0), torch.full_like(moved, identity).unsqueeze(0))
        if moved.size(0) == 0:  # no elements at all: every run empty
            out = torch.full(shape, identity, dtype=data.dtype, device=data.device)
        else:
            out = values.amax(1) if reduce == "max" else values.amin(1)
        if initial is not None:
            start = torch.full(shape, initial, dtype=data.dtype, device=data.device)
            out = torch.where((start > out) if reduce == "max" else (start < out), start, out)
    elif reduce in ("sum", "mean"):
        out = torch.where(picked, moved.unsqueeze(0), torch.zeros_like(moved).unsqueeze(0)).sum(1)
        if initial is not None:
            out = out + initial
        if reduce == "mean":
            mean = out / run_length
            out = mean if initial is None else torch.where(run_length == 0, torch.full_like(out, initial), mean)
    elif reduce == "prod":
        out = torch.where(picked, moved.unsqueeze(0), torch.ones_like(moved).unsqueeze(0)).prod(1)
        if initial is not None:
            out = out * initial
    else:
        return NotImplemented
    return out.movedim(0, axis)


def segment_reduce_backward(grad: torch.Tensor, output: torch.Tensor, data: torch.Tensor, reduce: str, *,
                            lengths: Any = None, offsets: Any = None, axis: int = 0, initial: Any = None) -> Any:
    axis = axis % data.dim()
    found = _runs(lengths, offsets, data.size(axis), axis)
    if found is None:
        return NotImplemented
    run, mask, length = found
    moved, grad, output = data.movedim(axis, 0), grad.movedim(axis, 0), output.movedim(axis, 0)
    picked = _broadcast_mask(mask, moved.dim() - 1)
    safe_run = torch.clamp(run, max=max(length.size(0) - 1, 0))
    per_element = grad.index_select(0, safe_run)
    if reduce == "sum":
        result = per_element
    elif reduce == "mean":
        result = per_element / length.index_select(0, safe_run).reshape(-1, *([1] * (moved.dim() - 1))).to(grad.dtype)
    elif reduce in ("max", "min"):
        equal = moved == output.index_select(0, safe_run)
        count = torch.where(picked, equal.unsqueeze(0), torch.zeros_like(equal).unsqueeze(0)).sum(1)
        # the kernel writes the gradient to every equal element, then divides by their count only
        # where what it wrote is positive (it finds them by testing > 0): a negative one is not shared
        shared = torch.where(per_element > 0, per_element / count.index_select(0, safe_run).to(grad.dtype), per_element)
        result = torch.where(equal, shared, torch.zeros_like(per_element))
    elif reduce == "prod":
        zero = moved == 0
        zeros = torch.where(picked, zero.unsqueeze(0), torch.zeros_like(zero).unsqueeze(0)).sum(1)
        others = torch.where(picked & ~zero.unsqueeze(0), moved.unsqueeze(0), torch.ones_like(moved).unsqueeze(0)).prod(1)
        if initial is not None:
            others = others * initial
        zeros_here = zeros.index_select(0, safe_run)
        no_zero = per_element * output.index_select(0, safe_run) / torch.where(zero, torch.ones_like(moved), moved)
        one_zero = torch.where(zero, per_element * others.index_select(0, safe_run), torch.zeros_like(per_element))
        result = torch.where(zeros_here == 0, no_zero, torch.where(zeros_here == 1, one_zero, torch.zeros_like(no_zero)))
    else:
        return NotImplemented
    inside = (run < length.size(0)).reshape(-1, *([1] * (moved.dim() - 1)))  # past the last run: no gradient
    return torch.where(inside, result, torch.zeros_like(result)).movedim(0, axis)


DECOMPOSITIONS: dict[Any, Callable] = {
    aten.segment_reduce.default: segment_reduce,
    tc.resolve_overload("aten", "_segment_reduce_backward.default"): segment_reduce_backward,
}
