"""Tensor subclasses taken apart or built in ``forward`` (TwoTensor, torchao's quantized weights, DTensor).

A subclass value the model receives (an input, parameter or buffer of a traceable wrapper
subclass: one with ``__tensor_flatten__``/``__tensor_unflatten__``) is traced as a functional
tensor over the subclass, and ops on it are recorded at the subclass's level, as torch.export
records them. Two things a model does with a subclass are not ops; both become nodes here, in
the form torch.export's programs give them::

    t.a, t.get_elem_a()      ->  export.access_subclass_inner_tensor(t, 'a')
    TwoTensor(x, y)          ->  flat_apply(<TwoTensor.__tensor_unflatten__>, <spec>, x, y)

* Reading: a functional tensor has none of the subclass's own attributes. For a name it lacks,
  :meth:`SubclassValues.attribute` looks at the subclass behind it: an inner tensor becomes the
  access op, a method or property of the subclass runs on the functional tensor (so its reads of
  inner tensors become the op too), other attributes of the subclass (its metadata) are read as
  the constants they are.
* Building: the object the model builds is a subclass over functional tensors, which the mode
  cannot dispatch. Where an op, or the program's output, first reads it, :meth:`SubclassValues.traced`
  gives a functional tensor over the same subclass rebuilt from its inner tensors' values,
  recorded as a ``flat_apply`` of the subclass's ``__tensor_unflatten__``: replayed, it builds
  the subclass from the same inner tensors, as the model's constructor did (a subclass
  built from tensors that require grad is then a new autograd leaf, as in eager).

What the program cannot say is refused (``Refusal.TENSOR_SUBCLASS_IN_FORWARD``): a write to an
inner tensor read this way, or to a subclass built in forward (eager writes the tensors the
subclass holds, the program's copies would not be them), a built subclass whose inner tensors
are not values of the trace, and a read of an inner tensor named like an attribute the traced
tensor has itself (``elem``).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from ... import _torch_compat as tc
from ...errors import Refusal, UnsupportedError, user_source_line
from ..observers import OpCall, set_requires_grad

_ABSENT = object()


class SubclassRebuild:
    """What a ``flat_apply`` node calls to build a subclass from its inner tensors (in the order of
    ``names``): the subclass's ``__tensor_unflatten__``, with the metadata and the outer sizes and
    strides the model's object had, held when static, else the call's last two arguments (symbolic
    sizes are values of the program). Compared by identity (a pytree constant of the graph)."""

    __slots__ = ("cls", "names", "meta", "size", "stride")

    def __init__(self, cls: type, names: tuple[str, ...], meta: Any, size: tuple[int, ...] | None,
                 stride: tuple[int, ...] | None):
        self.cls, self.names, self.meta, self.size, self.stride = cls, names, meta, size, stride

    def __call__(self, *args: Any) -> torch.Tensor:
        inner, size, stride = (args, self.size, self.stride) if self.size is not None else (args[:-2], *args[-2:])
        return self.cls.__tensor_unflatten__(dict(zip(self.names, inner)), self.meta,  # type: ignore[attr-defined]
                                             size, stride)

    def __repr__(self) -> str:
        return f"{self.cls.__qualname__}.__tensor_unflatten__"


def _inner_names(value: Any) -> dict[str, type]:
    """The names of a subclass value's inner tensors, nested subclasses' included -> the subclass
    that holds each."""
    if not tc.is_traceable_wrapper_subclass(value):
        return {}
    names = value.__tensor_flatten__()[0]
    found = {name: type(value) for name in names}
    for name in names:
        found = {**_inner_names(getattr(value, name)), **found}
    return found


def is_built_subclass(t: Any) -> bool:
    """A traceable wrapper subclass the model built in forward: over traced (functional) tensors,
    where a value of the trace is a functional tensor over a subclass of fakes."""
    if isinstance(t, tc.FunctionalTensor) or not tc.is_traceable_wrapper_subclass(t):
        return False
    return any(isinstance(i, tc.FunctionalTensor) or is_built_subclass(i)
               for i in (getattr(t, name) for name in t.__tensor_flatten__()[0]))


class SubclassValues:
    """One trace's subclass reads and builds: the values they made (a write to one is refused)
    and each built subclass's traced stand-in, made again once its inner tensors were written."""

    __slots__ = ("_mode", "_made", "_stand_ins", "_shadowed")

    def __init__(self, mode: Any):
        self._mode = mode  # the PolicyFunctionalMode whose trace this is
        self._made: dict[int, Any] = {}  # id -> functional tensor made here (kept alive: ids stay unique)
        self._stand_ins: dict[int, tuple[Any, tuple[int, ...], Any]] = {}  # id(built) -> (built, writes, traced)
        self._shadowed: dict[str, type] = {}  # inner tensor name the traced tensor's own attribute hides -> class

    # names the traced tensor hides -----------------------------------------------------------

    def note_values(self, traced: list[Any]) -> None:
        """Note the subclasses behind ``traced`` (graph inputs, stand-ins) whose inner tensors are named
        like an attribute the FunctionalTensor itself holds (``elem``): ``t.elem`` reads the traced
        tensor's own, never this lookup, so an op given it is refused (:meth:`refuse_shadowed_reads`)."""
        for t in traced:
            if isinstance(t, tc.FunctionalTensor):
                for name, holder in _inner_names(tc.value_behind_functional(t)).items():
                    if name in vars(t):
                        self._shadowed.setdefault(name, holder)

    def refuse_shadowed_reads(self, call: OpCall, input_ids: set[int]) -> None:
        """A refusal check: an op given a traced tensor's own inner wrapper (read as ``t.elem`` where
        the model meant its subclass's inner tensor ``elem``) would compute on the wrong value."""
        if self._shadowed and any(tc.is_bare_functional_wrapper(a) for a in call.tensors_read()):
            names = ", ".join(f"{n!r} of {c.__qualname__}" for n, c in self._shadowed.items())
            raise UnsupportedError(
                f"forward reads an inner tensor of a tensor subclass named like an attribute of the traced "
                f"tensor itself ({names}): the read returns the traced tensor's own; rename the inner "
                "tensor (in __tensor_flatten__ and the attribute)",
                kind=Refusal.TENSOR_SUBCLASS_IN_FORWARD, op=call.func, source=user_source_line())

    # reading ---------------------------------------------------------------------------------

    def attribute(self, t: Any, name: str) -> Any:
        """``t.name`` for a functional tensor ``t`` that lacks it (``FunctionalTensor.__getattr__``)."""
        value = tc.value_behind_functional(t)
        if name.startswith("__") or not tc.is_traceable_wrapper_subclass(value):
            raise AttributeError(f"'{type(t).__name__}' object has no attribute '{name}'", name=name, obj=t)
        inner_names, _ = value.__tensor_flatten__()
        if name in inner_names:
            return self._inner(t, value, name)
        found = inspect.getattr_static(type(value), name, _ABSENT)
        if isinstance(found, property):
            return found.fget(t) if found.fget is not None else getattr(value, name)
        if inspect.isfunction(found):
            return found.__get__(t, type(t))  # the subclass's method, on the traced value
        if found is not _ABSENT:
            return getattr(value, name)  # a static/class method or a class constant
        held = value.__dict__.get(name, _ABSENT)
        if held is _ABSENT:
            raise AttributeError(f"'{type(value).__name__}' object has no attribute '{name}'", name=name, obj=t)
        if isinstance(held, torch.Tensor):
            raise UnsupportedError(
                f"forward reads {name!r} of tensor subclass {type(value).__qualname__}, a tensor its "
                "__tensor_flatten__ does not list: the program cannot say which value it is; list it "
                "among the inner tensors, or read it outside the model",
                kind=Refusal.TENSOR_SUBCLASS_IN_FORWARD, source=user_source_line())
        return held  # metadata of the subclass: a constant of the program

    def _inner(self, t: Any, value: Any, name: str) -> Any:
        out = tc.ACCESS_SUBCLASS_INNER_TENSOR(t, name)
        set_requires_grad(out, bool(getattr(value, name).requires_grad))  # eager's inner tensor's flag
        self._made[id(out)] = out
        return out

    # building --------------------------------------------------------------------------------

    def traced(self, t: Any) -> Any:
        """``t``, or its traced stand-in when it is a subclass the model built in forward."""
        if not is_built_subclass(t):
            return t
        names, meta = t.__tensor_flatten__()
        inner = [self.traced(getattr(t, n)) for n in names]
        if not all(isinstance(i, tc.FunctionalTensor) for i in inner):
            raise self._refusal(t, "holds a tensor that is no value of the trace (made outside forward "
                                   "and not a parameter, buffer or input)")
        writes = tuple(tc.storage_mutation_count(i) for i in inner)
        known = self._stand_ins.get(id(t))
        if known is not None and known[1] == writes:
            return known[2]
        size, stride = tuple(t.size()), tuple(t.stride())
        static = all(isinstance(n, int) for n in (*size, *stride))
        rebuild = SubclassRebuild(type(t), tuple(names), meta, size if static else None, stride if static else None)
        args = (*(tc.inner_of_functional(i) for i in inner), *(() if static else (size, stride)))
        with tc.disable_proxy_modes_tracing():
            value = rebuild(*args)
        tc.record_flat_apply(rebuild, args, value, spec_name=f"{type(t).__name__.lower()}_unflatten")
        with self._mode:
            stand_in = tc.to_functional(value)
        self._mode.observe_opaque_call(f"tensor subclass {type(t).__qualname__} built in forward", inner,
                                       [stand_in], keeps_inputs=False)
        set_requires_grad(stand_in, bool(t.requires_grad))
        self._stand_ins[id(t)] = (t, writes, stand_in)
        self.note_values([stand_in])
        self._made[id(stand_in)] = stand_in
        return stand_in

    def traced_outputs(self, outs: list[Any]) -> list[Any]:
        """The body's outputs, each built subclass among them traced (between ops: the mode is
        set aside while the stand-in is recorded, as during its own dispatch)."""
        if not any(is_built_subclass(o) for o in outs):
            return outs
        with tc.functional_mode_off():
            return [self.traced(o) for o in outs]

    def traced_arguments(self, types: Any, args: tuple, kwargs: dict) -> tuple[Any, tuple, dict]:
        """An op's ``types``, ``args`` and ``kwargs`` with each built subclass among them traced
        (nothing is walked when ``types`` holds only the tensor types functionalization takes)."""
        if tc.only_functionalized_tensor_types(types):
            return types, args, kwargs
        leaves, spec = tc.pytree.tree_flatten((args, kwargs))
        traced = [self.traced(t) for t in leaves]
        if all(a is b for a, b in zip(traced, leaves)):
            return types, args, kwargs
        args, kwargs = tc.pytree.tree_unflatten(traced, spec)
        return tuple({type(t) for t in traced if isinstance(t, torch.Tensor) and type(t) is not torch.Tensor}), \
            args, kwargs

    # writes ------------------------------------------------------------------------------------

    def refuse_writes(self, call: OpCall, input_ids: set[int]) -> None:
        """A refusal check (refusals.py's signature): no write to a value made here, or a view of one."""
        if not self._made:
            return
        for t in call.written:
            base = self._mode.bases.base_of(t)
            if id(t) in self._made or (base is not None and id(base) in self._made):
                raise UnsupportedError(
                    "forward writes in place to an inner tensor of a tensor subclass, or to a subclass "
                    "built in forward: eager writes the tensors the subclass holds, which the functional "
                    "program cannot reach; use the out-of-place op and build the subclass from its result",
                    kind=Refusal.TENSOR_SUBCLASS_IN_FORWARD, op=call.func, source=user_source_line())

    @staticmethod
    def _refusal(t: Any, what: str) -> UnsupportedError:
        return UnsupportedError(f"forward builds tensor subclass {type(t).__qualname__} that {what}",
                                kind=Refusal.TENSOR_SUBCLASS_IN_FORWARD, source=user_source_line())
