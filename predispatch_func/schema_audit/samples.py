"""Sample inputs for one operator overload, built to find where lies hide.

A composite that lies usually does so on an identity fast path: ``type_as``
to the same dtype, ``sum_to_size`` to the same size, ``einsum("ij->ji")``,
``dropout(p=0)`` or ``train=False``, a one-element list. Random OpInfo inputs
rarely take those paths, so each overload gets three kinds of samples:

* :func:`schema_samples`: values synthesised from the schema under
  *profiles* (identity, identity with optionals, non-contiguous, other dtype,
  square, vector, 0-d to 5-d, reshaping, and one profile per dtype), the
  identity profile choosing the value that makes the op a no-op;
* ``recipes.recipe_samples``: hand-written inputs for ops models use whose
  schemas cannot describe their shapes (RNN weight lists, embedding bags);
* ``opinfo.opinfo_samples``: torch's own OpInfo sample inputs (``op_db``)
  whose arguments bind to the overload.

A sample is a recipe, not tensors: :meth:`Sample.materialize` builds fresh
tensors each time, so one run cannot leak a mutation into the next.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from .. import _torch_compat as tc

# --- samples -----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Sample:
    """Positional and keyword arguments for one call, plus where they came from."""

    source: str  # "schema:identity", "opinfo:nn.functional.dropout", ...
    args: tuple
    kwargs: dict
    # for an out= overload: the functional overload whose results size the out tensors
    outs_from: Any = None
    layout: str = "strided"  # the first tensor's layout (layouts.py converts it)

    def materialize(self) -> tuple[tuple, dict]:
        """Fresh copies of every tensor (strides kept), other values shared.

        Out tensors of an out= overload are made here, shaped like the
        functional overload's results, so that running the functional op
        happens where the checker runs ops (in the crash-isolated child).
        """
        args, kwargs = _clone_tree(self.args), _clone_tree(self.kwargs)
        if self.outs_from is not None:
            made = self.outs_from(*args, **{k: v for k, v in kwargs.items() if not isinstance(v, _Marker)})
            made = made if isinstance(made, (tuple, list)) else (made,)
            names = [k for k, v in kwargs.items() if isinstance(v, _Marker)]
            for name, like in zip(names, made):
                kwargs[name] = torch.empty_like(like)
        return args, kwargs

    def describe(self, prefix: str = "") -> str:
        """``prefix(f32[2,3], 'ij->ji') [schema:identity]``: shapes and values, not data."""
        parts = [_short(a) for a in self.args] + [f"{k}={_short(v)}" for k, v in self.kwargs.items()]
        return f"{prefix}({', '.join(parts)}) [{self.source}]"


def _clone_tree(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, list):
        return [_clone_tree(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_clone_tree(v) for v in value)
    if isinstance(value, dict):
        return {k: _clone_tree(v) for k, v in value.items()}
    return value


_DTYPE_SHORT = {torch.float32: "f32", torch.float64: "f64", torch.int64: "i64", torch.bool: "b8",
                torch.float16: "f16", torch.bfloat16: "bf16", torch.int32: "i32",
                torch.complex64: "c64", torch.uint8: "u8"}


def _short(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        dims = ",".join(str(s) for s in value.shape)
        if value.layout != torch.strided:
            flag = f" {str(value.layout).removeprefix('torch.')}"
        else:
            flag = "" if value.is_contiguous() else " non-contiguous"
        return f"{_DTYPE_SHORT.get(value.dtype, str(value.dtype))}[{dims}]{flag}"
    if isinstance(value, (list, tuple)):
        inner = ", ".join(_short(v) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner})"
    if isinstance(value, str):
        return repr(value)
    return str(value)


# --- schema-synthesised samples ---------------------------------------------


@dataclasses.dataclass(frozen=True)
class Profile:
    """How to fill a schema: one profile per corner worth visiting."""

    name: str
    shape: tuple[int, ...] = (2, 3)
    dtype: torch.dtype = torch.float32
    non_contiguous: bool = False
    other_dtype: torch.dtype | None = None  # dtype for tensors/ScalarTypes after the first
    flag: bool = False  # value for bool flags (train, copy, ...)
    probability: float = 0.0
    fill_optionals: bool = False
    list_len: int = 1
    same_sizes: bool = True  # int[] size arguments equal to the input's size
    other_shape_reversed: bool = False  # tensors after the first get the reversed shape


PROFILES = (
    Profile("identity"),
    Profile("identity+optionals", fill_optionals=True, flag=True),
    Profile("non-contiguous", non_contiguous=True),
    Profile("other-dtype", other_dtype=torch.float64, flag=True, probability=0.5, list_len=2,
            same_sizes=False, fill_optionals=True),
    Profile("square", shape=(3, 3)),
    Profile("vector", shape=(4,)),
    Profile("3-d", shape=(2, 3, 4)),
    Profile("0-d", shape=()),
    Profile("4-d", shape=(1, 2, 3, 3)),
    Profile("integer", dtype=torch.int64),
    Profile("reshaping", non_contiguous=True, same_sizes=False, other_shape_reversed=True),
    Profile("5-d", shape=(1, 1, 2, 2, 2)),
    Profile("double", dtype=torch.float64),
    # every other dtype once: casts to the dtype a tensor already has return it
    # (_cast_Half on a half tensor, chalf on a complex32 one)
    *(Profile(f"dtype-{str(dt).removeprefix('torch.')}", dtype=dt)
      for dt in (torch.float16, torch.bfloat16, torch.complex64, torch.complex32, torch.bool,
                 torch.uint8, torch.int8, torch.int16, torch.int32)),
)


class NoSample(Exception):
    """The schema has an argument no profile can fill (named dims, storages, ...)."""


_SIZE_NAMES = {"size", "shape", "sizes", "normalized_shape", "output_size", "new_size"}
_STR_VALUES = {
    "reduce": "sum", "reduction": "mean", "approximate": "none", "padding_mode": "zeros",
    "indexing": "ij", "side": "left", "interpolation": "linear", "UPLO": "L", "uplo": "L",
    "mode": "reduced", "padding": "same", "rounding_mode": "trunc", "driver": "gelsy",
    "p": "fro", "ord": "fro",
}
_CLASS_TARGET_OPS = ("nll", "cross_entropy", "ctc", "multilabel", "multi_margin")
_CHANNEL_NAMES = {"running_mean", "running_var", "weight", "bias", "save_mean", "save_invstd"}


def schema_samples(op: tc.OpOverload) -> tuple[list[Sample], list[str]]:
    """One sample per profile that can fill ``op``'s schema; reasons for the others."""
    samples, reasons = [], []
    for profile in PROFILES:
        try:
            samples.append(_fill(op, profile))
        except NoSample as why:
            reasons.append(str(why))
    return samples, sorted(set(reasons))


