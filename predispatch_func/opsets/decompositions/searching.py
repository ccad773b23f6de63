"""Comparisons and searches: ``equal``, whole-tensor max/min, ``masked_select``,
``searchsorted``/``bucketize`` and ``scatter`` with a reduction.

``searchsorted`` runs the kernel's own binary search as whole-tensor steps
(ceil(log2(n + 1)) of them, a number fixed by the sizes), so where the kernel's
answer depends on its algorithm (NaNs in the sorted sequence, ties) ours is the
same. ``equal`` returns a Python bool and ``masked_select`` a tensor whose size
depends on the data: both read data, so their traces are never cached.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

aten = torch.ops.aten


def equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape:
        return False
    if a.numel() == 0:
        return True
    return bool(torch.eq(a, b).all().item())


def _whole(reduce: Callable) -> Callable:
    def decomposition(x: torch.Tensor) -> torch.Tensor:
        if x.numel() == 0:
            return NotImplemented  # the kernel's error, from the kernel
        return reduce(x, list(range(x.dim())))
    return decomposition


def masked_select(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    x, mask = torch.broadcast_tensors(x, mask)
    return aten.index.Tensor(x, [mask])


def _binary_search(sorted_sequence: torch.Tensor, values: torch.Tensor, right: bool,
                   sorter: torch.Tensor | None) -> torch.Tensor:
    """The kernel's loop, on all values at once: ``[start, end)`` halves until empty; the
    middle element moves ``start`` past it unless it is ``>= value`` (``> value`` for the
    right side), a test that is false for NaN, so NaNs sort last as in the kernel."""
    n = sorted_sequence.size(-1)
    if sorted_sequence.dim() == 1:
        sequence = sorted_sequence.unsqueeze(0)
        sorter = sorter.unsqueeze(0) if sorter is not None else None
        flat_values = values.reshape(1, -1)
    else:
        sequence, flat_values = sorted_sequence, values
    start = torch.zeros_like(flat_values, dtype=torch.int64)
    end = torch.full_like(flat_values, n, dtype=torch.int64)
    batch = sequence.shape[:-1]
    for _ in range(max(n, 1).bit_length()):
        live = start < end
        middle = start + torch.div(end - start, 2, rounding_mode="floor")
        at = middle.clamp(max=max(n - 1, 0))
        if sorter is not None:
            at = sorter.expand(*batch, n).gather(-1, at)
        middle_value = sequence.expand(*batch, n).gather(-1, at) if n else torch.zeros_like(flat_values)
        past = ~(middle_value > flat_values) if right else ~(middle_value >= flat_values)
        start = torch.where(live & past, middle + 1, start)
        end = torch.where(live & ~past, middle, end)
    return start.reshape(values.shape)


def searchsorted(sorted_sequence: torch.Tensor, values: torch.Tensor, *, out_int32: bool = False,
                 right: bool = False, side: str | None = None, sorter: torch.Tensor | None = None) -> torch.Tensor:
    right = right or side == "right"
    dtype = torch.result_type(sorted_sequence, values)
    found = _binary_search(sorted_sequence.to(dtype), values.to(dtype), right, sorter)
    return found.to(torch.int32) if out_int32 else found


def bucketize(values: torch.Tensor, boundaries: torch.Tensor, *, out_int32: bool = False,
              right: bool = False) -> torch.Tensor:
    return searchsorted(boundaries, values, out_int32=out_int32, right=right)


_REDUCTIONS = {"add": "sum", "multiply": "prod"}


def scatter_reduce_legacy(x: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor, *,
                          reduce: str) -> torch.Tensor:
    """``scatter(..., reduce="add"|"multiply")``: the reduction into ``x`` itself."""
    return aten.scatter_reduce.two(x, dim, index, src, _REDUCTIONS[reduce], include_self=True)


def scatter_value_reduce_legacy(x: torch.Tensor, dim: int, index: torch.Tensor, value: Any, *,
                                reduce: str) -> torch.Tensor:
    src = torch.full(index.shape, value, dtype=x.dtype, device=x.device)
    return aten.scatter_reduce.two(x, dim, index, src, _REDUCTIONS[reduce], include_self=True)


DECOMPOSITIONS: dict[Any, Callable] = {
    aten.equal.default: equal,
    aten.max.default: _whole(torch.amax),
    aten.min.default: _whole(torch.amin),
    aten.masked_select.default: masked_select,
    aten.searchsorted.Tensor: searchsorted,
    aten.bucketize.Tensor: bucketize,
    aten.scatter.reduce: scatter_reduce_legacy,
    aten.scatter.value_reduce: scatter_value_reduce_legacy,
}
