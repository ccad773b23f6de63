"""Copies of views, the unfold view, scatters into a diagonal or a strided window, and
the triangle-index factories.

A ``*_copy`` op is its view, then a contiguous copy (what torch's generated
kernels do); ``unfold`` is the view itself, one ``as_strided`` of the floor, so
it still shares memory. The scatters write with ``index_put`` into a copy laid
out as eager's copy is (``clone`` keeps a dense input's strides).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ... import _torch_compat as tc

aten = torch.ops.aten


def _copied(view: Callable) -> Callable:
    def decomposition(x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        out = view(x, *args, **kwargs)
        if isinstance(out, (tuple, list)):
            return [o.clone(memory_format=torch.contiguous_format) for o in out]
        return out.clone(memory_format=torch.contiguous_format)
    return decomposition


def unfold(x: torch.Tensor, dimension: int, size: int, step: int) -> torch.Tensor:
    if x.dim() == 0:
        return aten.as_strided.default(x, [size], [1], x.storage_offset())
    dim = dimension % x.dim()
    sizes, strides = list(x.shape), list(x.stride())
    sizes[dim] = (sizes[dim] - size) // step + 1
    strides[dim] *= step
    return aten.as_strided.default(x, [*sizes, size], [*strides, x.stride(dim)], x.storage_offset())


def diagonal_scatter(x: torch.Tensor, src: torch.Tensor, offset: int = 0, dim1: int = 0,
                     dim2: int = 1) -> torch.Tensor:
    dim1, dim2 = dim1 % x.dim(), dim2 % x.dim()
    length = max(0, min(x.size(dim1) + min(offset, 0), x.size(dim2) - max(offset, 0)))
    steps = torch.arange(length, device=x.device)
    indices: list[Any] = [None] * x.dim()
    indices[dim1], indices[dim2] = steps + max(-offset, 0), steps + max(offset, 0)
    # advanced indexing puts the diagonal where the two dims were if they are adjacent, else first
    where = min(dim1, dim2) if abs(dim1 - dim2) == 1 else 0
    return aten.index_put.default(x, indices, src.movedim(-1, where))


def _storage_order(x: torch.Tensor) -> list[int] | None:
    """The permutation listing ``x``'s dims from outermost to innermost in memory, if ``x``
    is dense and non-overlapping (then ``clone`` keeps its strides), else None."""
    sizes, strides = list(x.shape), list(x.stride())
    order = sorted(range(x.dim()), key=lambda d: (-strides[d], -sizes[d]))
    expected = 1
    for d in reversed(order):
        if sizes[d] != 1 and strides[d] != expected:
            return None
        expected *= sizes[d]
    return order


def as_strided_scatter(x: torch.Tensor, src: torch.Tensor, size: Any, stride: Any,
                       storage_offset: Any = None) -> torch.Tensor:
    """Eager clones ``x`` and writes ``src`` through ``as_strided`` of the clone: the positions
    are offsets into the clone's memory, flat in the order the clone lays ``x`` out."""
    order = _storage_order(x) or list(range(x.dim()))
    laid_out = x.permute(order)
    flat = laid_out.reshape(-1)
    offsets = torch.full((), storage_offset or 0, dtype=torch.int64, device=x.device)
    for d, (n, s) in enumerate(zip(size, stride)):
        shape = [1] * len(size)
        shape[d] = n
        offsets = offsets + (torch.arange(n, device=x.device) * s).view(shape)
    written = aten.index_put.default(flat, [offsets.reshape(-1)], src.reshape(-1).to(x.dtype))
    inverse = [order.index(d) for d in range(x.dim())]
    return written.view(laid_out.shape).permute(inverse)


def _triangle_indices(keep: Callable, per_row: Callable) -> Callable:
    def decomposition(row: int, col: int, offset: int = 0, *, dtype: Any = None, layout: Any = None,
                      device: Any = None, pin_memory: Any = None) -> torch.Tensor:
        """The (row, col) pairs of the kept triangle in row-major order: their count is known
        from the sizes, so sorting the grid's flat positions with the dropped ones pushed
        past the end and keeping the first ``count`` gives them with static shapes."""
        dtype = dtype or torch.int64
        rows = torch.arange(row, device=device).view(row, 1).expand(row, col).reshape(-1)
        cols = torch.arange(col, device=device).view(1, col).expand(row, col).reshape(-1)
        kept = keep(cols - rows, offset)
        count = sum(min(max(per_row(r, col, offset), 0), col) for r in range(row))
        position = torch.arange(row * col, device=device)
        order = torch.sort(torch.where(kept, position, position + row * col)).indices[:count]
        return torch.stack([rows[order], cols[order]]).to(dtype)
    return decomposition


