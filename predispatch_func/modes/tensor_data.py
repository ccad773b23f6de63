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
from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode

from .. import _torch_compat as tc
from ..errors import Refusal, UnsupportedError, user_source_line
from ..autograd_facts import Fact, has, may_carry_grad, saved_operands
from .observers import OpCall
from .out_variants import out_argument_names


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

    def join(self, target: Any, value: Any) -> None:
        """After ``target.data = value`` (carried as a copy): eager's two share one storage."""
        self._joined.append((tc.storage_key(target), tc.storage_key(value), user_source_line()))


class HiddenWrites:
    """Writes through ``.data`` after an op recorded with grad read the tensor written.

    ``.data`` bumps no version, so eager's backward of that op reads the written
    storage, silently. A program's backward reads the value the op was given.
    The two agree only when that value is a graph input itself, unwritten
    before the op: ``ep.module()`` then writes the new value back into the very
    tensor autograd saved, keeping its version (``export.write_back``), and the
    write-back guard must not hand the op a clone (:meth:`hidden_only_inputs`).
    Any other such write is refused. An op none of whose results can carry a
    gradient (a comparison, ``argmax``) has no backward: its reads save nothing.

    It also refuses a visible in-place write to an operand of ``while_loop`` or
    ``scan`` (:meth:`note_unchecked_read`): torch's backward of those two reads
    the operand as ``.data`` would, without a version check.
    """

    __slots__ = ("_may_need_grad", "_inputs", "_data", "_read_stale", "_maybe_saved", "_read_unchecked", "_hidden",
                 "_visible", "_saves_result", "_maybe_saved_inputs", "_read_as_input")

    def __init__(self, may_need_grad: Callable[[Any], bool]):
        self._may_need_grad = may_need_grad
        self._inputs: dict[Any, int] = {}  # storage of each graph input -> its position
        self._data: dict[int, weakref.ref] = {}  # `.data` aliases and views of them, by id
        self._read_stale: dict[Any, Any] = {}  # storage -> the op of such a read
        self._maybe_saved: dict[int, list[Any]] = {}  # by id(call): storages read, kept if the op saved them
        self._read_unchecked: dict[Any, str] = {}  # storage -> the HOP whose backward reads it without a version check
        self._hidden: set[Any] = set()  # storages written through `.data`
        self._visible: set[Any] = set()  # storages written otherwise
        self._saves_result: dict[Any, bool] = {}  # op -> self._may_save_result(op)
        self._maybe_saved_inputs: dict[int, list[Any]] = {}  # by id(call): graph inputs read as they are
        self._read_as_input: dict[Any, Any] = {}  # storage of such an input -> the op whose backward reads it

    def add_inputs(self, inputs: list[Any]) -> None:
        for i, t in enumerate(inputs):
            if isinstance(t, tc.FunctionalTensor):
                self._inputs.setdefault(tc.storage_key(t), i)

    def mark_data(self, t: Any) -> Any:
        self._data[id(t)] = weakref.ref(t)
        return t

    def _is_data(self, t: Any) -> bool:
        ref = self._data.get(id(t))
        return ref is not None and ref() is t

    def hidden_only_inputs(self) -> frozenset[int]:
        """Positions of the graph inputs written through ``.data`` and never otherwise."""
        return frozenset(i for key, i in self._inputs.items() if key in self._hidden and key not in self._visible)

    def before(self, call: OpCall) -> None:
        self._maybe_saved.pop(id(call), None)  # left by an op whose dispatch raised (and the model caught)
        self._maybe_saved_inputs.pop(id(call), None)
        for w in call.written:
            key = tc.storage_key(w)
            if not self._is_data(w):
                self._visible.add(key)
                self._refuse_unchecked(call, key)
                continue
            self._hidden.add(key)
            if key in self._read_stale:
                raise UnsupportedError(
                    f"a write through `.data` (by {call.func}) to a tensor that {self._read_stale[key]} saved for "
                    "backward with grad on, at a value that is not a graph input's own: eager's backward of that op reads "
                    "the storage `.data` changed (no version bump), a program's reads the value it was "
                    "given; write through `.data` before that read, or under `torch.no_grad()` without "
                    "`.data` (eager then refuses the backward too)",
                    kind=Refusal.DATA_WRITE_AFTER_SAVED_READ, op=call.func, source=user_source_line())
        if not call.grad or has(call.func, Fact.SAVES_NO_INPUT) or getattr(call.func, "is_view", False):
            return  # a view's backward reads sizes only
        tensors = [t for t in call.tensors_read() if isinstance(t, tc.FunctionalTensor)]
        if not any(self._may_need_grad(t) for t in tensors):
            return  # no autograd history: nothing saved
        read = [t for t in tensors if all(t is not w for w in call.written)]
        saves_only = saved_operands(call.func)
        if saves_only is not None:
            kept = saves_only(call.args, self._may_need_grad)
            read = [t for t in read if any(t is k for k in kept)]
        # what the op saves if a result can carry a gradient (known in `after`), at the values
        # it reads now: a graph input unwritten so far is saved as the input itself
        keys = [(tc.storage_key(t), t) for t in read]
        self._maybe_saved[id(call)] = [key for key, t in keys if key not in self._read_stale
                                       and (key not in self._inputs or tc.storage_mutation_count(t) != 0)]
        self._maybe_saved_inputs[id(call)] = [key for key, t in keys
                                              if key in self._inputs and tc.storage_mutation_count(t) == 0]

    def refuse_assign_after_saved_read(self, target: Any) -> None:
        """``t.data = v`` on a graph input a kept composite read with grad on: eager swaps ``t``'s
        storage, but views of the old one that the composite's ops saved (``linear`` saves
        ``w.t()``) keep the old values, so its backward mixes both; a program's reads one value
        (found by the fuzzer). An op with its own backward saves the input itself, which follows
        the swap as the program's write-back does."""
        op = self._read_as_input.get(tc.storage_key(target))
        if op is not None:
            raise UnsupportedError(
                f"`tensor.data = value` on a tensor that {op} saved for backward with grad on: eager swaps the "
                "tensor's storage while views of the old one that the op saved keep the old values, so its "
                "backward mixes old and new values, which a program cannot; write in place instead "
                "(`t.data.copy_(value)`), or assign before the read",
                kind=Refusal.DATA_WRITE_AFTER_SAVED_READ, op="Tensor.data.__set__", source=user_source_line())

    def note_unchecked_read(self, what: str, operands: list[Any]) -> None:
        """A HOP whose eager backward reads its operands without autograd's version check
        (``while_loop``, ``scan`` in torch 2.13): after an in-place write to one, eager's
        gradient silently uses the written value, which a program cannot."""
        if torch.is_grad_enabled() and any(self._may_need_grad(t) for t in operands):
            for t in operands:
                if isinstance(t, tc.FunctionalTensor):
                    self._read_unchecked.setdefault(tc.storage_key(t), what)

    def _refuse_unchecked(self, call: OpCall, key: Any) -> None:
        what = self._read_unchecked.get(key)
        if what is not None:
            raise UnsupportedError(
                f"an in-place write (by {call.func}) to a tensor that {what} read with grad on: torch 2.13's "
                f"{what} backward reads its operands without autograd's version check, so eager's gradient "
                "silently uses the written value (an op's backward would raise instead), which a program, "
                "whose backward reads the value the call was given, cannot reproduce; write to a clone",
                kind=Refusal.WRITE_AFTER_UNCHECKED_HOP_READ, op=call.func, source=user_source_line())

    def note_opaque_read(self, what: str, operands: list[Any], *, keeps_inputs: bool) -> None:
        """A call the mode does not see as one op read ``operands`` with grad on: a torch HOP
        (``scan``, ``cond``, ...), whose rule may hand its body a copy even of a graph input
        (``scan`` clones its ``xs``), or a custom autograd.Function, whose backward reads the
        very input tensors it saved (``keeps_inputs``) but copies of anything else."""
        tensors = [t for t in operands if isinstance(t, tc.FunctionalTensor)]
        if not torch.is_grad_enabled() or not any(self._may_need_grad(t) for t in tensors):
            return
        for t in tensors:
            key = tc.storage_key(t)
            if keeps_inputs and key in self._inputs and tc.storage_mutation_count(t) == 0:
                continue
            self._read_stale.setdefault(key, what)

    def after(self, call: OpCall, out: Any) -> None:
        if getattr(call.func, "is_view", False) and call.args and self._is_data(call.args[0]):
            for t in call.results(out):
                if isinstance(t, tc.FunctionalTensor):
                    self.mark_data(t)
        saved = self._maybe_saved.pop(id(call), None)
        saved_inputs = self._maybe_saved_inputs.pop(id(call), ())
        if saved is not None and self._has_backward(call, out):
            for key in saved:
                self._read_stale.setdefault(key, call.func)  # no source line here: this runs for most ops
            if isinstance(call.func, tc.OpOverload) and tc.has_composite_implicit_kernel(call.func):
                for key in saved_inputs:  # a kept composite: its autograd may save views of the input
                    self._read_as_input.setdefault(key, call.func)
            if self._may_save_result(call.func):  # its backward may read its result: saved too
                for t in call.results(out):
                    if isinstance(t, tc.FunctionalTensor) and may_carry_grad(t):
                        self._read_stale.setdefault(tc.storage_key(t), f"{call.func} (as its result)")

    def _may_save_result(self, op: Any) -> bool:
        """Whether ``op``'s backward may read its result: not for the ops known to (autograd_facts.Fact.SAVES_NO_RESULT),
        views (a view's backward reads sizes only) or ``out=`` overloads (no autograd)."""
        known = self._saves_result.get(op)
        if known is None:
            known = self._saves_result[op] = not (
                has(op, Fact.SAVES_NO_RESULT) or getattr(op, "is_view", False) or not isinstance(op, tc.OpOverload)
                or out_argument_names(op))
        return known

    @staticmethod
    def _has_backward(call: OpCall, out: Any) -> bool:
        """Whether autograd recorded ``call`` as one op that may save what it read: not for
        a comparison's bool result, an index or ``.item()`` (no result carries a gradient),
        nor for an op that wrote nothing and returned an input as it is (``sum_to_size`` to
        its own size: no autograd node), nor for a decomposed op (its ops save what they
        read, and each came through here)."""
        results = [*call.results(out), *call.written]
        read = call.tensors_read()
        returned_an_input = not call.written and all(
            any(r is t for t in read) for r in results if isinstance(r, torch.Tensor))
        return not call.decomposed and not returned_an_input and any(may_carry_grad(t) for t in results)


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
