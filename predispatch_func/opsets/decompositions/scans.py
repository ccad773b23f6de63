"""Cumulative ops as log-step scans (Hillis and Steele): ceil(log2(n)) whole-tensor steps.

At step ``s`` every position combines its running value with the one ``s``
places before it (positions before ``s`` combine with the operation's
identity), so after the steps each position holds the combination of its whole
prefix. The number of steps depends only on the size of the scanned dim, so a
trace holds for every value. The combination order differs from the kernel's
left-to-right loop: exact for integers and for max/min, within rounding for
floating sums and products.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

aten = torch.ops.aten


def _shifted(x: torch.Tensor, dim: int, step: int, fill: torch.Tensor) -> torch.Tensor:
    """``x`` moved ``step`` places along ``dim``, the first ``step`` places taken from ``fill``."""
    n = x.size(dim)
    return torch.cat([fill.narrow(dim, 0, step), x.narrow(dim, 0, n - step)], dim)


def _steps(n: int) -> list[int]:
    steps, step = [], 1
    while step < n:
        steps.append(step)
        step *= 2
    return steps


def cumprod(x: torch.Tensor, dim: int, dtype: Any = None) -> torch.Tensor:
    if dtype is not None:
        x = x.to(dtype)
    elif not (x.is_floating_point() or x.is_complex()):
        x = x.to(torch.int64)  # integral and bool inputs accumulate in int64, as eager
    if x.dim() == 0:
        return x.clone()
    dim = dim % x.dim()
    ones = torch.ones_like(x)
    for step in _steps(x.size(dim)):
        x = x * _shifted(x, dim, step, ones)
    return x


def logcumsumexp(x: torch.Tensor, dim: int) -> torch.Tensor:
    if x.is_complex():
        return NotImplemented
    if x.dim() == 0:
        return x.clone()
    dim = dim % x.dim()
    empty = torch.full_like(x, -math.inf)
    for step in _steps(x.size(dim)):
        x = torch.logaddexp(x, _shifted(x, dim, step, empty))
    return x


def _cumulative_extreme(later_wins: Callable) -> Callable:
    def decomposition(x: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Values and the index each came from: the kernel keeps the later element on a tie
        and a NaN over any number (a later NaN over an earlier one), an order that is
        associative, so the scan combines (value, index) pairs to the kernel's answer."""
        if x.dim() == 0:
            return x.clone(), torch.zeros_like(x, dtype=torch.int64)
        dim = dim % x.dim()
        shape = [1] * x.dim()
        shape[dim] = x.size(dim)
        values = x.clone()
        indices = torch.arange(x.size(dim), device=x.device).view(shape).expand(x.shape).contiguous()
        for step in _steps(x.size(dim)):
            earlier_values = _shifted(values, dim, step, values)
            earlier_indices = _shifted(indices, dim, step, indices)
            keep = later_wins(earlier_values, values)
            values = torch.where(keep, values, earlier_values)
            indices = torch.where(keep, indices, earlier_indices)
        return values, indices
    return decomposition


def _later_is_max(earlier: torch.Tensor, later: torch.Tensor) -> torch.Tensor:
    if not earlier.is_floating_point():
        return later >= earlier
    return torch.isnan(later) | (~torch.isnan(earlier) & (later >= earlier))


def _later_is_min(earlier: torch.Tensor, later: torch.Tensor) -> torch.Tensor:
    if not earlier.is_floating_point():
        return later <= earlier
    return torch.isnan(later) | (~torch.isnan(earlier) & (later <= earlier))


DECOMPOSITIONS: dict[Any, Callable] = {
    aten.cumprod.default: cumprod,
    # the public op, which export meets above autograd (its eager kernel calls ``_logcumsumexp``,
    # which pf.eager met below it while only that one had this decomposition)
    aten.logcumsumexp.default: logcumsumexp,
    aten.cummax.default: _cumulative_extreme(_later_is_max),
    aten.cummin.default: _cumulative_extreme(_later_is_min),
}
