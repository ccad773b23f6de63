"""A differentiable stand-in for ``aten.copy``, the functional form of ``copy_``.

Functionalization turns ``dst.copy_(src)`` into ``aten.copy(dst, src)``, but on
the PreDispatch key the graph is later run *through* autograd, and autograd
has no derivative for ``aten.copy`` ("derivative for aten::copy is not
implemented"): a program that writes a buffer or an input with ``copy_``
could not be trained although the eager model can. We record instead the
same values, strides (``aten.copy`` keeps ``dst``'s, and later view replays
and alias decisions depend on them) and autograd links (``dst`` gets a zero
gradient, ``src`` the incoming one) from differentiable ops: ``src``
converted, broadcast and scattered over all of ``dst``.
"""

from __future__ import annotations

import functools

import torch

aten = torch.ops.aten


def _same_layout(dst: torch.Tensor, src: torch.Tensor) -> bool:
    """Same dtype, device, sizes and strides, all known: the copy's value is ``src``."""
    dims = [*dst.shape, *dst.stride(), *src.shape, *src.stride()]
    return (all(isinstance(d, int) for d in dims) and dst.dtype == src.dtype
            and dst.device == src.device and dst.shape == src.shape and dst.stride() == src.stride())


class CopyTarget:
    """What the functional mode knows of the ``copy_`` being lowered and the lowering (a
    make_fx decomposition, on plain tensors) cannot see: whether its destination is a
    graph input, or a view of one, that nothing wrote before in this trace; whether its
    source is (a view of) a graph input."""

    __slots__ = ("unwritten_input", "source_is_input")

    def __init__(self) -> None:
        self.unwritten_input = False
        self.source_is_input = False


def copy_decompositions(target: CopyTarget) -> dict:
    """The make_fx decomposition table for ``aten.copy``, reading ``target``."""
    return {aten.copy.default: functools.partial(copy_as_differentiable_ops, target=target)}


def copy_as_differentiable_ops(dst: torch.Tensor, src: torch.Tensor, non_blocking: bool = False,
                               *, target: CopyTarget) -> torch.Tensor:
    """``src`` written over all of ``dst``; ``dst`` stays an input (zero gradient),
    so the result requires grad exactly when eager's ``copy_`` result does."""
    # The value is src itself only where dst cannot require grad: a write with grad on
    # into an input or buffer nothing wrote before (eager refuses a grad-mode write to a
    # leaf that requires grad). Once written, its value may require grad (buf.copy_(w)),
    # and eager's copy_ result keeps dst's autograd link: it requires grad if dst did,
    # even when src does not. A write done without grad keeps its own autograd identity
    # (regions/ops.py), so it needs a node of its own too.
    if _same_layout(dst, src) and torch.is_grad_enabled() and target.unwritten_input:
        # Not a graph input itself, though: eager's dst is a copy, so autograd saves the
        # copy, while a later write-back into the source (``w.data += 1``, an input written
        # after) would change what the program's backward reads.
        return aten.clone.default(src) if target.source_is_input else src
    value = src  # the scatter below copies, so the result never aliases src
    if (src.dtype, src.device) != (dst.dtype, dst.device):
        value = aten._to_copy.default(value, dtype=dst.dtype, device=dst.device)
    if value.shape != dst.shape:
        value = aten.expand.default(value, list(dst.shape))
    if dst.dim() == 0:
        whole = aten.slice_scatter.default(aten.unsqueeze.default(dst, 0), aten.unsqueeze.default(value, 0), 0)
        return aten.select.int(whole, 0, 0)
    # slice_scatter clones dst: its exact strides when dst is dense, dense ones in dst's
    # dimension order when dst has gaps (a strided view; the value is then scattered
    # back into its base, and the view replayed from there). Not as_strided_scatter:
    # torch 2.13's gradient for its ``self`` is wrong (inverted mask).
    return aten.slice_scatter.default(dst, value, 0)


