"""``histc``: counts in equal-width bins, with the kernel's bin edges.

The CPU kernel finds each element's bin by interpolation and then corrects it
against the edges ``linspace(min, max, bins + 1)`` it computed, so an element
sits in bin ``i`` exactly when ``edges[i] <= x < edges[i + 1]`` (the last bin
also takes ``x == max``). Here the same edges, built with ``linspace``'s own
formula (from the start for the first half, from the end for the second), and
the bin as the number of inner edges at or below the element: the rounding of
an element near an edge is the kernel's. Elements outside ``[min, max]`` and
NaN are not counted. ``min == max`` takes the data's range, widened by one
each side if that is a single value, as the kernel (which raises where it is
not finite; this cannot, and counts nothing there).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

aten = torch.ops.aten


def _linspace(start: torch.Tensor, end: torch.Tensor, steps: int) -> torch.Tensor:
    """``linspace`` from tensor ends, rounded as its CPU kernel: ``start + i * step`` for the
    first half, ``end - (steps - 1 - i) * step`` for the rest."""
    step = (end - start) / (steps - 1)
    index = torch.arange(steps, device=start.device).to(start.dtype)
    return torch.where(torch.arange(steps, device=start.device) < steps // 2, start + index * step,
                       end - (steps - 1 - index) * step)


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
    edges = _linspace(low, high, bins + 1)
    inside = (flat >= low) & (flat <= high)
    position = (flat.unsqueeze(-1) >= edges[1:bins].unsqueeze(0)).sum(-1)
    counts = torch.zeros(bins, dtype=x.dtype, device=x.device)
    return counts.scatter_add(0, torch.where(inside, position, torch.zeros_like(position)), inside.to(x.dtype))


DECOMPOSITIONS: dict[Any, Callable] = {aten.histc.default: histc}
