"""Random ops restated on the floor's in-place draws, drawing as their kernels draw: eager only.

``normal`` with a tensor mean or std: the kernel fills its output with standard
normal draws (``normal_(0, 1)``), then scales by ``std`` and shifts by ``mean``;
so does this, so the generator is consumed identically and the values are equal.

Not shared with ``export(..., target=)``: torch defines ``normal``'s gradient
with respect to ``mean`` and ``std`` as zero, and a decomposition differentiated
above autograd (as export's is) would give the reparametrized one instead, or,
detached, an output cut from autograd. Below autograd (``pf.eager``) autograd
keeps eager's formula and only the values come from here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

aten = torch.ops.aten


def _normal(mean: Any, std: Any, generator: Any) -> torch.Tensor:
    tensors = [t for t in (mean, std) if isinstance(t, torch.Tensor)]
    shape = torch.broadcast_shapes(*(t.shape for t in tensors))
    dtype = torch.result_type(*tensors) if len(tensors) > 1 else tensors[0].dtype
    noise = torch.empty(shape, dtype=dtype, device=tensors[0].device).normal_(0, 1, generator=generator)
    return noise * std + mean


def normal_tensor_tensor(mean: torch.Tensor, std: torch.Tensor, *, generator: Any = None) -> torch.Tensor:
    return _normal(mean, std, generator)


def normal_tensor_float(mean: torch.Tensor, std: float = 1.0, *, generator: Any = None) -> torch.Tensor:
    return _normal(mean, std, generator)


def normal_float_tensor(mean: float, std: torch.Tensor, *, generator: Any = None) -> torch.Tensor:
    return _normal(mean, std, generator)


DECOMPOSITIONS: dict[Any, Callable] = {
    aten.normal.Tensor_Tensor: normal_tensor_tensor,
    aten.normal.Tensor_float: normal_tensor_float,
    aten.normal.float_Tensor: normal_float_tensor,
}
