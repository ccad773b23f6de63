"""The Python kernels on the session's key: for each plan, the shortest path to its result.

A keyed session meets an op outside the target as a call from C++ into one of
these kernels, on every step of a model: autograd's and the optimizer's writes
(``add_``, ``fill_``, ``zero_``), the backward ops of activations, attention.
The trip itself costs about a microsecond; what follows it is the cost
(``docs/eager_bench.md``), so each kernel goes straight to what its plan does
in the steady state and leaves everything else to :meth:`EagerMode.run`
(tracing, uncached and unreachable ops, cycles, sparse inputs, and the one
argument shape the short path does not cover):

* ``DECOMPOSE``: the signature, its traced kernel (``cache``), replayed
  compiled (``replay``) with the key off;
* ``THROUGH_TWIN``, in-place with a twin taking the same arguments
  (``add_`` -> ``add``): the twin (its C++ kernel when in the target, else its
  own plan) and the floor's ``copy_`` into ``self``, which the caller gets back;
* anything else: ``run``.

Each counts in the session's stats what ``run`` would count, so ``stats`` reads
the same on either path.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from .. import _torch_compat as tc
from . import cache
from .mode import EagerMode, Kernels
from .plans import How, Plan, check_in_place_cast, check_no_partial_overlap

_NUMBERS = frozenset({int, float, bool, complex})
_COPY = tc.entry_point(torch.ops.aten.copy_.default)


def kernel_for(op: tc.OpOverload, how: How, kernels: Kernels, modes: list[EagerMode],
               idle: EagerMode) -> Callable[..., Any]:
    """The kernel registered for ``op`` (outside the target, run by its plan, which says ``how``);
    ``modes[-1]`` (else ``idle``) is the innermost active session's mode, whose stats count the
    call. A ``DECOMPOSE`` kernel asks for the plan only on a signature not traced yet, so a
    process whose kernels came from disk decides none for a replay."""
    positions = tensor_positions(op)
    plan = None if how is How.DECOMPOSE else kernels.plan(op)
    if plan is None:
        fast = _replaying(op, kernels, modes, idle)
    elif in_place_with_same_arguments(plan) and id(torch.ops.aten.copy_.default) in kernels.direct_ids:
        fast = _through_twin_in_place(op, plan, kernels, modes, idle)
    else:
        def fast(*args: Any, **kwargs: Any) -> Any:
            return (modes[-1] if modes else idle).run(op, args, kwargs)

    def kernel(*args: Any, **kwargs: Any) -> Any:
        for i in positions:
            if i < len(args) and type(args[i]) in _NUMBERS:
                args = numbers_as_tensors(args, positions)
                break
        return fast(*args, **kwargs)
    return kernel


def tensor_positions(op: tc.OpOverload) -> tuple[int, ...]:
    """The positional arguments ``op``'s schema types as Tensor, where a C++ caller's wrapped
    number arrives in Python as a number."""
    return tuple(i for i, a in enumerate(tc.schema_of(op).arguments) if str(a.type) == "Tensor" and not a.kwarg_only)


_WIDEST = {bool: torch.bool, int: torch.int64, float: torch.float64, complex: torch.complex128}
_CATEGORY = {bool: 0, int: 1, float: 2, complex: 3}
_OPMATH = {torch.float16: torch.float32, torch.bfloat16: torch.float32, torch.complex32: torch.complex64}


def _category(dtype: torch.dtype) -> int:
    return 3 if dtype.is_complex else 2 if dtype.is_floating_point else 0 if dtype == torch.bool else 1


def numbers_as_tensors(args: tuple, positions: tuple[int, ...]) -> tuple:
    """A C++ caller's wrapped number (``x.div_(0.8)``, ``pow(2, x)`` in a derivative) reaches a
    Python kernel as a Python number, which the op itself refuses where its schema says Tensor.
    It becomes a 0-dim tensor that promotes as the number did and holds the value eager computes
    with: beside a float or complex tensor with dimensions, that tensor's opmath dtype (float64
    0.8 beside a float64 tensor: a float32 0.8 was off by 2e-8 there; float32 beside bfloat16);
    beside a tensor with dimensions of a higher kind, the widest of its own; else the dtype of a
    0-dim tensor of its kind or above, or its default dtype, as the result takes. Made with the
    session's key off."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]

    def as_tensor(value: Any) -> torch.Tensor:
        category = _CATEGORY[type(value)]
        if category == 0:  # a bool stays one (``sub`` refuses bool operands; no dtype is below it)
            return torch.tensor(value)
        same_kind = [t.dtype for t in tensors if t.dim() > 0 and _category(t.dtype) == category]
        if same_kind and category >= 2:  # eager computes in that dtype's opmath, the number cast to it
            dtype = functools.reduce(torch.promote_types, same_kind)
            return torch.tensor(value, dtype=_OPMATH.get(dtype, dtype))
        if any(t.dim() > 0 and _category(t.dtype) >= category for t in tensors):
            return torch.tensor(value, dtype=_WIDEST[type(value)])  # that tensor's dtype wins
        governing = [t.dtype for t in tensors if t.dim() == 0 and _category(t.dtype) >= category]
        if governing:  # a 0-dim tensor of its kind or above sets the dtype: the number takes it
            return torch.tensor(value, dtype=functools.reduce(torch.promote_types, governing))
        return torch.tensor(value)  # the number raises the kind: its default dtype, as eager

    # ``torch.tensor`` calls ``lift_fresh`` and ``detach_`` itself: the conversion's own ops, not
    # the model's, which would each make a trip into Python (``detach_`` outside the target)
    with tc.excluding_spare_key():
        return tuple(as_tensor(value) if i in positions and type(value) in _NUMBERS else value
                     for i, value in enumerate(args))


