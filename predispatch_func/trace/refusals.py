"""What the tracing mode refuses, each with its :class:`~predispatch_func.errors.Refusal` kind.

Checks run first in every dispatch (before any state is recorded), chosen once
per trace by :func:`checks`. Failures torch itself
raises while tracing are translated into refusals by :func:`known_torch_limit`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .. import _torch_compat as tc
from ..errors import DataDependentError, Refusal, UnsupportedError, user_source_line
from .observers import OpCall

Check = Callable[[OpCall, "set[int]"], None]  # (the op call, ids of the graph inputs)


def _refuse(kind: Refusal, message: str, op: Any) -> UnsupportedError:
    return UnsupportedError(message, kind=kind, op=op, source=user_source_line())


def grad_mode_after_autograd(call: OpCall, input_ids: set[int]) -> None:
    if not call.grad:
        raise _refuse(Refusal.GRAD_MODE_AFTER_AUTOGRAD,
                      "the model disables grad mode; after autograd (pre_dispatch=False) a region "
                      "cannot be recorded, so its gradients would silently differ from eager; "
                      "export with pre_dispatch=True", call.func)


Layout = tuple  # (sizes, strides, storage offset)


class InputMetadataWrites:
    """In-place view ops on graph inputs (``t_``, ``unsqueeze_``, ``resize_``, ``as_strided_``).

    An input whose layout differs at the end of the trace is carried: its new value
    is a mutation output, and ``ep.module()`` gives the input eager's new layout
    before writing the value back (:meth:`changed`; ``t_()`` of a 1-D tensor, or
    ``unsqueeze_(0)`` undone by ``squeeze_(0)``, changes nothing). A symbolic new
    layout (dynamic shapes) has no such write-back: refused (:meth:`refuse_symbolic`).
    """

    __slots__ = ("_first",)

    def __init__(self) -> None:
        self._first: dict[int, tuple[Any, Layout, Any, str | None]] = {}  # id -> (input, layout, op, line)

    def __call__(self, call: OpCall, input_ids: set[int]) -> None:
        t = call.args[0] if call.args else None
        if (id(t) in input_ids and id(t) not in self._first
                and torch.Tag.inplace_view in getattr(call.func, "tags", ())):
            self._first[id(t)] = (t, _layout(t), call.func, user_source_line())

    def changed(self) -> dict[int, tuple[Layout, Layout]]:
        """id of each input whose layout changed -> (layout before, layout after)."""
        return {i: (layout, _layout(t)) for i, (t, layout, _, _) in self._first.items() if _layout(t) != layout}

    def refuse_symbolic(self) -> None:
        for t, layout, func, source in self._first.values():
            after = _layout(t)
            if after != layout and not all(isinstance(v, int) for v in (*after[0], *after[1], after[2])):
                raise UnsupportedError(
                    "in-place metadata change (shape/stride) of a graph input to a symbolic layout "
                    "(dynamic shapes): the program's write-back cannot restore it; use the "
                    "out-of-place op instead", kind=Refusal.INPUT_METADATA_MUTATION, op=func, source=source)


def _layout(t: Any) -> tuple:
    return tuple(t.shape), tuple(t.stride()), t.storage_offset()


def overlapping_writes(call: OpCall, input_ids: set[int]) -> None:
    """One tensor passed as two mutable arguments (``batch_norm(x, None, None, s, s,
    True, ...)``): eager applies the kernel's writes one after the other, a
    functional program computes each from the old value."""
    if len(call.written) < 2:
        return
    spans = []
    for t in call.written:
        start = t.storage_offset()
        extent = sum((n - 1) * st for n, st in zip(t.shape, t.stride()) if n > 0) if t.numel() else -1
        spans.append((tc.storage_key(t), start, start + extent))
    for i, (key, lo, hi) in enumerate(spans):
        for key2, lo2, hi2 in spans[:i]:
            if key == key2 and lo <= hi2 and lo2 <= hi:
                raise _refuse(Refusal.OVERLAPPING_WRITES,
                              "one tensor (or overlapping views of it) is passed as two arguments the op "
                              "writes; eager applies the writes one after the other, which a functional "
                              "program cannot express: pass separate tensors", call.func)


def sparse_writes(call: OpCall, input_ids: set[int]) -> None:
    """A sparse kernel may return indices or values that alias its inputs under a schema
    that says fresh (``gather_backward(..., sparse_grad=True)``: values view ``grad``;
    the schema audit finds it), so a write to a sparse result may reach an input that
    functionalization cannot see."""
    if any(t.layout != torch.strided for t in call.written):
        raise _refuse(Refusal.WRITE_TO_SPARSE,
                      "in-place write to a sparse tensor: sparse kernels may return indices or values "
                      "that alias their inputs without their schema saying so, so the write could "
                      "reach an input the program would not update; write to a dense tensor or "
                      "use the out-of-place op", call.func)


_STORAGE_SWAPS = frozenset(getattr(torch.ops.aten.set_, name) for name in torch.ops.aten.set_.overloads())


def storage_swaps(call: OpCall, input_ids: set[int]) -> None:
    """``x.set_(y)``: eager makes ``x`` a view of ``y``'s memory (or a Storage's), with ``y``'s
    shape. On an intermediate from a tensor it is carried: functionalization makes ``x`` an alias
    of ``y`` (a later write through either reaches both), which is all a program need say. On a
    graph input the caller's tensor would have to share another's memory after the call, and a
    Storage has no value to alias: refused; so is a source that requires grad with grad on
    (eager's ``set_`` has no derivative: its backward raises where a program's would not)."""
    if call.func not in _STORAGE_SWAPS:
        return
    if call.func is _SET_SOURCE_TENSOR and id(call.args[0]) not in input_ids:
        if not (call.grad and (call.args[1].requires_grad or call.args[0].requires_grad)):
            return
        raise _refuse(Refusal.STORAGE_SWAP,
                      f"{call.func} with a tensor that requires grad, grad on: eager's set_ has no derivative "
                      "(its backward raises), which a program that aliases the two would not repeat: use the "
                      "source tensor itself (y instead of x after x.set_(y)), or call set_ under no_grad",
                      call.func)
    raise _refuse(Refusal.STORAGE_SWAP,
                  f"{call.func} gives a tensor another tensor's memory; a functional program has no "
                  "memory to share with the caller's tensors or a Storage: use the source tensor itself "
                  "(y instead of x after x.set_(y)), or x.copy_(y) when the shapes agree; set_ from a tensor "
                  "onto an intermediate is carried", call.func)


_SET_SOURCE_TENSOR = torch.ops.aten.set_.source_Tensor
_RESIZES = frozenset((torch.ops.aten.resize_.default, torch.ops.aten.resize_as_.default))


def resize_with_grad(call: OpCall, input_ids: set[int]) -> None:
    """``t.resize_(...)`` with grad on, of a tensor that requires grad: eager raises ("cannot resize
    variables that require grad"), the trace (autograd does not run) would not."""
    if call.func in _RESIZES and call.grad and call.args[0].requires_grad:
        raise _refuse(Refusal.INPUT_METADATA_MUTATION,
                      f"{call.func} of a tensor that requires grad: eager refuses it (cannot resize variables "
                      "that require grad); resize a detached copy, or allocate the tensor at its size", call.func)


def checks(pre_dispatch: bool, metadata_writes: InputMetadataWrites,
           draws_after_reseed: DrawsAfterReseed, *, under_pre_dispatch: bool = False) -> tuple[Check, ...]:
    """The checks every op passes first, for one trace. ``under_pre_dispatch``: a stretch
    traced below autograd inside a pre-dispatch trace (``torch.func`` transforms,
    trace/extensions/func_transforms.py), whose grad-mode changes that trace still records as regions."""
    if pre_dispatch:
        return (metadata_writes, overlapping_writes, sparse_writes, storage_swaps, resize_with_grad,
                draws_after_reseed)
    if under_pre_dispatch:
        return (metadata_writes, sparse_writes, storage_swaps, draws_after_reseed)
    return (grad_mode_after_autograd, metadata_writes, sparse_writes, storage_swaps, draws_after_reseed)


def leaked_autocast() -> None:
    """Autocast left enabled when forward returns has no functional form (grad mode
    left off does: the program's module() sets it, see program/runtime.py)."""
    if tc.autocast_enabled_anywhere():
        raise UnsupportedError(
            "the model leaves autocast enabled when forward returns; a functional program "
            "cannot change the caller's autocast state", kind=Refusal.MODE_LEFT_CHANGED,
            op=tc.ENTER_AUTOCAST.__name__, source=tc.last_recorded_call_source(tc.ENTER_AUTOCAST))


class DrawsAfterReseed:
    """A draw from the global RNG after ``torch.manual_seed`` (or a ``set_rng_state`` that
    changed the state) in forward: eager draws from that seed on every call, a program
    records only the draw, which takes the caller's RNG state as it is (torch.export's
    program too, silently). A reseed with no draw after it, undone before forward returns
    (``freeze_rng_state``, ``fork_rng``), changes nothing the caller sees: carried."""

    __slots__ = ("_reseed", "_state_at_start")

    def __init__(self) -> None:
        self._reseed: tuple[str, str | None] | None = None  # (torch function, user's line)
        self._state_at_start = torch.get_rng_state()

    def refuse_left_changed(self) -> None:
        """Eager's caller finds the RNG reseeded after the call; a program's does not."""
        if self._reseed is not None and not torch.equal(self._state_at_start, torch.get_rng_state()):
            name, line = self._reseed
            raise UnsupportedError(
                f"the model calls torch.{name} in forward and leaves the global RNG reseeded when it "
                "returns: a program cannot change the caller's RNG state; seed outside the model",
                kind=Refusal.RNG_STATE_SET, op=f"torch.{name}", source=line)

    def note(self, name: str) -> None:
        if self._reseed is None:
            self._reseed = (name, user_source_line())

    def __call__(self, call: OpCall, input_ids: set[int]) -> None:
        if self._reseed is None or not _draws_from_global_rng(call):
            return
        name, line = self._reseed
        raise _refuse(
            Refusal.RNG_STATE_SET,
            f"{call.func} draws from the global RNG after the model called torch.{name} in forward"
            f"{f' (at {line})' if line else ''}: eager draws from that seed on every call, a program "
            "cannot carry the reseed and would draw from the caller's RNG state instead; seed "
            "outside the model, or pass a torch.Generator to the random op", call.func)


def _draws_from_global_rng(call: OpCall) -> bool:
    """A seeded random op that draws: not in eval (``train=False``), not with ``p=0`` (or
    attention's ``dropout_p=0``), and not from a generator of its own."""
    if torch.Tag.nondeterministic_seeded not in getattr(call.func, "tags", ()):
        return False
    schema_args = tc.schema_of(call.func).arguments
    named = {a.name: a.default_value for a in schema_args if a.has_default_value()}
    named |= dict(zip((a.name for a in schema_args), call.args)) | call.kwargs
    return not (named.get("train", named.get("training")) is False
                or named.get("p", named.get("dropout_p")) == 0 or named.get("generator") is not None)


# Failures torch raises while a model is traced, each with what to write instead: (torch's
# error (_torch_compat/error_texts.py), our kind, our explanation; {exc} is torch's message)
_KNOWN_TORCH_LIMITS = (
    (tc.error_texts.RESIZE_VIEW_TO_LARGER, Refusal.INPUT_METADATA_MUTATION,
     "torch's functionalization cannot grow this tensor with resize_() ({exc}): growth is carried only "
     "for a contiguous tensor with static sizes, nothing after it in memory and no autograd history "
     "(a view of another tensor, a transposed one, or one that requires grad is not); resize a "
     "contiguous clone (x.contiguous().clone()), or allocate the larger tensor outside the model"),
    (tc.error_texts.SET_STORAGE_OTHER_DEVICE, Refusal.VIEW_DTYPE_REBUILD,
     "torch's functionalization cannot rebuild a view(dtype) of a tensor written before the "
     "view was made, under no_grad ({exc}); take the view before the write, or outside no_grad"),
    (tc.error_texts.MUTATION_WITH_INTERNAL_OVERLAP, Refusal.WRITE_TO_OVERLAPPING_VIEW,
     "an in-place op writes a view whose elements overlap (several of its elements are one memory "
     "location, as in t.unfold(1, 3, 2) with a step smaller than the window): eager writes "
     "the shared elements one after another, in the order its kernel runs, while a functional program "
     "computes every element from the old value, so torch's functionalization refuses it ({exc}). "
     "Compute the result out of place (t.unfold(1, 3, 2).abs() instead of .abs_()), and write the base "
     "with an op whose views do not overlap if it must change"),
    (tc.error_texts.CANNOT_VIEW, Refusal.VIEW_REPLAY_AFTER_STRIDED_WRITE,
     "torch's functionalization cannot replay a .view() of a tensor written through a "
     "non-contiguous alias ({exc}); use .reshape() for that view, or write through a "
     "contiguous alias"),
    (tc.error_texts.AS_STRIDED_IN_VIEW_CHAIN, Refusal.WRITE_THROUGH_AS_STRIDED_OF_VIEW,
     "torch's functionalization cannot write through an as_strided() view taken of another "
     "view (as_strided is not compositional, pytorch/pytorch#104505); take the as_strided() "
     "view of the base tensor itself, or write through ordinary views"),
    (tc.error_texts.AUTOGRAD_NOT_SUPPORT_DTYPE, Refusal.GRAD_VALUE_INTO_INTEGER,
     "a value that requires grad is written into an integer tensor: torch's functional form "
     "of this op cannot run under autograd ({exc}), and eager's in-place op attaches autograd "
     "history to the integer tensor or not depending on how it is called; an integer tensor "
     "carries no gradient, so detach the value written (x[i] = v.detach())"),
    (tc.error_texts.WHILE_LOOP_RESULT_AS_HOP_OPERAND, Refusal.HOP_OPERAND_OF_WHILE_LOOP,
     "torch cannot capture this higher-order op's operands: a while_loop result computed with grad on "
     "is the last slice of a stack of its iterations, so its storage offset depends on the trip count, "
     "and torch's capture of another HOP's operands (dynamo) fails on such a tensor (torch.export fails "
     "too). Pass a .clone() of the while_loop result"),
)


def known_torch_limit(exc: BaseException, op: Any, source: str | None) -> UnsupportedError | None:
    """Our refusal for ``exc`` if it is one of :data:`_KNOWN_TORCH_LIMITS`."""
    for torch_error, kind, explanation in _KNOWN_TORCH_LIMITS:
        if torch_error.matches(exc):
            return UnsupportedError(explanation.format(exc=exc), kind=kind, op=op, source=source)
    return None


def data_dependent_branch(exc: BaseException, op: Any, source: str | None) -> DataDependentError:
    """What to write instead when the model decides on a value read from tensor data
    (``if x.sum().item() > 2``, a slice by a nonzero count): torch.export fails there too."""
    cond = getattr(exc, "cond", None)
    return DataDependentError(
        f"Could not guard on data-dependent expression {cond}: the model decides on a value read from tensor "
        "data, and a program cannot hold a Python "
        "decision on data: tell the exporter what holds with torch._check(...) before it (torch._check_is_size(n) "
        "for a size), write the branch as torch.cond(pred, true_fn, false_fn, operands), or compute it on "
        "tensors (torch.where)", cond=cond, op=op, source=source)
