"""Eager runs on copies of a model must never touch the caller's model.

The Python-state judge and ``pf.verify`` call deep copies of the model. A copy is
self-contained when ``forward`` reaches the model through ``self``; one that reaches
it another way (a global name, a function closing over the model that ``deepcopy``
shares: ``m.forward = lambda x: M.forward(model, x)``) would compute with the caller's
tensors and write them. A torch function mode watches those runs and stops the first
call that is handed one of the caller's tensors, before anything is written.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode


class ReachedTheCallersModel(RuntimeError):
    """A copy's run met a tensor of the caller's model or inputs."""


class CallersTensorsTripwire(TorchFunctionMode):
    """Raises :class:`ReachedTheCallersModel` at the first torch call given one of ``tensors``."""

    def __init__(self, tensors: Iterable[torch.Tensor]) -> None:
        super().__init__()
        self._ids = {id(t) for t in tensors}

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        # torch.compile traces active modes (torch 2.11/2.12 run flex_attention and cond in
        # eager that way) and cannot trace id(); the compiled region only sees tensors already
        # checked on their way in, so the check is skipped there.
        if torch.compiler.is_compiling():
            return func(*args, **(kwargs or {}))
        if any(self._caller_s(a) for a in args) or (kwargs and any(self._caller_s(v) for v in kwargs.values())):
            raise ReachedTheCallersModel(
                "a copy of the model reached the caller's tensors: forward or a hook refers to the model "
                "other than through `self` (a global, a closure); make it a method")
        return func(*args, **(kwargs or {}))

    def _caller_s(self, value: Any) -> bool:
        if isinstance(value, (list, tuple)):
            return any(id(v) in self._ids for v in value)
        return id(value) in self._ids


def callers_tensors(model: torch.nn.Module, inputs: Any, leaves: Any) -> list[torch.Tensor]:
    """The model's parameters and buffers and the tensors among ``inputs``' leaves."""
    return [*model.parameters(), *model.buffers(), *(t for t in leaves(inputs) if isinstance(t, torch.Tensor))]


__all__ = ["CallersTensorsTripwire", "ReachedTheCallersModel", "callers_tensors"]
