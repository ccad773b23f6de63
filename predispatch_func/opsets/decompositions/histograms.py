"""``histc``, ``histogram`` and ``histogramdd``: counts in bins, with the kernels' bin edges.

The CPU kernel finds each element's bin by interpolation and then corrects it
against the edges ``linspace(min, max, bins + 1)`` it computed, so an element
sits in bin ``i`` exactly when ``edges[i] <= x < edges[i + 1]`` (the last bin
also takes ``x == max``). Here the same edges, built with ``linspace``'s own
formula (from the start for the first half, from the end for the second), and
the bin as the number of inner edges at or below the element: the rounding of
an element near an edge is the kernel's. Elements outside ``[min, max]`` and
NaN are not counted. ``min == max`` takes the data's range, widened by one
each side if that is a single value, as the kernel (which raises where it is
not finite; this cannot, and counts nothing there). ``histogram`` bins the same
way, by its own edges where it is given them, widens a single value by a half
each side, weighs, and divides by the total and the bin widths for ``density``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ... import _torch_compat as tc

aten = torch.ops.aten


def _fused_multiply_add(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """``a * b + c`` rounded once, as the vectorized kernels' fused multiply-add: narrower dtypes
    exactly through float64; float64 by Dekker's exact product (Veltkamp's split) and Knuth's
    exact sum, the two error terms added last."""
    if a.dtype != torch.float64:
        return (a.to(torch.float64) * b.to(torch.float64) + c.to(torch.float64)).to(a.dtype)

    def halves(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scaled = 134217729.0 * x  # 2^27 + 1
        high = scaled - (scaled - x)
        return high, x - high

    product = a * b
    (a_high, a_low), (b_high, b_low) = halves(a), halves(b)
    product_error = ((a_high * b_high - product) + a_high * b_low + a_low * b_high) + a_low * b_low
    total = product + c
    virtual = total - product
    sum_error = (product - (total - virtual)) + (c - virtual)
    return total + (sum_error + product_error)


def _linspace(start: torch.Tensor, end: torch.Tensor, steps: int) -> torch.Tensor:
    """``linspace`` from tensor ends, rounded as its vectorized CPU kernel: ``start + i * step``
    for the first half, ``end - (steps - 1 - i) * step`` for the rest, each a fused multiply-add
    (bit for bit: tests/opsets/test_decompositions.py compares some thousands)."""
    step = (end - start) / (steps - 1)
    index = torch.arange(steps, device=start.device).to(start.dtype)
    first_half = torch.arange(steps, device=start.device) < steps // 2
    steps_tensor = step.expand(steps)
    return torch.where(first_half, _fused_multiply_add(steps_tensor, index, start.expand(steps)),
                       _fused_multiply_add(steps_tensor, -(steps - 1 - index), end.expand(steps)))


def histc(x: torch.Tensor, bins: int = 100, min: Any = 0, max: Any = 0) -> Any:  # noqa: A002 (schema names)
    """Integer input, which CUDA's kernel takes (transformers' mixtral gives it on every device but
    the CPU): counted in float64, the counts in the input's dtype; the CPU kernel refuses it, and so
    does this on the CPU (declining, so eager's own error is raised)."""
    if not x.is_floating_point():
        if x.device.type == "cpu":
            return NotImplemented
        return histc(x.to(torch.float64), bins, min, max).to(x.dtype)
    flat = x.reshape(-1)
    low = torch.full((), min, dtype=x.dtype, device=x.device)
    high = torch.full((), max, dtype=x.dtype, device=x.device)
    if min == max and flat.numel():
        low, high = flat.min(), flat.max()
    if min == max:
        same = low == high
        low, high = torch.where(same, low - 1, low), torch.where(same, high + 1, high)
    return _counts(flat, _linspace(low, high, bins + 1), None)


def _counts(flat: torch.Tensor, edges: torch.Tensor, weight: Any) -> torch.Tensor:
    """Per bin, the (weighted) count of elements with ``edges[i] <= x < edges[i + 1]``, the last
    bin closed on the right; outside the edges and NaN: not counted."""
    bins = edges.size(0) - 1
    inside = (flat >= edges[0]) & (flat <= edges[-1])
    position = (flat.unsqueeze(-1) >= edges[1:bins].unsqueeze(0)).sum(-1)
    amount = inside.to(flat.dtype) if weight is None else torch.where(inside, weight.reshape(-1).to(flat.dtype),
                                                                       torch.zeros_like(flat))
    counts = torch.zeros(bins, dtype=flat.dtype, device=flat.device)
    return counts.scatter_add(0, torch.where(inside, position, torch.zeros_like(position)), amount)


def _density(counts: torch.Tensor, edges: torch.Tensor, density: bool) -> torch.Tensor:
    return counts / (counts.sum() * (edges[1:] - edges[:-1])) if density else counts


def histogram_bin_count(x: torch.Tensor, bins: int = 100, *, range: Any = None,  # noqa: A002 (schema names)
                        weight: Any = None, density: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``bins`` equal bins over ``range``, else over the data's range (``[0, 1]`` for no data)."""
    flat = x.reshape(-1)
    if range is not None:
        low = torch.full((), range[0], dtype=x.dtype, device=x.device)
        high = torch.full((), range[1], dtype=x.dtype, device=x.device)
    elif flat.numel():
        low, high = flat.min(), flat.max()
    else:
        low, high = torch.zeros((), dtype=x.dtype, device=x.device), torch.ones((), dtype=x.dtype, device=x.device)
    same = low == high
    low, high = torch.where(same, low - 0.5, low), torch.where(same, high + 0.5, high)
    edges = _linspace(low, high, bins + 1)
    return _density(_counts(flat, edges, weight), edges, density), edges


def histogram_bin_edges(x: torch.Tensor, bins: torch.Tensor, *, weight: Any = None,
                        density: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    edges = bins.to(x.dtype)
    return _density(_counts(x.reshape(-1), edges, weight), edges, density), edges.clone()


def _range_edges(x: torch.Tensor, dimension: int, bins: int, value_range: Any) -> torch.Tensor:
    """One dimension's equal bins over ``value_range[2d:2d+2]`` or the data's range, a single
    value widened by a half each side, no data as ``[0, 1]``."""
    column = x[..., dimension].reshape(-1)
    if value_range is not None:
        low = torch.full((), value_range[2 * dimension], dtype=x.dtype, device=x.device)
        high = torch.full((), value_range[2 * dimension + 1], dtype=x.dtype, device=x.device)
    elif column.numel():
        low, high = column.min(), column.max()
    else:
        low, high = torch.zeros((), dtype=x.dtype, device=x.device), torch.ones((), dtype=x.dtype, device=x.device)
    same = low == high
    return _linspace(torch.where(same, low - 0.5, low), torch.where(same, high + 0.5, high), bins + 1)


def histogramdd_bin_edges(x: torch.Tensor, bins: Any, *, range: Any = None, weight: Any = None,  # noqa: A002
                          density: bool = False) -> list[torch.Tensor]:
    return [_range_edges(x, d, count, range) for d, count in enumerate(bins)]


def histogramdd_from_bin_tensors(x: torch.Tensor, bins: Any, *, weight: Any = None,
                                 density: bool = False) -> torch.Tensor:
    """Each point's bin in every dimension as in ``histogram``; a point outside any dimension's
    edges (or NaN there) is not counted; ``density`` divides by the total and each bin's volume."""
    points = x.reshape(-1, x.size(-1))
    edges = [b.to(x.dtype) for b in bins]
    inside = torch.ones(points.size(0), dtype=torch.bool, device=x.device)
    flat_index = torch.zeros(points.size(0), dtype=torch.int64, device=x.device)
    for d, edge in enumerate(edges):
        column, count = points[:, d], edge.size(0) - 1
        inside = inside & (column >= edge[0]) & (column <= edge[-1])
        position = (column.unsqueeze(-1) >= edge[1:count].unsqueeze(0)).sum(-1)
        flat_index = flat_index * count + position
    sizes = [edge.size(0) - 1 for edge in edges]
    amount = inside.to(x.dtype) if weight is None else torch.where(inside, weight.reshape(-1).to(x.dtype),
                                                                    torch.zeros_like(inside, dtype=x.dtype))
    total = 1
    for size in sizes:
        total *= size
    counts = torch.zeros(total, dtype=x.dtype, device=x.device).scatter_add(
        0, torch.where(inside, flat_index, torch.zeros_like(flat_index)), amount).reshape(sizes)
    if not density:
        return counts
    volume = torch.ones((), dtype=x.dtype, device=x.device)
    for d, edge in enumerate(edges):
        width = edge[1:] - edge[:-1]
        volume = volume.unsqueeze(-1) * width.reshape(*([1] * d), -1) if d else width
    return counts / (counts.sum() * volume)


def histogramdd_from_bin_counts(x: torch.Tensor, bins: Any, *, range: Any = None, weight: Any = None,  # noqa: A002
                                density: bool = False) -> torch.Tensor:
    return histogramdd_from_bin_tensors(x, histogramdd_bin_edges(x, bins, range=range), weight=weight,
                                        density=density)


DECOMPOSITIONS: dict[Any, Callable] = {
    tc.resolve_overload("aten", "_histogramdd_bin_edges.default"): histogramdd_bin_edges,
    tc.resolve_overload("aten", "_histogramdd_from_bin_cts.default"): histogramdd_from_bin_counts,
    tc.resolve_overload("aten", "_histogramdd_from_bin_tensors.default"): histogramdd_from_bin_tensors,
    aten.histc.default: histc,
    aten.histogram.bin_ct: histogram_bin_count,
    aten.histogram.bins_tensor: histogram_bin_edges,
}
