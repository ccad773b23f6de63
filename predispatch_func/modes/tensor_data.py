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
        for t in tc.pytree.tree_leaves(out):
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


class TensorDataMode(TorchFunctionMode):
    """Turns ``.data`` reads into ``detach()`` and ``.data = v`` into a no_grad ``copy_``."""

    def __init__(self, aliases: StorageAliases):
        super().__init__()
        self._aliases = aliases

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
        if _is_data(func, "__get__"):
            return args[0].detach()
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
            with torch.no_grad():
                target.copy_(value)
            if traced:
                self._aliases.join(target, value)
            return None
        return func(*args, **(kwargs or {}))
