"""Fake-ify inputs: real (or meta) tensors become FakeTensors sharing one ShapeEnv.

State is always static. A user input dimension is symbolic only where
``dynamic_shapes`` (torch.export's format: per argument, a dict or sequence
mapping dim index -> ``torch.export.Dim``) says so. Dims with the same name
are one symbol. After tracing, :meth:`Fakeifier.range_constraints` checks
that the model kept every declared dimension symbolic, within the declared
``[min, max]``, and returns the ranges the ExportedProgram promises.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import torch

from .. import _torch_compat as tc
from ..errors import DynamicShapesError, Refusal


@dataclasses.dataclass
class _DeclaredDim:
    """One named ``Dim`` (or an anonymous ``Dim.DYNAMIC``/``AUTO`` hint) and its symbol."""

    name: str
    lower: int
    upper: Any
    strict: bool  # a named Dim: the trace must honour its range exactly
    may_specialise: bool  # Dim.AUTO: the model may fix the size (as torch.export allows)
    size: torch.SymInt
    where: str


class Fakeifier:
    """One fake mode per export; remembers which user dims are dynamic."""

    def __init__(self, dynamic_shapes: Any, mod: torch.nn.Module, args: tuple, kwargs: dict):
        self.shape_env = tc.ShapeEnv()
        self.mode = tc.FakeTensorMode(shape_env=self.shape_env, allow_non_fake_inputs=True)
        self._dims_per_leaf = _dynamic_dims_per_leaf(dynamic_shapes, mod, args, kwargs)
        self._user_index = 0
        self._declared: dict[str, _DeclaredDim] = {}

    def state(self, t: Any) -> Any:
        return self.mode.from_tensor(t, static_shapes=True) if isinstance(t, torch.Tensor) else t

    def user(self, value: Any) -> Any:
        leaf = self._user_index
        self._user_index += 1
        spec = self._dims_per_leaf[leaf] if leaf < len(self._dims_per_leaf) else None
        if isinstance(spec, _IntDim) and not _is_static_hint(spec.dim):
            if _is_named_dim(spec.dim):  # torch.export refuses these too
                raise DynamicShapesError(f"user input {leaf} is an int: a named Dim cannot make it dynamic "
                                         "(as in torch.export); use Dim.AUTO or Dim.DYNAMIC",
                                         kind=Refusal.DYNAMIC_SHAPES_SPEC)
            symbol = tc.symbolic_int(self.mode, value, leaf)
            self._declare(spec.dim, symbol, f"user input {leaf} (an int)", value)
            return symbol
        if not isinstance(value, torch.Tensor):
            return value
        dims = spec
        dims = {i: d for i, d in (dims or {}).items() if not _is_static_hint(d)}
        if not dims:
            return self.mode.from_tensor(value, static_shapes=True)
        fake = tc.fake_with_dynamic_dims(self.mode, value, set(dims), leaf)
        for i, dim in dims.items():
            self._declare(dim, fake.shape[i], f"user input {leaf}, dim {i}", value.shape[i])  # type: ignore[arg-type]
        return fake

    def _declare(self, dim: Any, size: torch.SymInt, where: str, example: int) -> None:
        named = _is_named_dim(dim)
        auto = str(getattr(dim, "type", "")).endswith("AUTO")
        if not isinstance(size, torch.SymInt):  # torch specialises example sizes 0 and 1
            if auto:  # Dim.AUTO lets it: the program is static there, as torch.export's
                return
            raise DynamicShapesError(f"{where}: the example size is {example}, and torch specialises sizes 0 and 1; "
                                     "export with an example of size 2 or more for a dynamic dim (or use Dim.AUTO)",
                                     kind=Refusal.DIM_NOT_DYNAMIC)
        name = dim.__name__ if named else f"_dynamic_{len(self._declared)}"
        # a named Dim's range, or the bounds of a hint (Dim.AUTO(min=3, max=8)); None: unbounded
        lower = int(getattr(dim, "min", None) or 0)
        upper = tc.INT_OO if getattr(dim, "max", None) is None else dim.max
        if not lower <= example <= upper:
            raise DynamicShapesError(f"{where}: example size {example} is outside Dim {name!r} "
                                   f"range [{lower}, {upper}]", kind=Refusal.DYNAMIC_SHAPES_SPEC)
        if name in self._declared:  # same Dim name: same symbol
            tc.check(size == self._declared[name].size)
            return
        # tracing assumes sizes >= 2 (0/1 are generalised, as torch.export does)
        tc.narrow_symbol_range(self.shape_env, size.node.expr, max(2, lower), upper)
        self._declared[name] = _DeclaredDim(name, lower, upper, named, auto, size, where)

    def range_constraints(self, gm: torch.fx.GraphModule) -> dict[Any, Any]:
        """Symbol -> ValueRanges of the program; refuses a trace that narrowed a named Dim."""
        env = self.shape_env
        out: dict[Any, Any] = {}
        for d in self._declared.values():
            expr = d.size.node.expr
            if expr.is_number and d.may_specialise:
                continue
            if expr.is_number:
                raise DynamicShapesError(
                    f"Dim {d.name!r} ({d.where}) was declared dynamic but the model specialised it "
                    f"to {int(expr)}; make it static or remove the code that fixes it", kind=Refusal.DIM_NOT_DYNAMIC)
            if len(expr.free_symbols) != 1 or expr not in expr.free_symbols:
                raise DynamicShapesError(f"Dim {d.name!r} ({d.where}) became the expression {expr}; "
                                       "derived dims are not supported", kind=Refusal.DIM_NOT_DYNAMIC)
            traced = tc.symbol_range(env, expr)
            if d.strict and (traced.upper < d.upper or traced.lower > max(2, d.lower)):
                raise DynamicShapesError(
                    f"Dim {d.name!r} ({d.where}) was declared [{d.lower}, {d.upper}] but the model "
                    f"only supports [{traced.lower}, {traced.upper}]; declare "
                    f"Dim({d.name!r}, min={max(d.lower, int(traced.lower))}, max={traced.upper})",
                    kind=Refusal.DIM_NOT_DYNAMIC)
            lower = d.lower if traced.lower <= 2 else traced.lower
            out[expr] = tc.value_range(lower, traced.upper if not d.strict else d.upper)
        for node in gm.graph.nodes:  # any other symbol a placeholder carries
            if node.op != "placeholder" or not isinstance(node.meta.get("val"), torch.Tensor):
                continue
            for size in node.meta["val"].shape:
                if isinstance(size, torch.SymInt):
                    for sym in size.node.expr.free_symbols:
                        out.setdefault(sym, tc.symbol_range(env, sym))
        for node in gm.graph.nodes:  # unbacked symbols the program binds (a HOP's data-dependent
            for sym in node.meta.get("unbacked_bindings") or ():  # size): torch.export.load reads their ranges
                out.setdefault(sym, tc.symbol_range(env, sym))
        return out


def _is_named_dim(dim: Any) -> bool:
    return hasattr(dim, "__name__") and hasattr(dim, "min") and hasattr(dim, "max")


def _is_static_hint(dim: Any) -> bool:
    return dim is None or isinstance(dim, int) or str(getattr(dim, "type", "")).endswith("STATIC")


def _dynamic_dims_per_leaf(dynamic_shapes: Any, mod: torch.nn.Module, args: tuple,
                           kwargs: dict) -> list[dict[int, Any] | None]:
    """For every flat user input leaf, {dim index: Dim} or None."""
    flat, _ = tc.pytree.tree_flatten((args, kwargs))
    if dynamic_shapes is None:
        return [None] * len(flat)
    if callable(getattr(dynamic_shapes, "dynamic_shapes", None)):
        # torch.export.ShapesCollection / AdditionalInputs: they build the spec for this call
        dynamic_shapes = dynamic_shapes.dynamic_shapes(mod, args, kwargs)
        if dynamic_shapes is None:
            return [None] * len(flat)
    try:
        bound = inspect.signature(mod.forward).bind(*args, **kwargs).arguments
    except (TypeError, ValueError):
        bound = None
    if isinstance(dynamic_shapes, (tuple, list)) and bound is not None:
        # a sequence spec follows forward's signature, keyword arguments included, whatever
        # order the call passed them in (as torch.export reads it)
        if len(dynamic_shapes) != len(bound):
            raise DynamicShapesError(f"dynamic_shapes has {len(dynamic_shapes)} entries but the call binds "
                                   f"{len(bound)} arguments of forward ({', '.join(bound)})",
                                   kind=Refusal.DYNAMIC_SHAPES_SPEC)
        dynamic_shapes = dict(zip(bound, dynamic_shapes))
    if isinstance(dynamic_shapes, dict):
        bound = bound or {}
        unknown = set(dynamic_shapes) - set(bound)
        if unknown:
            raise DynamicShapesError(f"dynamic_shapes names {sorted(unknown)}, which are not "
                                   f"arguments of this call (arguments: {list(bound)})",
                                   kind=Refusal.DYNAMIC_SHAPES_SPEC)
        names = list(bound)
        positional = tuple(dynamic_shapes.get(n) for n in names[: len(args)])
        keyword = {k: _keyword_spec(dynamic_shapes, bound, names, k) for k in kwargs}
        spec = (positional, keyword)
    elif isinstance(dynamic_shapes, (tuple, list)):
        spec = (tuple(dynamic_shapes), {})
    else:
        raise DynamicShapesError(f"dynamic_shapes must be a dict, tuple or list (or a ShapesCollection / "
                               f"AdditionalInputs), got {type(dynamic_shapes).__name__}",
                               kind=Refusal.DYNAMIC_SHAPES_SPEC)
    out: list[dict[int, Any] | None] = []
    _collect(spec, (args, kwargs), out)
    return out


def _keyword_spec(dynamic_shapes: dict, bound: dict, names: list[str], key: str) -> Any:
    """The spec of keyword argument ``key``: its own entry, or its entry inside the spec of a
    ``**kwargs`` parameter that collected it."""
    if key in dynamic_shapes:
        return dynamic_shapes[key]
    collector = next((n for n in names if isinstance(bound.get(n), dict) and key in bound[n]), None)
    inner = dynamic_shapes.get(collector) if collector is not None else None
    return inner.get(key) if isinstance(inner, dict) else None


@dataclasses.dataclass(frozen=True)
class _IntDim:
    """The spec of a Python int input: a Dim (or Dim.DYNAMIC/AUTO) makes it a symbolic input."""

    dim: Any


def _collect(spec: Any, value: Any, out: list) -> None:
    if isinstance(value, int) and not isinstance(value, bool):
        out.append(_IntDim(spec) if spec is not None and not isinstance(spec, (dict, list, tuple)) else None)
        return
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
