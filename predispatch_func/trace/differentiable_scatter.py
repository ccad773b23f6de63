"""A stand-in for ``aten.as_strided_scatter`` whose gradients are right.

Functionalization writes back through an ``as_strided`` view with
``as_strided_scatter(base, value, size, stride, offset)``, and torch's derivative
of that op for ``base`` is wrong (gradcheck fails on torch 2.11, 2.13 and 2.15;
``y.as_strided((3,), (1,), 1).mul_(2)`` gave its input a gradient 0.66 off), so a
program that wrote through ``as_strided`` trained silently wrong. The same values
come from an ``index_put`` of the positions the view covers, whose gradients are
eager's: the written positions' to ``value``, the others' to ``base``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

aten = torch.ops.aten
_USERS_CALL: list[bool] = []  # a user's own as_strided_scatter call: recorded as eager runs it


@contextlib.contextmanager
def users_own_call() -> Iterator[None]:
    """A model that calls ``as_strided_scatter`` itself gets eager's op and derivative (as
    torch.export records it); only functionalization's write-backs take the stand-in."""
    _USERS_CALL.append(True)
    try:
        yield
    finally:
        _USERS_CALL.pop()


def scatter_decompositions() -> dict:
    """The make_fx decomposition table entry (stack.py's trace)."""
    return {aten.as_strided_scatter.default: as_strided_scatter_by_index}


def as_strided_scatter_by_index(base: torch.Tensor, value: torch.Tensor, size: list, stride: list,
                                storage_offset: int | None = None) -> torch.Tensor:
    """``value`` written over the elements of ``base`` that ``as_strided(size, stride, offset)``
    views; ``base`` contiguous (a functional base is), so its memory order is its element order."""
    if _USERS_CALL or not base.is_contiguous():
        return NotImplemented
    positions = aten.as_strided.default(aten.arange.default(base.numel(), device=base.device),
                                        size, stride, storage_offset or 0)
    if value.dtype != base.dtype:
        value = aten._to_copy.default(value, dtype=base.dtype)
    written = aten.index_put.default(aten.view.default(base, [-1]), [_flat(positions)], _flat(value))
    return aten.view.default(written, list(base.shape))


def _flat(t: torch.Tensor) -> torch.Tensor:
    """``t``'s elements in order, as one dimension (a copy where ``t`` is strided; no
    ``reshape``, a composite whose aliasing the program does not keep)."""
    dense = aten.clone.default(t, memory_format=torch.contiguous_format)
    return aten.view.default(dense, [-1])
