"""The region HOPs: ``pf_grad_region`` and ``pf_autocast_region``.

A call runs its functional ``body`` under the region's mode::

    outs = pf_grad_region(False, (0, -1), body, x, w)
    # == with torch.set_grad_enabled(False): body(x, w), then output 0 carries x's
    #    autograd identity (see below)

``identity_of[k] = j`` says output ``k`` is the new value of operand ``j``,
written in place while grad was off. Eager keeps such a tensor's autograd
identity (an in-place update under ``no_grad`` changes data, not history), so
gradients reaching output ``k`` flow straight to operand ``j``; a fresh value
with no history would silently drop them.

Calling a region HOP inlines its body, as torch's ``wrap_with_set_grad_enabled``
does. Re-tracing a program (``export(ep.module())``) therefore records the
body's ops between grad/autocast markers again, and the region pass outlines
the same regions again. The identities are handed to the functional mode doing
the tracing, when it records them (an :class:`IdentityRecorder`: it turns them
into the identity edges the region pass reads), so nothing is lost or duplicated.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch

from .. import _torch_compat as tc


@runtime_checkable
class IdentityRecorder(Protocol):
    """A tracing mode that records "``value`` keeps ``source``'s autograd identity"."""

    def note_identity(self, source: Any, value: Any) -> None: ...


class _CarryIdentity(torch.autograd.Function):
    """Value of ``value``; gradient straight to ``source`` (eager's in-place-under-no_grad).

    The result is ``value.detach()``, not a view of ``value``: a view made later
    under ``no_grad`` takes ``requires_grad`` from its root base, which must be
    the carried tensor (as eager's written tensor is), not the fresh ``value``.
    """

    @staticmethod
    def forward(ctx, source: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        return value.detach()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


def is_a_leaf_carried(t: torch.Tensor) -> bool:
    """``t`` is a leaf that requires grad, written in place without autograd (carried through
    region calls by :class:`_CarryIdentity`): as eager's written leaf, it holds no history."""
    node = t.grad_fn
    while node is not None and getattr(node, "_forward_cls", None) is _CarryIdentity:
        node = node.next_functions[0][0]
    return node is not None and type(node).__name__ == "AccumulateGrad"


def _carry(operands: tuple, outs: tuple, identity_of: tuple[int, ...]) -> tuple:
    if not identity_of:
        return outs
    mode = tc.active_functional_mode()
    recorder = mode if isinstance(mode, IdentityRecorder) else None
    carried = []
    for out, j in zip(outs, identity_of):
        if j < 0:
            carried.append(out)
        elif recorder is not None:
            recorder.note_identity(operands[j], out)
            carried.append(out)
        else:
            carried.append(_CarryIdentity.apply(operands[j], out))
    return tuple(carried)


class GradRegion(tc.HigherOrderOperator):
    def __init__(self) -> None:
        super().__init__("pf_grad_region")

    def __call__(self, enabled: bool, identity_of: tuple[int, ...], body, *operands):
        with torch.set_grad_enabled(enabled):
            outs = tuple(body(*operands))
        return _carry(operands, outs, tuple(identity_of))


class AutocastRegion(tc.HigherOrderOperator):
    def __init__(self) -> None:
        super().__init__("pf_autocast_region")

    def __call__(self, device_type: str, dtype: torch.dtype | None, enabled: bool,
                 cache_enabled: bool | None, identity_of: tuple[int, ...], body, *operands):
        with torch.autocast(device_type, dtype, enabled, cache_enabled):
            outs = tuple(body(*operands))
        return _carry(operands, outs, tuple(identity_of))


pf_grad_region = GradRegion()
pf_autocast_region = AutocastRegion()
REGION_HOPS = (pf_grad_region, pf_autocast_region)
# Our own dead-code pass drops a region whose results are unused unless its body draws
# random numbers (graph_cleanup.eliminate_dead_code); torch's, run by ep.module(), must
# then keep every region call it finds, or eager's RNG stream would shift.
for _hop in REGION_HOPS:
    tc.keep_calls_in_torch_dead_code_elimination(_hop)
_BODY_INDEX = {pf_grad_region: 2, pf_autocast_region: 5}  # (mode args..., identity_of, body, *operands)


def region_body_and_operands(call: torch.fx.Node) -> tuple[torch.fx.Node, tuple] | None:
    """``(body get_attr node, operands)`` of a region HOP call; None for any other node."""
    index = _BODY_INDEX.get(call.target) if call.op == "call_function" else None  # type: ignore[call-overload]
    if index is None:
        return None
    return call.args[index], tuple(call.args[index + 1:])
