"""Deep copies of a model that holds tensors of its last call.

The usual order is run, then export: a model called once with grad on keeps
what it stored of that call (torchvision raft's ``corr_pyramid``, transformers
recurrent_gemma's ``recurrent_states``), and those tensors carry autograd
history. ``copy.deepcopy`` refuses them ("Only Tensors created explicitly by
the user (graph leaves) support the deepcopy protocol"), so whatever copies the
model to call it (the Python-state judge, :mod:`.python_state`) would give up.

A copy that is only called needs the values, not the history of a call that is
over: each such tensor is copied detached, through ``deepcopy``'s memo, so
everything else is copied as ``deepcopy`` would::

    copy = deepcopy_without_history(model)    # model.corr_pyramid[0].grad_fn is set
    copy.corr_pyramid[0].grad_fn               # None; same values

``deepcopy`` also shares functions: a ``forward`` (or a hook) set on the instance as a
closure over the model (``m.forward = lambda x: M.forward(m, x)``) would run the
caller's model from the copy, and write its tensors. The copy's closures over what was
copied are rebuilt over the copies (:func:`rebind_closures`).
"""

from __future__ import annotations

import copy
import types
from typing import Any

import torch

_DEPTH = 4  # containers and plain objects looked into below a module attribute


def deepcopy_without_history(obj: Any, memo: dict[int, Any] | None = None) -> Any:
    """``copy.deepcopy(obj, memo)``, where each tensor with autograd history that a module
    of ``obj`` holds (in an attribute, a container or a plain object, a few levels down)
    is copied detached; ``memo`` as ``deepcopy``'s (entries already there win)."""
    memo = {} if memo is None else memo
    first_try = dict(memo)
    try:  # most models hold no such tensor: deepcopy alone, without the walk that finds them
        copied = copy.deepcopy(obj, first_try)
    except RuntimeError:  # deepcopy's refusal of a non-leaf (or the same failure again below)
        for t in tensors_with_history(obj):
            memo.setdefault(id(t), t.detach().clone())
        copied = copy.deepcopy(obj, memo)
    else:
        memo.update(first_try)
    rebind_closures(copied, memo)
    return copied


_HOOK_TABLES = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
                "_state_dict_hooks", "_load_state_dict_pre_hooks")


def rebind_closures(copied: Any, memo: dict[int, Any]) -> None:
    """Point the closures that ``copied``'s modules hold as instance attributes (a ``forward``
    set on the instance, hooks) at the copies ``memo`` records of the objects they captured."""
    if not isinstance(copied, torch.nn.Module):
        return
    for module in copied.modules():
        attrs = vars(module)
        for name, value in list(attrs.items()):
            if isinstance(value, types.FunctionType):
                attrs[name] = _rebound(value, memo)
        for table in _HOOK_TABLES:
            hooks = attrs.get(table)
            if not isinstance(hooks, dict):
                continue
            for key, hook in list(hooks.items()):
                if isinstance(hook, types.FunctionType):
                    hooks[key] = _rebound(hook, memo)


def _rebound(fn: types.FunctionType, memo: dict[int, Any]) -> types.FunctionType:
    """``fn`` with each captured object that ``memo`` copied replaced by its copy (``fn`` itself
    when it captured none)."""
    cells = []
    for cell in fn.__closure__ or ():
        try:
            held = cell.cell_contents
        except ValueError:  # a cell not filled yet
            cells.append(cell)
            continue
        copied = memo.get(id(held), held)
        cells.append(cell if copied is held else types.CellType(copied))
    if all(new is old for new, old in zip(cells, fn.__closure__ or ())):
        return fn
    rebound = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, tuple(cells))
    rebound.__kwdefaults__ = fn.__kwdefaults__
    rebound.__qualname__, rebound.__doc__ = fn.__qualname__, fn.__doc__
    rebound.__dict__.update(fn.__dict__)
    return rebound


def tensors_with_history(obj: Any) -> list[torch.Tensor]:
    """The tensors ``deepcopy`` refuses (non-leaves) among what ``obj``'s modules hold."""
    found: dict[int, torch.Tensor] = {}
    seen: set[int] = set()
    roots = list(obj.modules()) if isinstance(obj, torch.nn.Module) else [obj]
    for root in roots:
        held = vars(root) if isinstance(root, torch.nn.Module) else {"": root}
        for name, value in held.items():
            if name != "_modules":
                _look_into(value, found, seen, 0)
    return list(found.values())


def _look_into(value: Any, found: dict[int, torch.Tensor], seen: set[int], depth: int) -> None:
    if isinstance(value, torch.Tensor):
        if not value.is_leaf:
            found[id(value)] = value
        return
    if depth >= _DEPTH or id(value) in seen or _opaque(value):
        return
    seen.add(id(value))
    if isinstance(value, dict):
        members: Any = value.values()
    elif isinstance(value, (list, tuple, set, frozenset)):
        members = value
    elif hasattr(value, "__dict__"):
        members = vars(value).values()
    else:
        return
    for member in list(members):
        _look_into(member, found, seen, depth + 1)


def _opaque(value: Any) -> bool:
    """Values whose insides are no state of the model's call (modules are walked on their own)."""
    return value is None or isinstance(value, (torch.nn.Module, type, types.FunctionType, types.MethodType,
                                               types.ModuleType, str, bytes, int, float, bool))
