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

from ... import _torch_compat as tc

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
    return aten.index.Tensor(x.reshape(-1), [mask.reshape(-1)])  # flat: a 0-d mask cannot index


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


# --- order statistics, from one sort (NaN sorts last, as these kernels order it) ------------


def _select(x: torch.Tensor, dim: int, position: Any, keepdim: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The element at ``position`` (an int, or a tensor of one per slice) of each slice sorted
    along ``dim``, and its index in the slice."""
    if x.dim() == 0:
        return x.clone(), torch.zeros_like(x, dtype=torch.int64)
    dim = dim % x.dim()
    ordered, order = torch.sort(x, dim)
    if not isinstance(position, torch.Tensor):
        position = torch.full_like(ordered.narrow(dim, 0, 1), position, dtype=torch.int64)
    values, indices = ordered.gather(dim, position), order.gather(dim, position)
    return (values, indices) if keepdim else (values.squeeze(dim), indices.squeeze(dim))


def kthvalue(x: torch.Tensor, k: int, dim: int = -1, keepdim: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    return _select(x, dim, k - 1, keepdim)


def median_dim(x: torch.Tensor, dim: int, keepdim: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The lower median; a slice holding a NaN gives NaN and the index of its first NaN."""
    if x.dim() == 0:
        return x.clone(), torch.zeros_like(x, dtype=torch.int64)
    dim = dim % x.dim()
    values, indices = _select(x, dim, (x.size(dim) - 1) // 2, keepdim=True)
    if x.is_floating_point():
        nan = torch.isnan(x)
        has_nan = nan.any(dim, keepdim=True)
        first_nan = nan.to(torch.uint8).argmax(dim, keepdim=True)
        values = torch.where(has_nan, torch.full_like(values, float("nan")), values)
        indices = torch.where(has_nan, first_nan, indices)
    return (values, indices) if keepdim else (values.squeeze(dim), indices.squeeze(dim))


def median(x: torch.Tensor) -> torch.Tensor:
    return median_dim(x.reshape(-1), 0)[0]


def nanmedian_dim(x: torch.Tensor, dim: int, keepdim: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The lower median of the slice's numbers (NaNs sort last, so it sits at (count - 1) // 2)."""
    if x.dim() == 0:
        return x.clone(), torch.zeros_like(x, dtype=torch.int64)
    dim = dim % x.dim()
    count = (~torch.isnan(x)).sum(dim, keepdim=True) if x.is_floating_point() else \
        torch.full_like(x.narrow(dim, 0, 1), x.size(dim), dtype=torch.int64)
    position = torch.div(count - 1, 2, rounding_mode="floor").clamp(min=0)
    return _select(x, dim, position, keepdim)


def nanmedian(x: torch.Tensor) -> torch.Tensor:
    return nanmedian_dim(x.reshape(-1), 0)[0]


def nonzero_static(x: torch.Tensor, *, size: int, fill_value: int = -1) -> torch.Tensor:
    """``nonzero``'s rows, the first ``size`` of them, padded with ``fill_value``: the flat
    positions sorted with the zeros' pushed past the end keep the order with static shapes."""
    numel = x.numel()
    position = torch.arange(numel, device=x.device)
    flat = x.reshape(-1) != 0
    order = torch.sort(torch.where(flat, position, position + numel)).values
    if size > numel:
        order = torch.cat([order, torch.full((size - numel,), 2 * numel, dtype=torch.int64, device=x.device)])
    chosen = order[:size]
    found = chosen < numel
    coordinates, remaining = [], torch.where(found, chosen, torch.zeros_like(chosen))
    for extent in reversed(x.shape):
        coordinates.append(torch.remainder(remaining, extent))
        remaining = torch.div(remaining, extent, rounding_mode="floor")
    rows = torch.stack(list(reversed(coordinates)), -1) if coordinates else chosen.new_zeros(size, 0)
    return torch.where(found.unsqueeze(-1), rows, torch.full_like(rows, fill_value))


def mode(x: torch.Tensor, dim: int = -1, keepdim: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The most frequent value of each slice, the smallest on a tie, and the last index holding
    it: what the kernel's sort of (value, index) pairs and scan of its runs give. Each element's
    count compares it with every other of its slice (memory: the slice's length squared). A NaN
    counts once, as its own run; where the kernel's sort meets NaNs its order is undefined."""
    if x.dim() == 0:
        return x.clone(), torch.zeros_like(x, dtype=torch.int64)
    dim = dim % x.dim()
    moved = x.movedim(dim, -1)
    length = moved.size(-1)
    same = moved.unsqueeze(-1) == moved.unsqueeze(-2)
    itself = torch.eye(length, dtype=torch.bool, device=x.device)
    counts = (same | itself).sum(-1)
    candidate = counts == counts.amax(-1, keepdim=True)
    numbers = candidate & ~torch.isnan(moved) if x.is_floating_point() else candidate
    largest = (torch.finfo(x.dtype).max if x.is_floating_point() else True if x.dtype == torch.bool
               else torch.iinfo(x.dtype).max)
    value = torch.where(numbers, moved, torch.full_like(moved, largest)).amin(-1, keepdim=True)
    if x.is_floating_point():
        value = torch.where(numbers.any(-1, keepdim=True), value, torch.full_like(value, float("nan")))
        holds = (moved == value) | (torch.isnan(moved) & torch.isnan(value))
    else:
        holds = moved == value
    # eager's value is the slice's own element (a -0.0 stays -0.0): read it back from the last index
    positions = torch.arange(length, device=x.device).expand_as(moved)
    index = torch.where(holds, positions, torch.full_like(positions, -1)).amax(-1, keepdim=True)
    value = moved.gather(-1, index)
    value, index = value.movedim(-1, dim), index.movedim(-1, dim)
    return (value, index) if keepdim else (value.squeeze(dim), index.squeeze(dim))


DECOMPOSITIONS.update({
    aten.mode.default: mode,
    aten.kthvalue.default: kthvalue,
    aten.median.dim: median_dim,
    aten.median.default: median,
    aten.nanmedian.dim: nanmedian_dim,
    aten.nanmedian.default: nanmedian,
    aten.nonzero_static.default: nonzero_static,
})


def _same(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    same = a == b
    return same | (torch.isnan(a) & torch.isnan(b)) if a.is_floating_point() else same


def sort_stable(x: torch.Tensor, *, stable: bool | None = None, dim: int = -1,
                descending: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Core ATen's ``sort`` leaves the order of equal elements open; a stable sort keeps
    them in input order. One ``sort`` groups equal values (NaNs together), a second sorts
    ``group * n + original index`` (distinct integers), which orders each group by index."""
    if x.dim() == 0:
        return x.clone(), torch.zeros_like(x, dtype=torch.int64)
    values, order = aten.sort.default(x, dim, descending)
    if not stable:
        return values, order
    dim = dim % x.dim()
    n = x.size(dim)
    if n <= 1:
        return values, order
    changed = ~_same(values.narrow(dim, 1, n - 1), values.narrow(dim, 0, n - 1))
    group = torch.cat([torch.zeros_like(values.narrow(dim, 0, 1), dtype=torch.int64),
                       torch.cumsum(changed.to(torch.int64), dim)], dim)
    _, within = aten.sort.default(group * n + order, dim, False)
    indices = order.gather(dim, within)
    return x.gather(dim, indices), indices


DECOMPOSITIONS[aten.sort.stable] = sort_stable


# --- unique: sizes read from the data (``.item()``), so never cached ---------------------------


def _uniques(flat: torch.Tensor, ordered: torch.Tensor, order: torch.Tensor | None, return_inverse: bool,
             return_counts: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Runs of equal neighbours in ``ordered`` (NaN equals nothing, so each NaN is its own, as
    eager's): their values, each input element's run (through ``order``, the sort's
    permutation, if any), and the runs' lengths."""
    empty = torch.empty(0, dtype=torch.int64, device=flat.device)
    if flat.numel() == 0:
        return flat.clone(), empty if not return_inverse else torch.zeros_like(flat, dtype=torch.int64), empty
    changed = ordered[1:] != ordered[:-1]
    run = torch.cat([torch.zeros(1, dtype=torch.int64, device=flat.device), torch.cumsum(changed.to(torch.int64), 0)])
    runs = int(run[-1].item()) + 1
    values = torch.empty(runs, dtype=flat.dtype, device=flat.device).scatter(0, run, ordered)
    inverse = empty
    if return_inverse:
        inverse = run if order is None else torch.empty_like(run).scatter(0, order, run)
    counts = torch.zeros(runs, dtype=torch.int64, device=flat.device).scatter_add(0, run, torch.ones_like(run)) \
        if return_counts else empty
    return values, inverse, counts


def unique2(x: torch.Tensor, sorted: bool = True, return_inverse: bool = False,  # noqa: A002 (the schema's name)
            return_counts: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sorted whether or not ``sorted`` asks (eager's CPU kernel sorts either way)."""
    flat = x.reshape(-1)
    ordered, order = aten.sort.default(flat, 0, False)
    values, inverse, counts = _uniques(flat, ordered, order, return_inverse, return_counts)
    return values, inverse.reshape(x.shape) if return_inverse else inverse, counts


def unique(x: torch.Tensor, sorted: bool = True, return_inverse: bool = False  # noqa: A002
           ) -> tuple[torch.Tensor, torch.Tensor]:
    values, inverse, _ = unique2(x, sorted, return_inverse, False)
    return values, inverse


def unique_consecutive(x: torch.Tensor, return_inverse: bool = False, return_counts: bool = False,
                       dim: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if dim is not None:
        return NotImplemented
    flat = x.reshape(-1)
    values, inverse, counts = _uniques(flat, flat, None, return_inverse, return_counts)
    return values, inverse.reshape(x.shape) if return_inverse else inverse, counts


for _reader in (equal, unique2, unique, unique_consecutive):
    _reader.reads_data = True  # type: ignore[attr-defined]

DECOMPOSITIONS.update({
    tc.resolve_overload("aten", "_unique2.default"): unique2,
    tc.resolve_overload("aten", "_unique.default"): unique,
    aten.unique_consecutive.default: unique_consecutive,
})