def _random(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    if dtype == torch.bool:
        return torch.rand(shape) > 0.5
    if dtype == torch.complex32:  # no random kernels for it: cast
        return torch.randn(shape, dtype=torch.complex64).to(dtype)
    if dtype.is_floating_point or dtype.is_complex:
        return torch.randn(shape, dtype=dtype)
    return torch.randint(0, 5, shape, dtype=dtype)


def _tensor(profile: Profile, dtype: torch.dtype, shape: tuple[int, ...] | None = None) -> torch.Tensor:
    shape = profile.shape if shape is None else shape
    if profile.non_contiguous and len(shape) >= 2:
        return _random(tuple(reversed(shape)), dtype).permute(*reversed(range(len(shape))))
    return _random(shape, dtype)


def _equation(n_tensors: int, ndim: int, profile: Profile) -> str:
    letters = "ijklmn"[:ndim]
    if n_tensors == 1:
        # permutation-only: identity on square/vector/0-d, a transpose otherwise
        out = letters if profile.name in ("square", "vector", "0-d") else letters[::-1]
        return f"{letters}->{out}"
    return ",".join([letters] * n_tensors) + f"->{letters}"


class _Marker:
    """A placeholder that survives pickling (the OpInfo cache) and compares by name."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Marker) and other.name == self.name

    def __hash__(self) -> int:
        return hash(self.name)

    def __repr__(self) -> str:
        return f"<{self.name}>"


def _is_out(arg: Any) -> bool:
    return bool(arg.kwarg_only and arg.alias_info is not None and arg.alias_info.is_write
                and str(arg.real_type) == "Tensor")


def _functional_sibling(op: tc.OpOverload) -> tc.OpOverload | None:
    """``add.out`` -> ``add.Tensor``: the overload with the same inputs and no out args."""
    inputs = [(a.name, str(a.real_type)) for a in tc.schema_of(op).arguments if not _is_out(a)]
    packet = getattr(getattr(torch.ops, op.namespace), tc.schema_of(op).name.split("::")[-1])
    for name in packet.overloads():
        other = getattr(packet, name)
        if other is op or tc.schema_of(other).is_mutable:
            continue
        if [(a.name, str(a.real_type)) for a in tc.schema_of(other).arguments] == inputs:
            return other
    return None


class _Filler:
    """Fills one schema under one profile, one argument at a time.

    The first tensor argument is the op's "input"; later tensors take the
    profile's other dtype, batch-norm statistics are per channel, and names
    that mean indices, masks, targets or quantiles get values of that kind.
    """

    def __init__(self, op: tc.OpOverload, profile: Profile):
        self.op = op
        self.schema = tc.schema_of(op)
        self.profile = profile
        self.ndim = len(profile.shape)
        self.tensors_made = 0
        self.list_len = 1  # length of the last Tensor[] filled (einsum equations follow it)
        shape = profile.shape
        self.channels = shape[1] if self.ndim > 1 else (shape[0] if self.ndim == 1 else 1)
        self.per_channel = any(a.name == "running_mean" for a in self.schema.arguments)

    def sample(self) -> Sample:
        args: list[Any] = []
        kwargs: dict[str, Any] = {}
        outs_from = _functional_sibling(self.op) if any(map(_is_out, self.schema.arguments)) else None
        for arg in self.schema.arguments:
            value = _OUT if outs_from is not None and _is_out(arg) else self.value(arg)
            if not arg.kwarg_only:
                args.append(value)
            elif not (arg.has_default_value() and value is arg.default_value):
                kwargs[arg.name] = value
        args = [_equation(self.list_len, self.ndim, self.profile) if a is _EQUATION else a for a in args]
        return Sample(f"schema:{self.profile.name}", tuple(args), kwargs, outs_from)

    def value(self, arg: Any) -> Any:
        kind = str(arg.real_type)
        fill = _BY_KIND.get(kind.removeprefix("Optional[").removesuffix("]") if kind not in _BY_KIND else kind)
        if fill is not None:
            return fill(self, arg, kind.startswith("Optional["))
        if arg.has_default_value():
            return arg.default_value
        raise NoSample(f"cannot synthesise a {kind} argument ({arg.name})")

    def tensor(self, name: str) -> torch.Tensor:
        p = self.profile
        if name in ("condition", "mask"):
            return torch.rand(p.shape) > 0.5
        if name == "target" and self.ndim > 1 and any(k in self.schema.name for k in _CLASS_TARGET_OPS):
            return torch.zeros(p.shape[:1], dtype=torch.long)  # class indices, one per row
        if name == "q":
            return torch.tensor(0.5, dtype=p.dtype)  # a quantile
        if name in ("index", "indices") and self.tensors_made:
            return torch.zeros(p.shape, dtype=torch.long)
        if name in _CHANNEL_NAMES and self.per_channel:
            return torch.rand(self.channels) + 0.5
        first = self.tensors_made == 0
        dtype = p.dtype if first else (p.other_dtype or p.dtype)
        shape = p.shape[::-1] if p.other_shape_reversed and not first else p.shape
        self.tensors_made += 1
        return _tensor(p, dtype, tuple(shape))

    # one method per argument kind: (self, arg, optional) -> value

    def _tensor_arg(self, arg: Any, optional: bool) -> torch.Tensor | None:
        if optional and not self.profile.fill_optionals:
            return None
        return self.tensor(arg.name)

    def _tensor_list(self, arg: Any, optional: bool) -> list[torch.Tensor]:
        self.list_len = self.profile.list_len
        return [self.tensor(arg.name) for _ in range(self.list_len)]

    def _index_list(self, arg: Any, optional: bool) -> list[torch.Tensor]:
        return [torch.zeros(1, dtype=torch.long)]

    def _int(self, arg: Any, optional: bool) -> int | None:
        return _int_for(arg.name, arg, self.profile)

    def _int_list(self, arg: Any, optional: bool) -> list[int] | None:
        return _int_list_for(arg.name, arg, self.profile)

    def _float(self, arg: Any, optional: bool) -> float | None:
        return _float_for(arg.name, arg, self.profile)

    def _bool(self, arg: Any, optional: bool) -> bool:
        if arg.name not in ("train", "training") and arg.has_default_value() and arg.default_value is not None:
            return arg.default_value
        return self.profile.flag

    def _number(self, arg: Any, optional: bool) -> Any:
        return arg.default_value if arg.has_default_value() and arg.default_value is not None else 1

    def _dtype(self, arg: Any, optional: bool) -> torch.dtype | None:
        p = self.profile
        if optional and not p.fill_optionals and p.name != "identity":
            return None
        return p.other_dtype or p.dtype  # identity: the input's own dtype

    def _memory_format(self, arg: Any, optional: bool) -> torch.memory_format | None:
        return torch.contiguous_format if (self.profile.fill_optionals or not optional) else None

    def _str(self, arg: Any, optional: bool) -> str | None:
        if arg.name == "equation":
            return _EQUATION  # type: ignore[return-value]  # the tensor list's length fills it in sample()
        if arg.has_default_value():
            return arg.default_value
        if arg.name in _STR_VALUES:
            return _STR_VALUES[arg.name]
        raise NoSample(f"no value known for str argument {arg.name!r}")


_EQUATION = object()
_OUT = _Marker("out")
_BY_KIND: dict[str, Callable[[_Filler, Any, bool], Any]] = {
    "Tensor": _Filler._tensor_arg,
    "List[Tensor]": _Filler._tensor_list,
    "List[Optional[Tensor]]": _Filler._index_list,
    "int": _Filler._int,
    "List[int]": _Filler._int_list,
    "float": _Filler._float,
    "bool": _Filler._bool,
    "number": _Filler._number,
    "ScalarType": _Filler._dtype,
    "Layout": lambda self, arg, optional: torch.strided,
    "Device": lambda self, arg, optional: torch.device("cpu"),
    "MemoryFormat": _Filler._memory_format,
    "Generator": lambda self, arg, optional: None,
    "str": _Filler._str,
    "List[float]": lambda self, arg, optional: None if optional else [1.0, 1.0],
    "List[bool]": lambda self, arg, optional: [self.profile.flag] * 3,
    "List[number]": lambda self, arg, optional: [1, 1],
}


def _fill(op: tc.OpOverload, profile: Profile) -> Sample:
    return _Filler(op, profile).sample()


def _int_for(name: str, arg: Any, profile: Profile) -> int | None:
    ndim = len(profile.shape)
    if name in ("dim", "dim0", "axis", "start_dim", "source", "dim1", "destination", "end_dim"):
        if name in ("dim1", "destination", "end_dim"):
            return max(ndim - 1, 0) if profile.same_sizes else 0
        return 0
    if name in ("groups", "chunks", "sections", "split_size", "repeats", "n", "k", "steps"):
        return 1 if profile.same_sizes else 2
    if arg.has_default_value():
        return arg.default_value
    if name == "size" and ndim:
        return profile.shape[0]
    return 1


def _int_list_for(name: str, arg: Any, profile: Profile) -> list[int] | None:
    shape = list(profile.shape)
    if name == "output_size" and len(shape) > 2:
        return shape[2:]  # spatial dims of (N, C, *spatial)
    if name in _SIZE_NAMES:
        return shape if profile.same_sizes else shape[::-1]
    if name in ("dims", "perm", "permutation"):
        return list(range(len(shape))) if profile.same_sizes else list(reversed(range(len(shape))))
    if name == "dim":
        if arg.has_default_value() and arg.default_value is not None:
            return list(arg.default_value)
        if arg.has_default_value() and not profile.fill_optionals:
            return None
        return [0] if shape else []
    if arg.has_default_value() and arg.default_value is not None:
        return list(arg.default_value)
    if arg.has_default_value():
        return None
    return [1] * max(1, len(shape) - 2)


def _float_for(name: str, arg: Any, profile: Profile) -> float | None:
    if name in ("p", "prob", "probability", "dropout_p"):
        return profile.probability
    if name == "eps":
        return 1e-5
    if name == "momentum":
        return 0.1
    if arg.has_default_value():
        return arg.default_value
    return 1.0
