"""``tensor.data`` while tracing: what eager does, in terms the functional trace sees.

In eager, ``w.data`` is an alias of ``w`` that autograd does not see, and
``w.data = v`` gives ``w`` the storage of ``v`` while ``w`` stays the same leaf
(weight clipping, EMA updates, resets). On a functional tensor both happen
below the dispatcher, so a trace sees nothing: a write through ``.data``
would be recorded as differentiable, and ``w.data = v`` would be lost.

:class:`TensorDataMode` makes them visible: a read is ``w.detach()`` (writes
through it are then writes with grad off that keep ``w``'s identity, as for
any detached alias), and ``w.data = v`` is ``w.copy_(v)`` under ``no_grad``
(a parameter or buffer mutation whose new value does not carry ``v``'s
autograd history).

That copy equals eager's storage swap only while no other tensor can tell
them apart, which :class:`StorageAliases` (an observer of every op) checks:

* a live alias of ``w`` (a view taken before, ``w.data`` kept, ``w``'s base)
  keeps the old storage in eager, but would read the copy: refused;
* after the swap ``w`` and ``v`` share one storage in eager: a later write to
  either while a tensor of the other is alive is refused, and so is a swap
  between two parameters/buffers/inputs (the caller's tensors would share
  memory after the call, which no program's signature can say).

Eager lets ``w.data = v`` change the shape or dtype of ``w``; a program's
state has fixed metadata, so that is refused, as is a change of device.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from .. import _torch_compat as tc
from ..errors import Refusal, UnsupportedError, user_source_line
from .observers import OpCall
from .saved_reads import SavedReads


def _is_data(func: Any, accessor: str) -> bool:
    return getattr(func, "__name__", None) == accessor and getattr(func, "__self__", None) is torch.Tensor.data


class StorageAliases:
    """Which traced tensors are alive, by storage, and the storages ``.data =`` joined.

    Holds weak references only: a tensor the model dropped is no alias any more.
    """

    __slots__ = ("_by_storage", "_inputs", "_joined")

    def __init__(self) -> None:
        self._by_storage: dict[Any, dict[int, weakref.ref]] = {}  # storage -> id -> tensor
        self._inputs: set[Any] = set()  # storages of graph inputs (parameters, buffers, user inputs)
        self._joined: list[tuple[Any, Any, str | None]] = []  # (storage of w, of v, line of w.data = v)

    def add_inputs(self, inputs: list[Any]) -> None:
        for t in inputs:
            if isinstance(t, tc.FunctionalTensor):
                self._track(t)
                self._inputs.add(tc.storage_key(t))

    def _track(self, t: Any) -> None:
        self._by_storage.setdefault(tc.storage_key(t), {})[id(t)] = weakref.ref(t)

    def alive(self, key: Any, besides: Any = None) -> bool:
        return any(r() is not None and r() is not besides for r in self._by_storage.get(key, {}).values())

    def before(self, call: OpCall) -> None:
        for w in call.written:
            key = tc.storage_key(w)
            for target, value, line in self._joined:
                other = value if key == target else target if key == value else None
                if other is not None and self.alive(other):
                    raise UnsupportedError(
                        f"a write (by {call.func}) to a tensor that `tensor.data = value` (at {line}) made "
                        "share its storage with another live tensor: eager's write changes both, a "
                        "functional program's one; assign a fresh value (`w.data = v.clone()`) or "
                        "write with copy_ (`w.data.copy_(v)`)",
                        kind=Refusal.DATA_ASSIGN_ALIASED, op=call.func, source=user_source_line())

    def after(self, call: OpCall, out: Any) -> None:
        for t in call.results(out):
            if isinstance(t, tc.FunctionalTensor):
                self._track(t)

    @staticmethod
    def same_place(target: Any, value: Any) -> bool:
        """``value`` is ``target``'s own memory, laid out alike (``t = w.data; t += s; w.data = t``)."""
        return (tc.storage_key(target) == tc.storage_key(value) and target.stride() == value.stride()
                and target.storage_offset() == value.storage_offset())

    def check_assign(self, target: Any, value: Any) -> None:
        """Refuse ``target.data = value`` where a copy would differ from eager's storage swap."""
        line = user_source_line()
        key, value_key = tc.storage_key(target), tc.storage_key(value)
        if self.alive(key, besides=target) or key == value_key:
            raise UnsupportedError(
                "`tensor.data = value` while another tensor shares the tensor's storage (a view taken "
                "before, a kept `.data`, or the tensor's base): in eager that alias keeps the old "
                "storage, in a functional program it would read the new value; assign before taking "
                "views, or write in place (`w.data.copy_(v)`) if the views should follow",
                kind=Refusal.DATA_ASSIGN_ALIASED, op="Tensor.data.__set__", source=line)
        if key in self._inputs and value_key in self._inputs:
            raise UnsupportedError(
                "`tensor.data = value` where both are parameters, buffers or inputs (or views of "
                "them): eager leaves the two sharing memory after the call, which a program's "
                "signature cannot carry; assign a copy (`w.data = v.clone()`)",
                kind=Refusal.DATA_ASSIGN_ALIASED, op="Tensor.data.__set__", source=line)

    def sharing(self, t: Any) -> set[Any]:
        """The storages that share memory with ``t``'s in eager: its own, and those a
        ``.data =`` joined to it (``x.data = v``: eager's ``v`` is ``x``'s memory after)."""
        key = tc.storage_key(t)
        return {key} | {v for w, v, _ in self._joined if w == key} | {w for w, v, _ in self._joined if v == key}

    def join(self, target: Any, value: Any) -> None:
        """After ``target.data = value`` (carried as a copy): eager's two share one storage."""
        self._joined.append((tc.storage_key(target), tc.storage_key(value), user_source_line()))


