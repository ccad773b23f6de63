"""What the backward reads: autograd's saved tensors, each made a value of the joint graph.

The joint trace records the forward above autograd (so kept composites stay one node
and region markers stay visible) while autograd builds its graph below, on the same
fake tensors. When the engine runs the backward inside the trace, each backward op
reads saved tensors. Most are values the graph already has (an op's input, a kept
node's result). Some were made below the recording level, invisible to it:

* inside a kept composite's decomposition (``layer_norm``'s mean and rstd, the
  transposed weight of ``linear``);
* by autocast's casts of an op's inputs (the bf16 copies ``mm`` saved).

:class:`SavedValues` is a pair of ``saved_tensors_hooks``. Packing remembers the
forward call in flight (:class:`ForwardCall`) and the tensor's position among what
that call saved. Unpacking returns the graph's value; for an invisible one it
*recomputes* the call once, below autograd (``tc.recorded_below_autograd``: plain ATen
nodes in the backward, autocast's casts explicit) and under the call's grad and
autocast state, and takes the saved tensor at the same position. The recomputation is
the price of a single-node forward composite: e.g. one ``native_layer_norm`` per
``layer_norm`` in the backward (docs/joint.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .. import _torch_compat as tc
from ..errors import Refusal, UnsupportedError
from .errors import JointError, JointProblem
from .temporary_writes import functional_writes


class ForwardCall:
    """One call of the forward graph: how to run it again, and what autograd saved of it."""

    __slots__ = ("run", "op", "args", "grad_enabled", "autocast", "where", "saved_count", "_recomputed")

    def __init__(self, run: Callable[[], Any], where: str, op: Any = None, args: tuple = ()):
        self.run = run  # the op with its (traced) arguments
        self.op, self.args = op, args
        self.grad_enabled = torch.is_grad_enabled()
        self.autocast = tc.autocast_state()
        self.where = where  # the forward node, for errors
        self.saved_count = 0
        self._recomputed: list[torch.Tensor] | None = None

    def recomputed(self, mode: Any) -> list[torch.Tensor]:
        """Every tensor autograd saves when the call runs again, recorded below autograd by a
        proxy mode with ``mode``'s tracer and decompositions (a target's lowering)."""
        tracer = mode.tracer
        if self._recomputed is None:
            saved: list[torch.Tensor] = []

            def keep(t: torch.Tensor) -> torch.Tensor:
                saved.append(t)
                return t

            before = len(tracer.graph.nodes)
            last = next(iter(reversed(tracer.graph.nodes)))
            with tc.grad_mode_untraced(True), tc.autocast_state_as(self.autocast), \
                    torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t), tc.recorded_below_autograd(tracer, decomposing_as=mode):
                self.run()
            if last.next.op != "root":  # the recomputation recorded something
                functional_writes(tracer.graph, last.next)
            drawn = [n for n in list(tracer.graph.nodes)[before:] if _draws_random_numbers(n)]
            if drawn and tc.cudnn_draws_rnn_dropout(self.op, self.args):  # decomposing would not help either
                raise UnsupportedError(
                    f"{self.where}: an RNN with dropout between its layers, training on CUDA: cuDNN draws that mask "
                    "from its own dropout state, which no op of a program reads, so neither recomputing it for the "
                    "backward nor decomposing it drops the elements eager drops. Train with dropout=0 between "
                    "layers (a Dropout module between single-layer RNNs draws as eager), or with "
                    "torch.backends.cudnn.enabled = False, or export the forward alone (pf.export keeps it one node)",
                    kind=Refusal.RNG_STREAM_NOT_REPRODUCIBLE, op=str(self.op))
            if drawn:  # recomputing would draw new random numbers: not the values the forward saved
                error = JointError(
                    f"the backward reads a value {self.where} computed from random numbers ({drawn[0].target}); "
                    "recomputing it would draw others, and the joint program cannot carry them (docs/joint.md). "
                    "Use a deterministic op, or train this model eagerly",
                    kind=JointProblem.SAVED_VALUE_NOT_RECOMPUTABLE)
                error.op = self.op
                raise error
            self._recomputed = saved
        return self._recomputed


class _Invisible:
    """A saved tensor the graph had no value for when it was packed."""

    __slots__ = ("tensor", "call", "index")

    def __init__(self, tensor: torch.Tensor, call: ForwardCall, index: int):
        self.tensor, self.call, self.index = tensor, call, index


class SavedValues:
    """``saved_tensors_hooks`` mapping every saved tensor to a value of the joint graph."""

    def __init__(self, mode: Any):
        self._mode, self._tracer = mode, mode.tracer
        self.call: ForwardCall | None = None  # the forward call in flight (set by the interpreter)
        self._by_layout: dict[tuple, torch.Tensor] = {}  # unpacked values, for the engine's re-wrapped copies
        self.recomputed_calls: list[str] = []
        self._finals: list[tuple[torch.Tensor, torch.Tensor]] = []

    def read_at_final_value(self, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """(input, its final value) of the inputs written only through ``.data``: a saved
        tensor in such an input's storage unpacks as the same view of its final value."""
        self._finals = pairs

    def hooks(self) -> torch.autograd.graph.saved_tensors_hooks:
        return torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def _pack(self, t: torch.Tensor) -> Any:
        call = self.call
        if call is None:
            return t
        index, call.saved_count = call.saved_count, call.saved_count + 1  # position among all it saved
        return t if tc.is_tracked(self._tracer, t) else _Invisible(t, call, index)

    def _unpack(self, packed: Any) -> torch.Tensor:
        if isinstance(packed, _Invisible):
            value = packed.tensor
            if not tc.is_tracked(self._tracer, value):  # (a kept node's own result is tracked by now)
                if packed.call.where not in self.recomputed_calls:
                    self.recomputed_calls.append(packed.call.where)
                recomputed = packed.call.recomputed(self._mode)
                if packed.index >= len(recomputed) or not tc.is_tracked(self._tracer, recomputed[packed.index]):
                    error = JointError(
                        f"the backward reads a value computed inside {packed.call.where} that the joint "
                        "program cannot recompute; decompose that op (composite_overrides) and export again",
                        kind=JointProblem.SAVED_VALUE_NOT_RECOMPUTABLE)
                    error.op = packed.call.op
                    raise error
                value = recomputed[packed.index]
                if not _same_layout(value, packed.tensor):  # the recomputation saved something else there
                    error = JointError(
                        f"the backward reads a value computed inside {packed.call.where}; recomputing the call "
                        f"saved {_layout(value)} where the forward saved {_layout(packed.tensor)}, so the joint "
                        "program cannot recover it. Decompose that op (composite_overrides={op: 'decompose'})",
                        kind=JointProblem.SAVED_VALUE_NOT_RECOMPUTABLE)
                    error.op = packed.call.op
                    raise error
        else:
            value = packed
        value = _at_final_value(value, self._finals)
        if not tc.is_tracked(self._tracer, value):
            return value  # a constant of the forward
        plain = tc.detached_untraced(value)
        tc.track_as(self._tracer, plain, value)
        key = _layout_key(plain)
        if key is not None:
            self._by_layout[key] = plain
        return plain

    def resolve(self, t: torch.Tensor) -> None:
        """A backward op's argument the graph does not know: the engine's copy of an unpacked value."""
        key = _layout_key(t)
        known = self._by_layout.get(key) if key is not None else None
        if known is not None:
            tc.track_as(self._tracer, t, known)


