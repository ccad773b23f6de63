"""ATen decompositions torch lacks, for ops eager kernels call below autograd.

torch decomposes these only into prims (``torch._refs``), which no ATen op set
holds, and export never meets them (its functional batch norm takes another
path), but eager's CPU ``native_batch_norm`` decomposition calls ``var_mean``, and autograd
allocates gradient buffers with ``new_empty_strided``.
Each is a one-line restatement in ops of Core ATen; the op_db coverage run
checks each against eager.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

aten = torch.ops.aten


def _var_mean_correction(x: torch.Tensor, dim: Any = None, *, correction: Any = None,
                         keepdim: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    return (aten.var.correction(x, dim, correction=correction, keepdim=keepdim),
            aten.mean.dim(x, dim, keepdim=keepdim) if dim is not None else
            aten.mean.dim(x, list(range(x.dim())), keepdim=keepdim))


def _new_empty_strided(x: torch.Tensor, size: Any, stride: Any, *, dtype: Any = None, layout: Any = None,
                       device: Any = None, pin_memory: Any = None) -> torch.Tensor:
    return aten.empty_strided.default(size, stride, dtype=dtype or x.dtype, layout=layout or x.layout,
                                      device=device or x.device, pin_memory=pin_memory)


TABLE: dict[Any, Callable] = {
    aten.var_mean.correction: _var_mean_correction,
    aten.new_empty_strided.default: _new_empty_strided,  # autograd allocates gradients with it
}
