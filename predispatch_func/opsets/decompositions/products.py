"""Sums of products: ``_trilinear`` (``bilinear``'s kernel) and the discrete Fourier transform.

``_fft_c2c`` is the DFT by its definition, one matrix product per transformed
dim with the matrix ``exp(∓2πi·jk/n)`` (``jk`` reduced modulo ``n`` in
integers first, so the angles are exact); it costs O(n²) where an FFT costs
O(n log n), and its rounding grows with n like a plain sum, where eager's FFT
grows with log n: equal within float tolerance on sizes of the OpInfos' order,
a backend that meets large transforms wants ``_fft_c2c`` itself.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ... import _torch_compat as tc

aten = torch.ops.aten


def trilinear(i1: torch.Tensor, i2: torch.Tensor, i3: torch.Tensor, expand1: Sequence[int],
              expand2: Sequence[int], expand3: Sequence[int], sumdim: Sequence[int],
              unroll_dim: int = 1) -> torch.Tensor:
    """Each input gets size-1 dims at its ``expand`` positions; their product is summed over
    ``sumdim``."""
    def expanded(t: torch.Tensor, dims: Sequence[int]) -> torch.Tensor:
        for d in sorted(dims):
            t = t.unsqueeze(d)
        return t

    product = expanded(i1, expand1) * expanded(i2, expand2) * expanded(i3, expand3)
    return product.sum(list(sumdim)) if sumdim else product


_NORMALIZE_NONE, _NORMALIZE_BY_ROOT_N, _NORMALIZE_BY_N = 0, 1, 2


def _dft_matrix(n: int, forward: bool, dtype: torch.dtype, device: Any) -> torch.Tensor:
    k = torch.arange(n, device=device)
    turns = torch.remainder(k.unsqueeze(-1) * k, n).to(torch.float64) * (2 * math.pi / n)
    real_dtype = torch.float64 if dtype == torch.complex128 else torch.float32
    sign = -1.0 if forward else 1.0
    return (torch.cos(turns).to(real_dtype) + torch.sin(turns).to(real_dtype) * (sign * 1j)).to(dtype)


def fft_c2c(x: torch.Tensor, dim: Sequence[int], normalization: int, forward: bool) -> torch.Tensor:
    out = x
    count = 1
    for d in dim:
        n = x.size(d)
        count *= n
        if n == 0:
            continue
        out = (out.movedim(d, -1) @ _dft_matrix(n, forward, x.dtype, x.device)).movedim(-1, d)
    if normalization == _NORMALIZE_BY_ROOT_N:
        out = out * (1 / math.sqrt(count))
    elif normalization == _NORMALIZE_BY_N:
        out = out * (1 / count)
    return out.contiguous() if out is not x else out.clone()


DECOMPOSITIONS: dict[Any, Callable] = {
    tc.resolve_overload("aten", "_trilinear.default"): trilinear,
    tc.resolve_overload("aten", "_fft_c2c.default"): fft_c2c,
}