def _replaying(op: tc.OpOverload, kernels: Kernels, modes: list[EagerMode], idle: EagerMode) -> Callable[..., Any]:
    traced_by_signature = kernels.kernels_of(op)  # the dict EagerMode.run fills
    uncacheable, signature, excluding = cache.UNCACHEABLE, cache.signature, tc.excluding_spare_key

    def replaying(*args: Any, **kwargs: Any) -> Any:
        mode = modes[-1] if modes else idle
        if mode.use_cache:
            key, tensors = signature(args, kwargs)
            traced = traced_by_signature.get(key)
            if traced is not None and traced is not uncacheable:
                mode.count_hit(op)
                with excluding():  # target ops only: the backend's, inside and out
                    return traced.run(*tensors)
        return mode.run(op, args, kwargs)
    return replaying


def in_place_with_same_arguments(plan: Plan) -> bool:
    """``self`` written, and the twin takes the op's arguments as they come (``add_.Tensor`` and
    ``add.Tensor``)."""
    return _through_a_drawless_twin(plan) and plan.written == plan.arguments[:1] and \
        _argument_names(plan.op) == _argument_names(plan.twin)


def out_with_same_arguments(plan: Plan) -> bool:
    """An out= op writing one tensor, ``out``, its last argument, whose twin takes the others as
    they come (``mm.out`` and ``mm``, ``sum.IntList_out`` and ``sum.dim_IntList``)."""
    if not _through_a_drawless_twin(plan) or plan.written != ("out",) or len(tc.schema_of(plan.op).returns) != 1:
        return False
    names = _argument_names(plan.op)
    return names[-1:] == [("out", True)] and names[:-1] == _argument_names(plan.twin)


def _through_a_drawless_twin(plan: Plan) -> bool:
    """Through a twin, not a random op (left to ``run``, which draws once)."""
    return plan.how is How.THROUGH_TWIN and plan.twin is not None and \
        torch.Tag.nondeterministic_seeded not in plan.op.tags


def _argument_names(op: tc.OpOverload | None) -> list[tuple[str, bool]]:
    return [(a.name, a.kwarg_only) for a in tc.schema_of(op).arguments]


def _through_twin_in_place(op: tc.OpOverload, plan: Plan, kernels: Kernels, modes: list[EagerMode],
                           idle: EagerMode) -> Callable[..., Any]:
    twin: tc.OpOverload = plan.twin  # type: ignore[assignment]
    twin_in_target = id(twin) in kernels.direct_ids
    twin_entry, excluding, strided = tc.entry_point(twin), tc.excluding_spare_key, torch.strided
    copy = torch.ops.aten.copy_.default

    def through_twin(*args: Any, **kwargs: Any) -> Any:
        mode = modes[-1] if modes else idle
        destination = args[0]
        for value in args:  # a sparse argument is run's to refuse
            if isinstance(value, torch.Tensor) and value.layout is not strided:
                return mode.run(op, args, kwargs)
        check_no_partial_overlap(destination, (*args, *kwargs.values()))
        if twin_in_target:
            with excluding():
                result = twin_entry(*args, **kwargs)
        else:
            result = mode.run(twin, args, kwargs)
        if not isinstance(result, torch.Tensor) or result.shape != destination.shape:  # run's to resize
            return mode.run(op, args, kwargs)
        check_in_place_cast(result, destination)
        with excluding():
            _COPY(destination, result)
        stats = mode.stats
        stats.decomposed.add(op)
        if twin_in_target:
            stats.reached.add(twin)
        stats.reached.add(copy)
        return destination
    return through_twin