def _at_final_value(t: Any, finals: list[tuple[torch.Tensor, torch.Tensor]]) -> Any:
    """``t`` as eager's backward reads it after the ``.data`` writes: a tensor in the storage of
    an input written only that way is the same view of the input's final value."""
    if not finals or not isinstance(t, torch.Tensor) or t.layout != torch.strided:
        return t
    storage = tc.StorageWeakRef(t.untyped_storage())
    for base, final in finals:
        if storage != tc.StorageWeakRef(base.untyped_storage()):
            continue
        offset = t.storage_offset() - base.storage_offset()
        if _same_layout(t, base) and str(offset) == "0":
            return final
        if str(tuple(final.stride())) != str(tuple(base.stride())):
            raise JointError(
                f"the backward reads a view ({_layout(t)}) of an input written through `.data`, whose new "
                f"value has strides {tuple(final.stride())} where the input has {tuple(base.stride())}: the "
                "joint program cannot take the same view of it. Write through `.data` after the backward "
                "(outside the step), or without `.data`",
                kind=JointProblem.SAVED_VALUE_NOT_RECOMPUTABLE)
        return torch.as_strided(final, t.shape, t.stride(), final.storage_offset() + offset)
    return t


def _layout(t: torch.Tensor) -> str:
    return f"{t.dtype} {tuple(t.shape)} strides {tuple(t.stride())}"


def _same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    return _layout(a) == _layout(b)


def _draws_random_numbers(node: torch.fx.Node) -> bool:
    """A recorded op tagged random, unless its dropout probability is 0 (torch 2.13 tags the CPU
    flash-attention kernel random for its ``dropout_p``, which draws nothing at 0)."""
    target = node.target
    if node.op != "call_function" or torch.Tag.nondeterministic_seeded not in getattr(target, "tags", ()):
        return False
    names = [a.name for a in tc.schema_of(target).arguments]
    if "dropout_p" in names:
        i = names.index("dropout_p")
        p = node.args[i] if i < len(node.args) else node.kwargs.get("dropout_p", 0.0)
        return bool(p != 0)
    return True


def _layout_key(t: torch.Tensor) -> tuple | None:
    """Storage, layout and dtype; sizes as text (a symbolic size is not hashable, its expression is).
    None for a sparse tensor (no storage to key by: ``to_sparse``'s backward saves one)."""
    if t.layout != torch.strided:
        return None
    return (tc.StorageWeakRef(t.untyped_storage()), str(tuple(t.shape)), str(tuple(t.stride())),
            str(t.storage_offset()), t.dtype)
