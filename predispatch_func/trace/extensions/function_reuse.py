"""A custom Function's traced bodies reused for its later calls within one export.

A model calls the same Function once per layer (BLOOM's ``GeLUFunction``, one call a
block), each time on operands of the same metadata; tracing its forward and backward
through our pipeline at every call was over a third of such an export. A later call
takes a copy of the first call's two subgraphs (each HOP call owns its bodies) when
nothing they could depend on differs:

- the class, each operand's shape, strides, dtype, device and ``needs_input_grad``,
  the non-tensor arguments (plain values only: numbers, strings, dtypes, devices,
  ``None``, tuples of them), the grad mode, autocast's state and the trace's settings;
- the Python state its code names: the globals and closure values read by ``forward``,
  ``setup_context`` and ``backward`` (and by the plain functions those name, one level
  down) are the same objects, equal where they are plain values, and the class's own
  attributes are the same objects. A first trace that changed any of them (a Function
  that counts its calls) is not reused.

Never reused: operands or arguments with symbolic sizes (a body's graph holds the
symbols of its own trace), a body with random draws or symbolic values, and a Function
whose code names anything but modules, functions, classes and plain values (an object's
attributes, a container's items or a tensor's data could change between two calls). A
module's or class's attributes are assumed not to change between two calls of one forward.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import types
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch

from ... import _torch_compat as tc
from ...graphs import all_graph_modules

_T = TypeVar("_T")

_PLAIN = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)
# what a Function's code may name and still be reused: values compared by identity whose
# contents do not change while a forward runs (an object's attributes, a dict's items might)
_STABLE = (types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodWrapperType,
           types.WrapperDescriptorType, types.MethodDescriptorType, type)


@dataclasses.dataclass(frozen=True)
class _Entry:
    state: tuple  # the Python state snapshot the bodies were traced under
    traced: Any  # what the first call's trace returned


_caches: list[dict[tuple, _Entry]] = []


@contextlib.contextmanager
def reuse_within() -> Iterator[None]:
    """Traced bodies are reused until the block ends (one export's outermost trace)."""
    _caches.append({})
    try:
        yield
    finally:
        _caches.pop()


def reused_or_traced(cls: type, operands: list[Any], needs_input_grad: tuple, leaves: tuple, spec: Any,
                     settings: Any, trace: Callable[[], _T], copied: Callable[[_T], _T],
                     graphs: Callable[[_T], list[torch.fx.GraphModule]]) -> _T:
    """``trace()``, or a ``copied`` earlier result of it for a call nothing distinguishes.
    ``graphs`` names the subgraphs of a result (checked for draws and symbols)."""
    key = _call_key(cls, operands, needs_input_grad, leaves, spec, settings) if _caches else None
    state = _state_read_by(cls) if key is not None else None
    if key is None or state is None:
        return trace()
    cache = _caches[-1]
    entry = cache.get(key)
    if entry is not None and entry.state == state:
        return copied(entry.traced)
    traced = trace()
    if _state_read_by(cls) == state and all(_replayable(gm) for gm in graphs(traced)):
        cache[key] = _Entry(state, traced)
    return traced


def copy_graph_module(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy of ``gm`` and its subgraphs whose nodes keep the original values and whose
    tensor attributes are the original tensors (neither is copied: they are the same values)."""
    memo: dict[int, Any] = {}
    for _, sub in all_graph_modules(gm):
        for value in [*vars(sub).values(), *sub.parameters(recurse=False), *sub.buffers(recurse=False)]:
            if isinstance(value, torch.Tensor):
                memo[id(value)] = value
        for node in sub.graph.nodes:
            for value in tc.pytree.tree_leaves(node.meta.get("val")):
                memo[id(value)] = value
    return copy.deepcopy(gm, memo)


def _call_key(cls: type, operands: list[Any], needs_input_grad: tuple, leaves: tuple, spec: Any,
              settings: Any) -> tuple | None:
    metas = []
    for t in operands:
        sizes = (*t.shape, *t.stride(), t.storage_offset())
        if any(not isinstance(s, int) for s in sizes):
            return None
        metas.append((tuple(t.shape), t.stride(), t.storage_offset(), t.dtype, t.device, t.requires_grad))
    plain = []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            continue
        value = _plain(leaf)
        if value is None:
            return None
        plain.append(value)
    return (cls, tuple(metas), needs_input_grad, tuple(plain), spec, _Same(settings), torch.is_grad_enabled(),
            tuple(sorted(tc.autocast_state().items())), torch.is_autocast_cache_enabled())


class _Same:
    """An object in a key by identity (kept alive by the key, so its id is not reused)."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Same) and other.value is self.value

    def __hash__(self) -> int:
        return id(self.value)


def _plain(value: Any) -> tuple | None:
    """``value`` as a key (its type beside it: ``1``, ``1.0`` and ``True`` differ), or None."""
    if isinstance(value, tuple):
        items = [_plain(v) for v in value]
        return None if any(i is None for i in items) else (tuple, tuple(items))
    if isinstance(value, _PLAIN):
        return (type(value), value)
    return None


def _state_read_by(cls: type) -> tuple | None:
    """What ``cls``'s code can read of Python state, as a comparable snapshot; None where it
    names something whose contents cannot be guarded."""
    functions = [f for f in (_function(cls, name) for name in ("forward", "setup_context", "backward"))
                 if f is not None]
    seen: dict[str, Any] = {}
    for depth in range(2):
        named: list[types.FunctionType] = []
        for f in functions:
            for name, value in _names_read(f):
                if not isinstance(value, _STABLE) and _plain(value) is None:
                    return None
                seen[f"{f.__qualname__}:{name}"] = value
                if depth == 0 and isinstance(value, types.FunctionType):
                    named.append(value)
        functions = named
    attributes = tuple((k, id(v)) for k, v in vars(cls).items())
    return attributes + tuple(sorted((k, id(v), _plain(v)) for k, v in seen.items()))


def _function(cls: type, name: str) -> types.FunctionType | None:
    f = getattr(cls, name, None)
    f = getattr(f, "__func__", f)
    return f if isinstance(f, types.FunctionType) else None


def _names_read(f: types.FunctionType) -> Iterator[tuple[str, Any]]:
    """The globals (and builtins shadowed by none) and closure values ``f``'s code names."""
    for name in _code_names(f.__code__):
        if name in f.__globals__:
            yield name, f.__globals__[name]
    for name, cell in zip(f.__code__.co_freevars, f.__closure__ or ()):
        try:
            yield name, cell.cell_contents
        except ValueError:  # an empty cell
            continue


def _code_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names


def _replayable(gm: torch.fx.GraphModule) -> bool:
    """No random draw (its state is the trace's to track) and no symbolic value in ``gm``."""
    for _, sub in all_graph_modules(gm):
        for node in sub.graph.nodes:
            target = node.target
            if isinstance(target, tc.OpOverload) and torch.Tag.nondeterministic_seeded in target.tags:
                return False
            for value in tc.pytree.tree_leaves(node.meta.get("val")):
                if isinstance(value, torch.SymInt | torch.SymFloat | torch.SymBool):
                    return False
                if isinstance(value, torch.Tensor) and any(not isinstance(s, int) for s in value.shape):
                    return False
    return True


__all__ = ["copy_graph_module", "reuse_within", "reused_or_traced"]