class HiddenWrites:
    """Writes autograd does not see, refused where eager's backward would read them.

    A write through ``.data`` bumps no version, so eager's backward of an op that
    saved the written storage (:class:`~predispatch_func.trace.saved_reads.SavedReads`)
    reads the write, silently. A program's backward reads the value the op was
    given. The two agree only when that value is a graph input itself, unwritten
    before the op: ``ep.module()`` then writes the new value back into the very
    tensor autograd saved, keeping its version (``program.runtime.write_back``), and the
    write-back guard must not hand the op a clone (:meth:`hidden_only_inputs`).
    Any other such write is refused.

    It also refuses a visible in-place write to an operand of ``while_loop`` or
    ``scan``: torch's backward of those two reads the operand as ``.data`` would,
    without a version check.
    """

    __slots__ = ("_saved", "_data", "_hidden", "_visible")

    def __init__(self, saved: SavedReads):
        self._saved = saved
        self._data: dict[int, weakref.ref] = {}  # `.data` aliases and views of them, by id
        self._hidden: set[Any] = set()  # storages written through `.data`
        self._visible: set[Any] = set()  # storages written otherwise

    def mark_data(self, t: Any) -> Any:
        self._data[id(t)] = weakref.ref(t)
        return t

    def _is_data(self, t: Any) -> bool:
        ref = self._data.get(id(t))
        return ref is not None and ref() is t

    def hidden_only_inputs(self) -> frozenset[int]:
        """Positions of the graph inputs written through ``.data`` and never otherwise."""
        return frozenset(i for key, i in self._saved.input_positions.items()
                         if key in self._hidden and key not in self._visible)

    def before(self, call: OpCall) -> None:
        for w in call.written:
            key = tc.storage_key(w)
            if not self._is_data(w):
                self._visible.add(key)
                self._refuse_unchecked(call, key)
                continue
            self._hidden.add(key)
            saver = self._saved.saved_by(key)
            if saver is not None:
                raise UnsupportedError(
                    f"a write through `.data` (by {call.func}) to a tensor that {saver} saved for "
                    "backward with grad on, at a value that is not a graph input's own: eager's backward of that op reads "
                    "the storage `.data` changed (no version bump), a program's reads the value it was "
                    "given; write through `.data` before that read, or under `torch.no_grad()` without "
                    "`.data` (eager then refuses the backward too)",
                    kind=Refusal.DATA_WRITE_AFTER_SAVED_READ, op=call.func, source=user_source_line())

    def after(self, call: OpCall, out: Any) -> None:
        if getattr(call.func, "is_view", False) and call.args and self._is_data(call.args[0]):
            for t in call.results(out):
                if isinstance(t, tc.FunctionalTensor):
                    self.mark_data(t)

    def refuse_assign_after_saved_read(self, target: Any) -> None:
        """``t.data = v`` on a graph input a kept composite read with grad on: eager swaps ``t``'s
        storage, but views of the old one that the composite's ops saved (``linear`` saves
        ``w.t()``) keep the old values, so its backward mixes both; a program's reads one value
        (found by the fuzzer). An op with its own backward saves the input itself, which follows
        the swap as the program's write-back does."""
        op = self._saved.saved_as_input_by(tc.storage_key(target))
        if op is not None:
            raise UnsupportedError(
                f"`tensor.data = value` on a tensor that {op} saved for backward with grad on: eager swaps the "
                "tensor's storage while views of the old one that the op saved keep the old values, so its "
                "backward mixes old and new values, which a program cannot; write in place instead "
                "(`t.data.copy_(value)`), or assign before the read",
                kind=Refusal.DATA_WRITE_AFTER_SAVED_READ, op="Tensor.data.__set__", source=user_source_line())

    def _refuse_unchecked(self, call: OpCall, key: Any) -> None:
        what = self._saved.read_unchecked_by(key)
        if what is not None:
            raise UnsupportedError(
                f"an in-place write (by {call.func}) to a tensor that {what} read with grad on: torch's "
                f"{what} backward reads its operands without autograd's version check, so eager's gradient "
                "silently uses the written value (an op's backward would raise instead), which a program, "
                "whose backward reads the value the call was given, cannot reproduce; write to a clone",
                kind=Refusal.WRITE_AFTER_UNCHECKED_HOP_READ, op=call.func, source=user_source_line())


