"""How one op outside the target runs: decided once per op, from its schema.

* ``DECOMPOSE``: a functional op with a path into the target (the lowering's
  decomposition: torch's Core ATen one, another ATen one, or the
  CompositeImplicitAutograd kernel); traced once per signature (``cache``).
* ``THROUGH_TWIN``: an in-place or ``out=`` op; its functional twin (same
  arguments, no write) runs, inside the target or decomposed, and the result
  is written into the destination with the floor's ``copy_``, so the caller's
  tensor, its views and its version counter are eager's.
* ``VIEW_IN_PLACE``: an in-place view op (``transpose_``); the functional view
  runs and the tensor takes its geometry with ``as_strided_``.
* ``DECOMPOSE_MUTABLE``: a mutable op without a twin whose decomposition torch
  registers (it writes with ``copy_`` itself); run as Python each call.
* ``COMPOSITE_KERNEL``: no decomposition, but torch's own kernel for every
  backend is a CompositeExplicitAutograd one (``rand_like``: ``empty_like``
  then ``uniform_``), which a backend gets without registering anything; it
  runs, and its ops come back through the mode. A random op prefers it to a
  decomposition, so it draws from the generator exactly as eager does; so do the ops of
  ``SERVED_BY_COMPOSITE_KERNEL``, whose kernel calls only target ops (no Python on the key).
* ``UNREACHABLE``: no path into the target; named with the user's line.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Iterable

import torch

from .. import _torch_compat as tc
from ..op_schema import Match, functional_twin, out_argument_names
from ..opsets import Lowering
from . import extra_decompositions


class How(enum.Enum):
    DECOMPOSE = "decompose"
    THROUGH_TWIN = "through its functional twin, then a write"
    VIEW_IN_PLACE = "functional view, then as_strided_"
    DECOMPOSE_MUTABLE = "torch's decomposition of the mutable op"
    COMPOSITE_KERNEL = "torch's CompositeExplicitAutograd kernel"
    UNREACHABLE = "unreachable"


@dataclasses.dataclass(frozen=True)
class Plan:
    how: How
    op: tc.OpOverload
    twin: tc.OpOverload | None = None
    decomposition: Callable | None = None
    written: tuple[str, ...] = ()  # argument names the op writes (THROUGH_TWIN)
    why: str = ""  # UNREACHABLE; empty: the lowering's ``why_missing``
    # THROUGH_TWIN, read once here (a schema's arguments are rebuilt as Python objects on each read):
    arguments: tuple[str, ...] = ()  # the op's argument names, in order
    twin_positional: tuple[str, ...] = ()  # the twin's positional argument names, in order
    twin_keyword: tuple[str, ...] = ()  # the twin's keyword-only argument names


# Ops outside Core ATen whose CompositeExplicitAutograd kernel calls only these ops (found with
# torch's profiler over the corpus's train steps, pinned by tests/eager/test_eager_assumptions.py).
# Where the target has them all, the composite kernel serves the op as it serves any backend: on
# the session's key it falls through, its calls pass the key in C++, and no trip into Python is
# made (empty_like: the autograd engine's gradient buffers, 12 a step of a corpus model on
# average, 15-40 us each as a decomposition); the result is eager's own kernel's.
SERVED_BY_COMPOSITE_KERNEL: dict[str, tuple[str, ...]] = {
    "aten::empty_like": ("aten::empty_strided",),
    "aten::new_empty": ("aten::empty.memory_format",),
    "aten::stack": ("aten::cat", "aten::view"),
}


def _served_by_composite_kernel(op: tc.OpOverload, lowering: Lowering) -> bool:
    inner = SERVED_BY_COMPOSITE_KERNEL.get(op.name())
    if inner is None:
        return False
    resolved = [tc.resolve_overload(*(name if "." in name else f"{name}.default").split("::", 1)) for name in inner]
    return all(o is not None and lowering.allows(o) for o in resolved)


def plan_for(op: tc.OpOverload, lowering: Lowering) -> Plan:
    schema = tc.schema_of(op)
    composite = tc.has_composite_explicit_kernel(op)
    if composite and (torch.Tag.nondeterministic_seeded in op.tags or _served_by_composite_kernel(op, lowering)):
        return Plan(How.COMPOSITE_KERNEL, op)
    if not schema.is_mutable:
        decomposition = extra_decompositions.for_op(op) or lowering.decomposition(op)
        if decomposition is not None:
            return Plan(How.DECOMPOSE, op, decomposition=decomposition)
        if composite:
            return Plan(How.COMPOSITE_KERNEL, op)
        return Plan(How.UNREACHABLE, op)  # why: asked of the lowering when the op is met (``why_missing``)
    if torch.Tag.inplace_view in op.tags:
        twin = functional_twin(op, Match.BY_NAME)
        if twin is not None:
            return Plan(How.VIEW_IN_PLACE, op, twin=twin)
    if schema.name == "aten::set_":  # shares memory: no functional form plus a copy can do that
        return Plan(How.UNREACHABLE, op, why="it gives a tensor other memory; the backend must implement it")
    written = tuple(name for _, name in tc.written_arguments(op))
    twin = functional_twin(op, Match.BY_NAME)
    if twin is not None and _writes_only(op, written):
        twin_arguments = tc.schema_of(twin).arguments
        return Plan(How.THROUGH_TWIN, op, twin=twin, written=written,
                    arguments=tuple(a.name for a in schema.arguments),
                    twin_positional=tuple(a.name for a in twin_arguments if not a.kwarg_only),
                    twin_keyword=tuple(a.name for a in twin_arguments if a.kwarg_only))
    decomposition = lowering.decomposition(op)
    if decomposition is not None:
        return Plan(How.DECOMPOSE_MUTABLE, op, decomposition=decomposition)
    if composite:
        return Plan(How.COMPOSITE_KERNEL, op)
    return Plan(How.UNREACHABLE, op, why=("no functional twin and no decomposition"
                                          if twin is None else "writes arguments its twin does not return"))


def _writes_only(op: tc.OpOverload, written: tuple[str, ...]) -> bool:
    """The op writes ``self`` (in-place) or only its ``out=`` tensors: one result per write."""
    outs = out_argument_names(op)
    if outs:
        return set(written) == set(outs)
    return written == (tc.schema_of(op).arguments[0].name,)




_SCALAR_TYPE_NAMES = {torch.float64: "Double", torch.float32: "Float", torch.float16: "Half",
                      torch.bfloat16: "BFloat16", torch.int64: "Long", torch.int32: "Int", torch.int16: "Short",
                      torch.int8: "Char", torch.uint8: "Byte", torch.bool: "Bool",
                      torch.complex128: "ComplexDouble", torch.complex64: "ComplexFloat", torch.complex32: "ComplexHalf"}


_PARTIAL_OVERLAP = ("unsupported operation: some elements of the input tensor and the written-to tensor refer to a "
                    "single memory location. Please clone() the tensor before performing the operation.")


def check_no_partial_overlap(destination: torch.Tensor, values: Iterable[object]) -> None:
    """A write whose input shares part of the destination's memory (``x[1:].add_(x[:-1])``, or
    the same memory through other strides: ``x.add_(x.t())``): eager's kernels refuse it (reading
    and writing at once would mix old and new values), a functional twin and a ``copy_`` would
    compute it from the old values silently. Raised as eager raises it, by eager's rule
    (``tc.partially_overlapping``). A tensor subclass's memory is its own business (a wrapper's
    storage has no data): not checked, as eager's kernels never see it."""
    storage = None
    for value in values:
        if not isinstance(value, torch.Tensor) or value is destination or value.layout is not torch.strided \
                or value.device.type == "meta" or value.device != destination.device or not tc.memory_is_torchs(value):
            continue
        if storage is None:
            if not tc.memory_is_torchs(destination):
                return
            storage = destination.untyped_storage().data_ptr()
        if value.untyped_storage().data_ptr() == storage and tc.partially_overlapping(destination, value):
            raise RuntimeError(_PARTIAL_OVERLAP)


