"""A differentiable stand-in for ``aten.copy``, the functional form of ``copy_``.

Functionalization turns ``dst.copy_(src)`` into ``aten.copy(dst, src)``, but on
the PreDispatch key the graph is later run *through* autograd, and autograd
has no derivative for ``aten.copy`` ("derivative for aten::copy is not
implemented"): a program that writes a buffer or an input with ``copy_``
could not be trained although the eager model can. We record instead the
same values *and strides* from differentiable ops (``aten.copy`` keeps
``dst``'s strides, and later view replays and alias decisions depend on
them): ``src`` converted and broadcast to ``dst``'s shape, then laid out in
``dst``'s dimension order, or, for a ``dst`` with gaps, scattered into a fresh
buffer with ``dst``'s exact strides.
"""

from __future__ import annotations

import torch

aten = torch.ops.aten


def _dense_strides(sizes: list[int], order: list[int]) -> list[int]:
    """Strides of a dense tensor whose dims, outermost first, are ``order``."""
    strides = [0] * len(sizes)
    step = 1
    for d in reversed(order):
        strides[d] = step
        step *= max(sizes[d], 1)
    return strides


def _same_layout(dst: torch.Tensor, src: torch.Tensor) -> bool:
    """Same dtype, device, sizes and strides, all known: the copy's value is ``src``."""
    dims = [*dst.shape, *dst.stride(), *src.shape, *src.stride()]
    return (all(isinstance(d, int) for d in dims) and dst.dtype == src.dtype
            and dst.device == src.device and dst.shape == src.shape and dst.stride() == src.stride())


def copy_as_differentiable_ops(dst: torch.Tensor, src: torch.Tensor,
                               non_blocking: bool = False) -> torch.Tensor:
    sizes, strides = list(dst.shape), list(dst.stride())
    if _same_layout(dst, src):  # e.g. a write-back replayed when a program is re-exported
        return src
    order = sorted(range(dst.dim()), key=lambda d: -strides[d])
    contiguous = order == list(range(dst.dim())) and _dense_strides(sizes, order) == strides
    if contiguous and list(src.shape) == sizes:
        return aten._to_copy.default(src, dtype=dst.dtype, device=dst.device,
                                     memory_format=torch.contiguous_format)
    value = aten.expand.default(aten._to_copy.default(src, dtype=dst.dtype, device=dst.device), sizes)
    if _dense_strides(sizes, order) == strides:
        if contiguous:
            return aten.clone.default(value, memory_format=torch.contiguous_format)
        inverse = sorted(range(dst.dim()), key=order.__getitem__)
        dense = aten.clone.default(aten.permute.default(value, order), memory_format=torch.contiguous_format)
        return aten.permute.default(dense, inverse)
    storage = 1 + sum((n - 1) * s for n, s in zip(sizes, strides) if n > 0)
    fresh = aten.zeros.default([storage], dtype=dst.dtype, device=dst.device)
    return aten.as_strided.default(aten.as_strided_scatter.default(fresh, value, sizes, strides, 0),
                                   sizes, strides, 0)


DECOMPOSITIONS = {aten.copy.default: copy_as_differentiable_ops}
