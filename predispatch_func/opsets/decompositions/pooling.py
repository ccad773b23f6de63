"""Max pooling forwards that return indices: adaptive and fractional.

Both visit a window of the input plane per output element and keep the kernel's
choice: the window's elements in row-major order, the first maximum kept
(``val > max``) unless a NaN comes (every NaN replaces, so the last NaN wins),
starting from -inf at the window's first element. That loop runs here over
window offsets, each a whole-tensor step, so equal values and NaNs pick the
index the kernel picks. Windows: adaptive pooling's ``[floor(o*in/out),
ceil((o+1)*in/out))``; fractional pooling's starts from its ``random_samples``
(the kernel's ``generate_intervals``, in the input's dtype).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

aten = torch.ops.aten


def _lowest(dtype: torch.dtype) -> float:
    return -math.inf if dtype.is_floating_point else torch.iinfo(dtype).min


def _window_max(x: torch.Tensor, spatial: int, starts: Sequence[torch.Tensor], longest: Sequence[int],
                ends: Sequence[torch.Tensor] | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Max and flat index over windows. ``starts[d]`` has shape ``(*planes or 1s, out_d)``;
    offsets ``k < longest[d]`` past ``ends[d]`` (when given) are outside the window."""
    plane = x.shape[x.dim() - spatial:]
    planes = x.shape[:x.dim() - spatial]
    out_shape = [s.size(-1) for s in starts]
    flat = x.reshape(*planes, -1)
    strides = [math.prod(plane[d + 1:]) for d in range(spatial)]

    def along(d: int, t: torch.Tensor) -> torch.Tensor:  # (..., out_d) -> broadcastable to (..., *out)
        shape = list(t.shape[:-1]) + [1] * spatial
        shape[len(t.shape) - 1 + d] = t.size(-1)
        return t.reshape(shape)

    def flat_index(offsets: Sequence[int]) -> torch.Tensor:
        index = along(0, starts[0] + offsets[0]) * strides[0]
        for d in range(1, spatial):
            index = index + along(d, starts[d] + offsets[d]) * strides[d]
        return index.expand(full)

    full = (*planes, *out_shape)
    best_index = flat_index([0] * spatial).clone()
    best = torch.full(full, _lowest(x.dtype), dtype=x.dtype, device=x.device)
    for offsets in itertools.product(*(range(n) for n in longest)):
        index = flat_index(offsets)
        value = flat.gather(-1, index.reshape(*planes, -1).clamp(0, flat.size(-1) - 1)).reshape(full)
        take = value > best
        if x.is_floating_point():
            take = take | torch.isnan(value)
        if ends is not None:
            for d in range(spatial):
                take = take & along(d, starts[d] + offsets[d] < ends[d])
        best = torch.where(take, value, best)
        best_index = torch.where(take, index, best_index)
    return best, best_index


def _adaptive_max_pool(spatial: int) -> Callable:
    def decomposition(x: torch.Tensor, output_size: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        starts, ends, longest = [], [], []
        for d, out in enumerate(output_size):
            size = x.size(x.dim() - spatial + d)
            o = torch.arange(out, device=x.device)
            starts.append(torch.div(o * size, out, rounding_mode="floor"))
            ends.append(torch.div((o + 1) * size + out - 1, out, rounding_mode="floor"))
            longest.append(max(-(-(i + 1) * size // out) - (i * size // out) for i in range(out)) if out else 0)
        return _window_max(x, spatial, starts, longest, ends)
    return decomposition


def _fractional_max_pool(spatial: int, sample_for_dim: Sequence[int]) -> Callable:
    def decomposition(x: torch.Tensor, kernel_size: Sequence[int], output_size: Sequence[int],
                      random_samples: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        planes = x.shape[:x.dim() - spatial]
        samples = random_samples.reshape(*planes, spatial).to(x.dtype)
        starts = []
        for d in range(spatial):
            size, out, pool = x.size(x.dim() - spatial + d), output_size[d], kernel_size[d]
            sample = samples[..., sample_for_dim[d]].unsqueeze(-1)
            last = torch.full((*planes, 1), size - pool, dtype=torch.int64, device=x.device)
            if out > 1:
                alpha = (size - pool) / (out - 1)
                i = torch.arange(out - 1, dtype=x.dtype, device=x.device)
                inner = torch.trunc((i + sample) * alpha).to(torch.int64) - torch.trunc(sample * alpha).to(torch.int64)
                starts.append(torch.cat([inner, last], -1))
            else:
                starts.append(last[..., :out])
        return _window_max(x, spatial, starts, list(kernel_size), None)
    return decomposition


DECOMPOSITIONS: dict[Any, Callable] = {
    aten.adaptive_max_pool2d.default: _adaptive_max_pool(2),
    aten.fractional_max_pool2d.default: _fractional_max_pool(2, (1, 0)),  # samples are (w, h)
    aten.fractional_max_pool3d.default: _fractional_max_pool(3, (0, 1, 2)),  # samples are (t, h, w)
}

# for torch releases that lack a decomposition of their own (2.11 has none for the 3-d one)
FALLBACK: dict[Any, Callable] = {aten.adaptive_max_pool3d.default: _adaptive_max_pool(3)}
