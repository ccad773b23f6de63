"""Fake-ify inputs: real (or meta) tensors become FakeTensors sharing one ShapeEnv.

State is always static. A user input dimension is symbolic only where
``dynamic_shapes`` (torch.export's format: per argument, a dict or sequence
mapping dim index -> ``torch.export.Dim``) says so.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from . import _torch_compat as tc


class Fakeifier:
    """One fake mode per export; remembers which user dims are dynamic."""

    def __init__(self, dynamic_shapes: Any, mod: torch.nn.Module, args: tuple, kwargs: dict):
        self.mode = tc.FakeTensorMode(shape_env=tc.ShapeEnv(), allow_non_fake_inputs=True)
        self._dims_per_leaf = _dynamic_dims_per_leaf(dynamic_shapes, mod, args, kwargs)
        self._user_index = 0
        self._dims: dict[Any, Any] = {}

    def state(self, t: Any) -> Any:
        return self.mode.from_tensor(t, static_shapes=True) if isinstance(t, torch.Tensor) else t

    def user(self, slot_index: int, value: Any) -> Any:
        leaf = self._user_index
        self._user_index += 1
        if not isinstance(value, torch.Tensor):
            return value
        dims = self._dims_per_leaf[leaf] if leaf < len(self._dims_per_leaf) else None
        if not dims:
            return self.mode.from_tensor(value, static_shapes=True)
        return tc.fake_with_dynamic_dims(self.mode, value, dims, self._dims)

    def range_constraints(self, gm: torch.fx.GraphModule) -> dict[Any, Any]:
        return tc.range_constraints_of(gm, self.mode)


def _dynamic_dims_per_leaf(dynamic_shapes: Any, mod: torch.nn.Module, args: tuple,
                           kwargs: dict) -> list[dict[int, Any] | None]:
    """For every flat user input leaf, {dim index: Dim} or None."""
    flat, _ = tc.pytree.tree_flatten((args, kwargs))
    if dynamic_shapes is None:
        return [None] * len(flat)
    if isinstance(dynamic_shapes, dict):
        try:
            bound = inspect.signature(mod.forward).bind(*args, **kwargs).arguments
        except (TypeError, ValueError):
            bound = {}
        names = list(bound)
        positional = tuple(dynamic_shapes.get(n) for n in names[: len(args)])
        keyword = {k: dynamic_shapes.get(k) for k in kwargs}
        spec = (positional, keyword)
    else:
        spec = (tuple(dynamic_shapes), {})
    out: list[dict[int, Any] | None] = []
    _collect(spec, (args, kwargs), out)
    return out


def _collect(spec: Any, value: Any, out: list) -> None:
    if isinstance(value, torch.Tensor):
        if spec is None:
            out.append(None)
        elif isinstance(spec, dict):
            out.append(dict(spec))
        else:
            out.append({i: d for i, d in enumerate(spec) if d is not None})
        return
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _collect(spec[i] if isinstance(spec, (list, tuple)) and i < len(spec) else None, v, out)
        return
    if isinstance(value, dict):
        for k, v in value.items():
            _collect(spec.get(k) if isinstance(spec, dict) else None, v, out)
        return
    leaves = tc.pytree.tree_leaves(value)
    out.extend([None] * len(leaves))