DECOMPOSITIONS: dict[Any, Callable] = {
    aten.view_copy.default: _copied(aten.view.default),
    aten.permute_copy.default: _copied(aten.permute.default),
    aten.as_strided_copy.default: _copied(aten.as_strided.default),
    aten.unbind_copy.int: _copied(aten.unbind.int),
    aten.narrow_copy.default: _copied(aten.narrow.default),
    # no OpInfo reaches these: torch's own traces of a HOP body's forward and backward
    # (functionalized, views removed) hold them, scan's under export_joint (tests by hand)
    aten.select_copy.int: _copied(aten.select.int),
    aten.slice_copy.Tensor: _copied(aten.slice.Tensor),
    aten.detach_copy.default: _copied(aten.detach.default),
    aten.split_copy.Tensor: _copied(aten.split.Tensor),
    aten.unfold.default: unfold,
    aten.diagonal_scatter.default: diagonal_scatter,
    aten.as_strided_scatter.default: as_strided_scatter,
    aten.tril_indices.default: _triangle_indices(lambda above, offset: above <= offset,
                                                 lambda r, col, offset: r + offset + 1),
    aten.triu_indices.default: _triangle_indices(lambda above, offset: above >= offset,
                                                 lambda r, col, offset: col - max(r + offset, 0)),
}


def efficient_zero_tensor(size: Any, *, dtype: Any = None, layout: Any = None, device: Any = None,
                          pin_memory: Any = None) -> torch.Tensor:
    """Autograd's placeholder for a zero gradient: the same zeros, as an ordinary tensor."""
    return torch.zeros(size, dtype=dtype, device=device)


def empty_permuted(size: Any, physical_layout: Any, *, dtype: Any = None, layout: Any = None, device: Any = None,
                   pin_memory: Any = None) -> torch.Tensor:
    """Uninitialised memory laid out in ``physical_layout``'s order (outermost first): the
    strides of that order, given to ``empty_strided``. torch's ``empty_like`` reaches it for
    a tensor that is not contiguous (channels-last activations, a transposed weight)."""
    strides = [0] * len(size)
    step = 1
    for dim in reversed(list(physical_layout)):
        strides[dim] = step
        step = step * torch.sym_max(size[dim], 1)  # as contiguous strides: a 0 counts as 1
    return aten.empty_strided.default(size, strides, dtype=dtype, layout=layout, device=device,
                                      pin_memory=pin_memory)


def new_empty_strided(x: torch.Tensor, size: Any, stride: Any, *, dtype: Any = None, layout: Any = None,
                      device: Any = None, pin_memory: Any = None) -> torch.Tensor:
    """``empty_strided`` with ``x``'s dtype, layout and device where none is given (torch decomposes
    it into prims only; autograd allocates gradient buffers with it, so pf.eager meets it each step)."""
    return aten.empty_strided.default(size, stride, dtype=dtype or x.dtype, layout=layout or x.layout,
                                      device=device or x.device, pin_memory=pin_memory)


def index_reduce(x: torch.Tensor, dim: int, index: torch.Tensor, source: torch.Tensor, reduce: str, *,
                 include_self: bool = True) -> torch.Tensor:
    """``scatter_reduce`` with ``index`` spread along ``dim`` over ``source``'s shape."""
    dim = dim % max(x.dim(), 1)
    shape = [1] * source.dim()
    if source.dim():
        shape[dim] = -1
    spread = index.reshape(shape).expand(source.shape) if source.dim() else index.reshape(())
    return aten.scatter_reduce.two(x, dim, spread, source, reduce, include_self=include_self)


def put(x: torch.Tensor, index: torch.Tensor, source: torch.Tensor, accumulate: bool = False) -> torch.Tensor:
    """Writes into ``x`` seen as flat (row-major), negative indices from the end."""
    flat = x.reshape(-1)
    positions = index.reshape(-1)
    positions = torch.where(positions < 0, positions + flat.numel(), positions)
    written = aten.index_put.default(flat, [positions], source.reshape(-1), accumulate)
    return written.view(x.shape)


def bincount(x: torch.Tensor, weights: torch.Tensor | None = None, minlength: int = 0) -> torch.Tensor:
    """The count's length is the data's maximum: read with ``.item()`` (so never cached)."""
    length = max(int(x.max().item()) + 1 if x.numel() else 0, minlength)
    if weights is None:
        values = torch.ones_like(x, dtype=torch.int64)
    else:  # eager counts integer weights in double
        values = weights if weights.is_floating_point() else weights.to(torch.float64)
    return values.new_zeros(length).scatter_add(0, x, values)


bincount.reads_data = True  # type: ignore[attr-defined]

DECOMPOSITIONS.update({
    tc.resolve_overload("aten", "_efficientzerotensor.default"): efficient_zero_tensor,
    aten.empty_permuted.default: empty_permuted,
    aten.new_empty_strided.default: new_empty_strided,
    aten.index_reduce.default: index_reduce,
    aten.put.default: put,
    aten.bincount.default: bincount,
})
