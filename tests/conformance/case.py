"""One conformance case, and the small pieces suites build cases from."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import itertools
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils import _pytree as pytree


class NotApplicable(Exception):
    """The database has no such sample, or it does not fit the variant (e.g. an
    in-place op whose result dtype cannot be written into its input)."""


@dataclasses.dataclass
class Case:
    """A model, its inputs, and how to judge it."""

    name: str
    model: torch.nn.Module
    args: tuple
    kwargs: dict = dataclasses.field(default_factory=dict)
    dynamic_shapes: Any = None
    check_values: bool = True
    check_grads: bool = True


@contextlib.contextmanager
def seeded(name: str) -> Iterator[None]:
    """Draw under a seed derived from ``name``, leaving the caller's RNG alone."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(zlib.crc32(name.encode()))
        yield


class Call(torch.nn.Module):
    """``fn(*args, **kwargs)`` with every tensor of the call a forward input.

    Non-tensor arguments are constants of the module; tensors come in flat, in
    pytree order, so both exporters see plain positional tensor inputs.
    """

    def __init__(self, fn: Callable, args: tuple, kwargs: dict, returns: Callable | None = None):
        super().__init__()
        self.fn = fn
        self.returns = returns
        leaves, self.spec = pytree.tree_flatten((args, kwargs))
        self.is_tensor = [isinstance(v, torch.Tensor) for v in leaves]
        self.constants = [None if t else v for v, t in zip(leaves, self.is_tensor)]

    def tensors_of(self, args: tuple, kwargs: dict) -> tuple:
        return tuple(v for v in pytree.tree_leaves((args, kwargs)) if isinstance(v, torch.Tensor))

    def call_args(self, tensors: tuple) -> tuple[tuple, dict]:
        it = iter(tensors)
        leaves = [next(it) if t else c for t, c in zip(self.is_tensor, self.constants)]
        return pytree.tree_unflatten(leaves, self.spec)

    def forward(self, *tensors):
        args, kwargs = self.call_args(tensors)
        result = self.fn(*args, **kwargs)
        return self.returns(result, args, kwargs) if self.returns else result


def fresh(value: Any, requires_grad: bool | None = None) -> Any:
    """Detached copies of every tensor (``requires_grad`` kept unless given)."""
    def one(t: torch.Tensor) -> torch.Tensor:
        wants = t.requires_grad if requires_grad is None else requires_grad
        c = t.detach().clone()
        return c.requires_grad_(wants and (c.is_floating_point() or c.is_complex()))
    return pytree.tree_map_only(torch.Tensor, one, value)


def first(samples: Any, n: int) -> list:
    """The first ``n`` samples; the generator is closed now, not finalised later
    inside someone's trace (where its ``no_grad`` exit would be recorded)."""
    out = list(itertools.islice(samples, n))
    if hasattr(samples, "close"):
        samples.close()
        gc.collect()  # generators the closed one held in reference cycles
    return out
