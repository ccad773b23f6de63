"""Tensor attributes the model assigns in ``forward``, warned about as torch.export warns.

A plain tensor attribute (``self.t = torch.ones(2)``, or one held in a list or
dict attribute) is a constant of the program: the program keeps the value the
trace read. torch.export warns that ``self.t = self.t + 1`` in ``forward`` is
not carried; ours gives the same warning (same class, same text) so a pipeline
that watches for it keeps working, and the state guard then judges the write
(refused by default where later eager calls differ, state_guard.py).
Registering the tensor as a buffer makes the write part of the program.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import torch

# nn.Module's own bookkeeping (parameters, buffers, submodules, hook tables, training)
_MODULE_INTERNALS = frozenset(vars(torch.nn.Module())) | {"_initialize_hook", "_load_hook"}
_DEPTH = 4  # containers nested deeper than this are not searched


@contextlib.contextmanager
def warning_on_assigned_tensor_attributes(mod: torch.nn.Module) -> Iterator[None]:
    """Around the model's call: warn about tensor attributes assigned during it."""
    before = _attributes(mod)
    yield
    assigned = [path for name, attrs in _attributes(mod).items()
                for path in _assigned(f"self.{name}." if name else "self.", before.get(name, {}), attrs)]
    if assigned:
        noun, verb = ("attributes", "were") if len(assigned) > 1 else ("attribute", "was")
        warnings.warn(
            f"The tensor {noun} {', '.join(assigned)} {verb} assigned during export. Such attributes must be "
            "registered as buffers using the `register_buffer` API "
            "(https://pytorch.org/docs/stable/generated/torch.nn.Module.html#torch.nn.Module.register_buffer).",
            stacklevel=2)


def _attributes(mod: torch.nn.Module) -> dict[str, dict[str, Any]]:
    return {name: {k: _copied(v, 0) for k, v in vars(m).items() if k not in _MODULE_INTERNALS}
            for name, m in mod.named_modules()}


def _copied(value: Any, depth: int) -> Any:
    """Containers copied (their items are what is compared), everything else as it is."""
    if depth >= _DEPTH:
        return value
    if type(value) in (list, tuple):
        return type(value)(_copied(v, depth + 1) for v in value)
    if type(value) is dict:
        return {k: _copied(v, depth + 1) for k, v in value.items()}
    return value


def _assigned(prefix: str, before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    found: list[str] = []
    for key in sorted(before.keys() | after.keys(), key=str):
        _compare(f"{prefix}{key}", before.get(key), after.get(key), found)
    return found


def _compare(path: str, old: Any, new: Any, found: list[str]) -> None:
    if old is new:
        return
    if isinstance(new, torch.Tensor):
        found.append(path)
    elif isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(old.keys() | new.keys(), key=str):
            _compare(f"{path}[{key!r}]", old.get(key), new.get(key), found)
    elif isinstance(old, (list, tuple)) and isinstance(new, (list, tuple)):
        for i in range(max(len(old), len(new))):
            _compare(f"{path}[{i}]", old[i] if i < len(old) else None, new[i] if i < len(new) else None, found)
