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

import torch

from .. import _torch_compat as tc

aten = torch.ops.aten


def _same_layout(dst: torch.Tensor, src: torch.Tensor) -> bool:
    """Same dtype, device, sizes and strides, all known: the copy's value is ``src``."""
    dims = [*dst.shape, *dst.stride(), *src.shape, *src.stride()]
    return (all(isinstance(d, int) for d in dims) and dst.dtype == src.dtype
            and dst.device == src.device and dst.shape == src.shape and dst.stride() == src.stride())


def _writes_a_graph_input(dst: torch.Tensor) -> bool:
    """Whether ``dst`` is an input or buffer placeholder, or a chain of views of one."""
    node = tc.proxy_node_of(dst)
    while (isinstance(node, torch.fx.Node) and isinstance(node.target, torch._ops.OpOverload)
           and node.target.is_view and node.args and isinstance(node.args[0], torch.fx.Node)):
        node = node.args[0]
    return isinstance(node, torch.fx.Node) and node.op == "placeholder"


def copy_as_differentiable_ops(dst: torch.Tensor, src: torch.Tensor,
                               non_blocking: bool = False) -> torch.Tensor:
    """``src`` written over all of ``dst``; ``dst`` stays an input (zero gradient),
    so the result requires grad exactly when eager's ``copy_`` result does."""
    # The value is src itself only for a write into (a view of) an input or buffer, e.g.
    # a re-exported program's write-backs (aot copies an output that would then alias a
    # written input). Elsewhere the written tensor keeps dst's autograd link: eager's
    # copy_ result requires grad if dst did, even when src does not; and a write done
    # without grad keeps its own autograd identity (hop/ops.py).
    if _same_layout(dst, src) and torch.is_grad_enabled() and _writes_a_graph_input(dst):
        return src
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


DECOMPOSITIONS = {aten.copy.default: copy_as_differentiable_ops}