class TensorDataMode(TorchFunctionMode):
    """Turns ``.data`` reads into ``detach()`` and ``.data = v`` into a no_grad ``copy_``."""

    def __init__(self, aliases: StorageAliases, hidden_writes: HiddenWrites | None):
        super().__init__()
        self._aliases = aliases
        self._hidden_writes = hidden_writes

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
        if _is_data(func, "__get__"):
            alias = args[0].detach()
            return self._hidden_writes.mark_data(alias) if self._hidden_writes is not None else alias
        if _is_data(func, "__set__"):
            target, value = args
            if not isinstance(value, torch.Tensor) or (target.shape, target.dtype, target.device) != (
                    value.shape, value.dtype, value.device):
                raise UnsupportedError(
                    f"`tensor.data = value` changes the tensor from {target.dtype}{list(target.shape)} to "
                    f"{getattr(value, 'dtype', type(value).__name__)}{list(getattr(value, 'shape', []))}: "
                    "a program's state keeps its shape and dtype; assign a value of the same shape and "
                    "dtype (or register a buffer of the new shape in __init__)",
                    kind=Refusal.DATA_ASSIGN_NEW_METADATA, op="Tensor.data.__set__", source=user_source_line())
            traced = isinstance(target, tc.FunctionalTensor) and isinstance(value, tc.FunctionalTensor)
            if traced and self._aliases.same_place(target, value):
                return None  # `w.data += s` assigns w's own alias back: eager's swap changes nothing
            if traced:
                self._aliases.check_assign(target, value)
                if self._hidden_writes is not None:
                    self._hidden_writes.refuse_assign_after_saved_read(target)
            with torch.no_grad():  # through a `.data` alias: a hidden write, as eager's swap is
                alias = target.detach()
                if traced and self._hidden_writes is not None:
                    self._hidden_writes.mark_data(alias)
                alias.copy_(value)
            if traced:
                self._aliases.join(target, value)
            return None
        return func(*args, **(kwargs or {}))