# what eager's out= checks say (structured kernels' ``resize_out``, TensorIterator), and the meta
# kernels' (torch._refs) wording of TensorIterator's cast check
_OUT_REFUSALS = ("can't be cast to the desired output type", "Expected out tensor to have dtype")
_REFS_CAST_REFUSAL = "but this can't be cast because it is not safe"


def check_out_as_eager(op: tc.OpOverload, args: tuple, kwargs: dict) -> bool:
    """An ``out=`` op's checks of its destination, as eager makes them: the op run on meta copies
    of its tensors, where torch's meta kernels check what the CPU kernels check (an out tensor of
    another dtype where the kernel allows none, ``torch.mm(a, b, out=long_tensor)``, raised here;
    a result dtype that cannot be cast into it, ``torch.add(x, 0.5, out=long_tensor)``: True, for
    the caller to raise in eager's words with the result's dtype, ``check_in_place_cast``). The
    twin and a ``copy_`` would cast silently. Only those refusals count: a meta kernel that
    cannot run (data-dependent, missing) says nothing about eager."""
    def on_meta(t: torch.Tensor) -> torch.Tensor:
        return torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device="meta")

    random = torch.Tag.nondeterministic_seeded in op.tags  # bernoulli.out fills any dtype; its meta refuses
    try:
        with tc.outside_trace(), tc.excluding_spare_key():
            meta_args, meta_kwargs = tc.pytree.tree_map_only(torch.Tensor, on_meta, (args, kwargs))
            op(*meta_args, **meta_kwargs)
    except RuntimeError as exc:
        if _REFS_CAST_REFUSAL in str(exc):
            return not random
        if any(text in str(exc) for text in _OUT_REFUSALS):
            raise RuntimeError(str(exc).splitlines()[0]) from None
    except Exception:  # noqa: BLE001, S110 (no meta kernel for it: nothing to say)
        pass
    return False


def check_in_place_cast(result: torch.Tensor, destination: torch.Tensor) -> None:
    """An in-place op computes in the result type of its arguments and casts into ``self``, which
    eager refuses where the cast would lose a kind (``int_tensor.add_(0.8)``); its functional twin
    and a ``copy_`` would truncate silently. Raised as eager raises it."""
    if result.dtype != destination.dtype and not torch.can_cast(result.dtype, destination.dtype):
        name = _SCALAR_TYPE_NAMES.get
        raise RuntimeError(f"result type {name(result.dtype, str(result.dtype))} can't be cast to the desired "
                           f"output type {name(destination.dtype, str(destination.dtype))}")
