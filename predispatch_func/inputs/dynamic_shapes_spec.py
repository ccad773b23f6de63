"""Read a ``dynamic_shapes`` spec in any of torch.export's forms, for every flat user input leaf.

Takes the dict (by forward's argument names), tuple or list (in forward's signature order,
keyword arguments included), ``ShapesCollection`` or ``AdditionalInputs`` form, checks that it
mirrors the inputs (torch.export's words where it does not: a wrong spec would leave dims
silently static), and returns, per leaf of ``tree_flatten((args, kwargs))``, its ``{dim: Dim}``,
an :class:`IntDim` for a Python int declared dynamic, or None. :func:`leaf_paths` names each
leaf as torch.export's messages do (``['xs']['data'][0]``). Used by ``fakeify.py``.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import torch

from .. import _torch_compat as tc
from ..errors import DynamicShapesError, Refusal


def int_inputs_unwrapped(mod: torch.nn.Module, args: tuple, kwargs: dict,
                         dynamic_shapes: Any) -> tuple[tuple, dict, Any]:
    """torch.export's int wrappers (``_IntWrapper``: an int a ``ShapesCollection`` can mark
    dynamic, keyed by the wrapper) as their ints, with the spec the collection builds for
    them; inputs without a wrapper come back as they are."""
    if not any(isinstance(leaf, tc.IntInputWrapper) for leaf in tc.pytree.tree_leaves((args, kwargs))):
        return args, kwargs, dynamic_shapes
    if isinstance(dynamic_shapes, torch.export.ShapesCollection):  # keyed by the wrappers themselves
        dynamic_shapes = dynamic_shapes.dynamic_shapes(mod, args, kwargs)
    args, kwargs = tc.pytree.tree_map_only(tc.IntInputWrapper, lambda wrapper: wrapper.val, (args, kwargs))
    return args, kwargs, dynamic_shapes


def leaf_paths(mod: torch.nn.Module, args: tuple, kwargs: dict) -> list[str]:
    """Each flat user input leaf as torch.export names it in messages: ``['x']``, ``['xs']['data'][0]``
    (forward's parameter name, then the path inside that argument)."""
    try:
        params = [p for p in inspect.signature(mod.forward).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    paths = []
    for path, _ in tc.pytree.tree_flatten_with_path((args, kwargs))[0]:
        if getattr(path[0], "idx", None) == 0:  # positional: by parameter name where forward names it
            i, rest = getattr(path[1], "idx", 0), tc.pytree.keystr(path[2:])
            paths.append(f"[{params[i].name!r}]{rest}" if i < len(params) else f"[{i}]{rest}")
        else:
            paths.append(tc.pytree.keystr(path[1:]))
    return paths


def dims_per_leaf(dynamic_shapes: Any, mod: torch.nn.Module, args: tuple,
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
        signature = inspect.signature(mod.forward)
        bound = signature.bind(*args, **kwargs).arguments
    except (TypeError, ValueError):
        bound = None
    by_name = isinstance(dynamic_shapes, dict)  # errors spell a spec's place as the user wrote it
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
            single_dict = len(args) == 1 and not kwargs and isinstance(args[0], dict) \
                and set(args[0]) == set(dynamic_shapes)  # the spec of that dict, not of the call
            raise DynamicShapesError(
                f"dynamic_shapes names {sorted(unknown)}, which are not arguments of this call (arguments: "
                f"{list(bound)}). When `dynamic_shapes` is specified as a dict, its top-level keys must be the arg "
                f"names {list(bound)} of `inputs`, but here they are {list(dynamic_shapes)}."
                + (" Since here `inputs` is a list/tuple enclosing a single dict, maybe you just forgot to enclose "
                   "`dynamic_shapes` in a list/tuple?" if single_dict else " Alternatively, you could also ignore "
                   "arg names entirely and specify `dynamic_shapes` as a list/tuple matching `inputs`."),
                kind=Refusal.DYNAMIC_SHAPES_SPEC)
        names = list(bound)
        positional = _positional_specs(dynamic_shapes, bound, signature, len(args), by_name)
        keyword = {k: _keyword_spec(dynamic_shapes, bound, names, k) for k in kwargs}
    elif isinstance(dynamic_shapes, (tuple, list)):
        positional, keyword = [(spec, (i,)) for i, spec in enumerate(dynamic_shapes)], {}
    else:
        raise DynamicShapesError(f"dynamic_shapes must be a dict, tuple or list (or a ShapesCollection / "
                               f"AdditionalInputs), got {type(dynamic_shapes).__name__}",
                               kind=Refusal.DYNAMIC_SHAPES_SPEC)
    out: list[dict[int, Any] | None] = []
    for i, arg in enumerate(args):
        spec, place = positional[i] if i < len(positional) else (None, (i,))
        _collect(spec, arg, out, place)
    for k, arg in kwargs.items():
        _collect(keyword[k], arg, out, (k,))
    return out


def _positional_specs(dynamic_shapes: dict, bound: dict, signature: inspect.Signature, n_args: int,
                      by_name: bool) -> list[tuple[Any, tuple]]:
    """(spec, where it sits) of each positional argument; a ``*args`` parameter's spec, a sequence,
    spreads over the arguments it collected."""
    out: list[tuple[Any, tuple]] = []
    for name, value in bound.items():
        if len(out) >= n_args:
            break
        spec = dynamic_shapes.get(name)
        if signature.parameters[name].kind is inspect.Parameter.VAR_POSITIONAL:
            out.extend((spec[j] if isinstance(spec, (list, tuple)) and j < len(spec) else None, (name, j))
                       for j in range(len(value)))
        else:
            out.append((spec, (name,) if by_name else (len(out),)))
    return out


def _keyword_spec(dynamic_shapes: dict, bound: dict, names: list[str], key: str) -> Any:
    """The spec of keyword argument ``key``: its own entry, or its entry inside the spec of a
    ``**kwargs`` parameter that collected it."""
    if key in dynamic_shapes:
        return dynamic_shapes[key]
    collector = next((n for n in names if isinstance(bound.get(n), dict) and key in bound[n]), None)
    inner = dynamic_shapes.get(collector) if collector is not None else None
    return inner.get(key) if isinstance(inner, dict) else None


def _spelled(path: tuple) -> str:
    """``[0]['k']``: where a spec sits in ``dynamic_shapes`` (and its input in the inputs)."""
    return "".join(f"[{k!r}]" for k in path)


def _check_structure(spec: Any, value: list | tuple | dict, path: tuple) -> None:
    """A spec for a list, tuple or dict input mirrors it (or is None), in torch.export's words: a
    mistyped key or a missing entry would otherwise leave a dim silently static."""
    if spec is None:
        return
    where = _spelled(path)
    mismatch = "Detected mismatch between the structure of `inputs` and `dynamic_shapes`: "
    if type(spec) is not type(value):
        raise DynamicShapesError(
            f"{mismatch}`inputs{where}` is a {type(value)}, but `dynamic_shapes{where}` is "
            + (f"a {type(spec)}" if isinstance(spec, (list, tuple, dict)) else "not"),
            kind=Refusal.DYNAMIC_SHAPES_SPEC)
    if isinstance(value, dict) and set(spec) != set(value):
        raise DynamicShapesError(f"{mismatch}`inputs{where}` has keys {sorted(value)}, but `dynamic_shapes{where}` "
                                 f"has keys {sorted(spec)}", kind=Refusal.DYNAMIC_SHAPES_SPEC)
    if len(spec) != len(value):
        raise DynamicShapesError(f"{mismatch}`inputs{where}` has {len(value)} elements, but `dynamic_shapes{where}` "
                                 f"has {len(spec)} elements", kind=Refusal.DYNAMIC_SHAPES_SPEC)


_DIMS = (torch.export.Dim, type(torch.export.Dim.AUTO))  # a named or derived Dim; a hint (AUTO, DYNAMIC, STATIC)


def _tensor_dims(spec: Any, entries: Any, value: torch.Tensor, path: tuple) -> dict[int, Any]:
    """``{dim index: dim}`` of one tensor's spec, each index counted from the front (``-1`` is the
    last dim, as in torch.export) and each dim one torch.export takes, in its words where it is not;
    an index the tensor does not have is refused (torch.export ignores it for ``Dim.AUTO`` and fails
    with an IndexError for a named Dim), as is an index given twice."""
    where = f"input tensor shape {spec} specified at `dynamic_shapes{_spelled(path)}`"
    dims: dict[int, Any] = {}
    for index, dim in entries:
        if not isinstance(index, int):
            raise DynamicShapesError(f"Unexpected index {index!r} in {where} (expected an int: the index of "
                                     f"a dim of the tensor, of shape {tuple(value.shape)})",
                                     kind=Refusal.DYNAMIC_SHAPES_SPEC)
        if not -value.dim() <= index < value.dim():
            raise DynamicShapesError(f"Index {index} in {where} is out of range: the tensor has {value.dim()} "
                                     f"dims (shape {tuple(value.shape)})", kind=Refusal.DYNAMIC_SHAPES_SPEC)
        if dim is not None and not isinstance(dim, (int, *_DIMS)):
            raise DynamicShapesError(f"Unexpected dimension mapped to index {index} in {where} (expected None, "
                                     "an int, a Dim, Dim.AUTO, Dim.STATIC, or Dim.DYNAMIC, "
                                     f"but got {dim!r} instead)", kind=Refusal.DYNAMIC_SHAPES_SPEC)
        if dim is None:
            continue
        position = index % value.dim()
        if position in dims:
            raise DynamicShapesError(f"Dim {position} is given twice in {where}", kind=Refusal.DYNAMIC_SHAPES_SPEC)
        dims[position] = dim
    return dims


def _int_dim(spec: Any, value: int, path: tuple) -> IntDim | None:
    """The spec of a Python int input: None or its own value (static), or a dim that makes it
    symbolic. Anything else is refused (a string or a float was taken as Dim.DYNAMIC, a dict
    ignored); torch.export fails there with an AssertionError, or an AttributeError for an int."""
    where = f"`dynamic_shapes{_spelled(path)}`"
    if spec is None:
        return None
    if isinstance(spec, int) and not isinstance(spec, bool):
        if spec != value:
            raise DynamicShapesError(f"Static shape constraint of {spec} does not match input value of {value}, "
                                     f"for the int input at {where}", kind=Refusal.DYNAMIC_SHAPES_SPEC)
        return None
    if not isinstance(spec, _DIMS):
        raise DynamicShapesError(f"Unexpected dynamic shape spec {spec!r} for the int input at {where} "
                                 "(expected None, an int, Dim.AUTO, Dim.STATIC, or Dim.DYNAMIC)",
                                 kind=Refusal.DYNAMIC_SHAPES_SPEC)
    return IntDim(spec)


@dataclasses.dataclass(frozen=True)
class IntDim:
    """The spec of a Python int input: a Dim (or Dim.DYNAMIC/AUTO) makes it a symbolic input."""

    dim: Any


def _collect(spec: Any, value: Any, out: list, path: tuple = ()) -> None:
    """Append the spec of every leaf of ``value``; ``path``: where ``spec`` sits in the spec (for errors)."""
    if isinstance(value, int) and not isinstance(value, bool):
        out.append(_int_dim(spec, value, path))
        return
    if isinstance(value, torch.Tensor):
        if spec is None:
            out.append(None)
        elif isinstance(spec, dict):
            out.append(_tensor_dims(spec, spec.items(), value, path))
        elif isinstance(spec, (list, tuple)):
            if len(spec) != value.dim():
                raise DynamicShapesError(
                    f"Expected dynamic shape spec {spec} at `dynamic_shapes{_spelled(path)}` to have the same length "
                    f"as the actual tensor shape {value.shape} (expected {value.dim()}, but got {len(spec)} instead)",
                    kind=Refusal.DYNAMIC_SHAPES_SPEC)
            out.append(_tensor_dims(spec, enumerate(spec), value, path))
        else:
            raise DynamicShapesError(
                f"Unexpected input tensor shape {spec} specified at `dynamic_shapes{_spelled(path)}` (expected either a "
                "list/tuple of dimensions, or a dict mapping indices to dimensions, where each dimension is an "
                "int, a Dim, Dim.AUTO, Dim.STATIC, or Dim.DYNAMIC)", kind=Refusal.DYNAMIC_SHAPES_SPEC)
        return
    if isinstance(value, (list, tuple)):
        _check_structure(spec, value, path)
        for i, v in enumerate(value):
            _collect(None if spec is None else spec[i], v, out, (*path, i))
        return
    if isinstance(value, dict):
        _check_structure(spec, value, path)
        for k, v in value.items():
            _collect(None if spec is None else spec[k], v, out, (*path, k))
        return
    # a registered pytree node (a dataclass): its spec mirrors it, or lists its children's specs in
    # flattening order (what torch.export's ShapesCollection builds)
    if value is not None and (type(spec) is type(value) or isinstance(spec, (list, tuple))):
        children = tc.pytree.tree_leaves(value, is_leaf=lambda v: v is not value)
        spec_children = list(spec) if isinstance(spec, (list, tuple)) else \
            tc.pytree.tree_leaves(spec, is_leaf=lambda v: v is not spec)
        if len(children) == len(spec_children) and not any(c is value for c in children):
            for i, (child_spec, child) in enumerate(zip(spec_children, children)):
                _collect(child_spec, child, out, (*path, i))
            return
    leaves = tc.pytree.tree_leaves(value)
    out.extend([None] * len(leaves))
