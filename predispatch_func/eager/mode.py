"""``pf.eager.on(target)``: run eagerly as if the backend had only ``target``.

A dispatch mode below autograd sees every op that reaches the backend level:
the forward ops, and the ops autograd's backward formulas call. Each op in
``target | RUNTIME_FLOOR`` runs as it is; every other op runs by its
:class:`~.plans.Plan`, whose own ops come back through this mode, so lowering
repeats until only target ops run::

    with pf.eager.on(pf.OpSet.core_aten()) as session:
        loss = model(x).sum()
        loss.backward()
    session.stats.decomposed   # which ops the backend was spared, and how often

Decompositions are traced once per signature into graphs of target ops
(``cache``) and replayed. An op with no path into the target raises
:class:`EagerUnreachableError` naming it, the target and the user's line; with
``on_unreachable="run"`` it runs as it is and is recorded instead (the CLI's
survey of a model).
"""

from __future__ import annotations

import collections
import contextlib
import functools
from collections.abc import Callable
from typing import Any

import torch

from .. import _torch_compat as tc
from ..errors import Refusal, UnsupportedError, user_source_line
from ..opsets import Lowering, OpSet, is_infrastructure
from . import above_autograd, cache
from .floor import RUNTIME_FLOOR
from .plans import How, Plan, plan_for
from .stats import EagerStats

aten = torch.ops.aten
_MAX_NESTING = 4  # a decomposition may call its own op again (other arguments); a cycle goes deeper
_CYCLE = ("its lowering leads back to itself (torch's kernel for it calls its out= form, whose functional form "
          "is the op again)")
_SPARSE = "a sparse or other non-strided input: torch's decompositions are written for strided tensors"
_DECLINED = "its decomposition declines these arguments (returns NotImplemented)"


class EagerUnreachableError(UnsupportedError):
    """An op ran under ``pf.eager.on`` that has no path into the target op set."""

    def __init__(self, op: object, target: OpSet, why: str, source: str | None):
        super().__init__(
            f"{op} has no path into the target op set {target.name!r} ({why}); add it to the target "
            "or avoid the call", kind=Refusal.EAGER_OP_UNREACHABLE, op=op, source=source)


class _NotTraceable(Exception):
    """Raised inside a trace by a plan that must run as itself each call."""


class _Kernels:
    """Per target: the plans and the traced kernels, shared by every session on it."""

    def __init__(self, target: OpSet, floor: OpSet):
        self.target, self.floor = target, floor
        self.lowering = Lowering(target | floor)
        self.direct = frozenset(target | floor)
        self.direct_ids = frozenset(id(op) for op in self.direct)  # OpOverload hashes in Python: ids do not
        self.plans: dict[int, Plan | None] = {}
        self.graphs: dict[tuple, Any] = {}
        self.lifted = above_autograd.ops_to_lift(self.lowering)

    def plan(self, op: Any) -> Plan | None:
        """The op's plan; None for what the target does not govern (non-aten ops, bookkeeping)."""
        key = id(op)
        if key not in self.plans:
            governed = isinstance(op, tc.OpOverload) and op.namespace == "aten" and not is_infrastructure(op)
            self.plans[key] = plan_for(op, self.lowering) if governed else None
        return self.plans[key]


def kernels_for(target: OpSet, floor: OpSet = RUNTIME_FLOOR) -> _Kernels:
    """The kernels of one (target, floor), kept for the process: a later session reuses its traces."""
    return _kernels_for(target, floor)


@functools.lru_cache(maxsize=16)
def _kernels_for(target: OpSet, floor: OpSet) -> _Kernels:
    return _Kernels(target, floor)


class EagerMode(tc.TorchDispatchMode):
    """The dispatch mode of one session (see the module docstring)."""

    def __init__(self, target: OpSet, *, use_cache: bool = True, on_unreachable: str = "raise",
                 stats: EagerStats | None = None, floor: OpSet = RUNTIME_FLOOR, tracing: bool = False):
        super().__init__()
        self.tracing = tracing
        if on_unreachable not in ("raise", "run"):
            raise ValueError(f"on_unreachable must be 'raise' or 'run', not {on_unreachable!r}")
        self.kernels = kernels_for(target, floor)
        self._lowering_now: dict[int, int] = collections.defaultdict(int)  # ops being lowered, nested, by id
        self.use_cache = use_cache
        self.on_unreachable = on_unreachable
        self.stats = stats if stats is not None else EagerStats()
        self._direct_ids = self.kernels.direct_ids
        self._reached = self.stats.reached.by_id

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        key = id(func)
        if key in self._direct_ids:
            counted = self._reached.get(key)
            if counted is None:
                self._reached[key] = [func, 1]
            else:
                counted[1] += 1
            return func(*args, **(kwargs or {}))
        return self.run(func, args, kwargs or {})

    def run(self, op: Any, args: tuple, kwargs: dict) -> Any:
        """``op(*args, **kwargs)`` with only target ops reaching the backend; called with
        this mode off (inside dispatch)."""
        plan = self.kernels.plan(op)
        if plan is None:
            return op(*args, **kwargs)  # the target names aten ops; others (profiler, custom) are the caller's
        if plan.how is How.UNREACHABLE:
            return self._unreachable(plan, args, kwargs)
        key = id(op)
        if self._lowering_now[key] >= _MAX_NESTING:
            return self._unreachable(Plan(How.UNREACHABLE, op, why=_CYCLE), args, kwargs)
        if any(isinstance(t, torch.Tensor) and t.layout != torch.strided for t in _tensor_args(args, kwargs)):
            return self._unreachable(Plan(How.UNREACHABLE, op, why=_SPARSE), args, kwargs)
        self._lowering_now[key] += 1
        try:
            return self._run_plan(plan, args, kwargs)
        finally:
            self._lowering_now[key] -= 1

    def _run_plan(self, plan: Plan, args: tuple, kwargs: dict) -> Any:
        op = plan.op
        self.stats.decomposed.add(op)
        if plan.how is How.DECOMPOSE:
            return self._decompose(plan, args, kwargs)
        if plan.how is How.THROUGH_TWIN:
            return self._through_twin(plan, args, kwargs)
        if plan.how is How.VIEW_IN_PLACE:
            view = self._call(plan.twin, args, kwargs)
            return self._call(aten.as_strided_.default, (args[0], view.size(), view.stride(), view.storage_offset()), {})
        if self.tracing:  # a C++ kernel met by fake tensors would be baked into the graph as a constant
            raise _NotTraceable(op)
        self.stats.uncached.add(op)
        with self:
            if plan.how is How.COMPOSITE_KERNEL:
                return tc.call_backend_kernel(op, _device_of(args, kwargs), *args, **kwargs)
            return plan.decomposition(*args, **kwargs)  # type: ignore[misc]

    def _call(self, op: Any, args: tuple, kwargs: dict) -> Any:
        if id(op) in self._direct_ids:
            self.stats.reached.add(op)
            return op(*args, **kwargs)
        return self.run(op, args, kwargs)

    def _decompose(self, plan: Plan, args: tuple, kwargs: dict) -> Any:
        decomposition: Callable = plan.decomposition  # type: ignore[assignment]
        if not self.use_cache:
            with self:
                out = decomposition(*args, **kwargs)
            if out is NotImplemented:
                if self.tracing:
                    raise _NotTraceable(plan.op)
                return self._unreachable(Plan(How.UNREACHABLE, plan.op, why=_DECLINED), args, kwargs)
            return out
        key, tensors = cache.signature(args, kwargs)
        key = (plan.op, *key)
        graphs = self.kernels.graphs
        graph = graphs.get(key)
        if graph is None:
            self.stats.cache_misses.add(plan.op)
            graph = graphs[key] = cache.trace(self._tracing_call(decomposition), args, kwargs)
            if graph is not cache.UNCACHEABLE:
                for op in cache.ops_of(graph):
                    self.stats.reached.add(op, 0)
        elif graph is not cache.UNCACHEABLE:
            self.stats.cache_hits.add(plan.op)
        if graph is cache.UNCACHEABLE:
            self.stats.uncached.add(plan.op)
            with self:
                out = decomposition(*args, **kwargs)
            if out is NotImplemented:
                return self._unreachable(Plan(How.UNREACHABLE, plan.op, why=_DECLINED), args, kwargs)
            return out
        return graph.forward(*tensors)  # type: ignore[union-attr]

    def _tracing_call(self, decomposition: Callable) -> Callable[[tuple, dict], Any]:
        """The decomposition run under a fresh, uncached mode of the same target, so the
        trace records only the target ops it ends in."""
        def call(args: tuple, kwargs: dict) -> Any:
            with EagerMode(self.kernels.target, use_cache=False, on_unreachable="raise", floor=self.kernels.floor,
                           tracing=True):
                out = decomposition(*args, **kwargs)
            if out is NotImplemented:
                raise _NotTraceable(decomposition)
            return tuple(out) if isinstance(out, tuple) else out  # named tuples do not survive codegen
        return call

    def _through_twin(self, plan: Plan, args: tuple, kwargs: dict) -> Any:
        names = [a.name for a in tc.schema_of(plan.op).arguments]
        bound = dict(zip(names, args), **kwargs)
        destinations = [bound.pop(name) for name in plan.written] if kwargs.keys() & set(plan.written) else None
        if destinations is None:  # in-place: self is both an argument and the destination
            destinations = [bound[plan.written[0]]]
        twin: tc.OpOverload = plan.twin  # type: ignore[assignment]
        twin_names = [a.name for a in tc.schema_of(twin).arguments]
        twin_args = tuple(bound[n] for n in twin_names if n in bound and not _kwarg_only(twin, n))
        twin_kwargs = {n: bound[n] for n in twin_names if n in bound and _kwarg_only(twin, n)}
        result = self._call(twin, twin_args, twin_kwargs)
        results = list(result) if isinstance(result, (tuple, list)) else [result]
        for destination, value in zip(destinations, results):
            if destination.shape != value.shape:
                self._call(aten.resize_.default, (destination, value.shape), {})
            self._call(aten.copy_.default, (destination, value), {})
        if isinstance(result, (tuple, list)):
            return tuple(destinations)
        return destinations[0]

    def _unreachable(self, plan: Plan, args: tuple, kwargs: dict) -> Any:
        source = user_source_line()
        if self.on_unreachable == "raise":
            raise EagerUnreachableError(plan.op, self.kernels.target, plan.why, source)
        lines = self.stats.unreachable.setdefault(plan.op, [])
        if source and source not in lines:
            lines.append(source)
        self.stats.reached.add(plan.op)
        return plan.op(*args, **kwargs)


def _tensor_args(args: tuple, kwargs: dict) -> list:
    found: list[Any] = []
    for value in (*args, *kwargs.values()):
        if isinstance(value, (tuple, list)):
            found.extend(value)
        else:
            found.append(value)
    return found


def _device_of(args: tuple, kwargs: dict) -> torch.device:
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            return value.device
        if isinstance(value, (tuple, list)) and value and isinstance(value[0], torch.Tensor):
            return value[0].device
    device = kwargs.get("device")
    return torch.device(device) if device is not None else torch.get_default_device()


def _kwarg_only(op: tc.OpOverload, name: str) -> bool:
    return any(a.name == name and a.kwarg_only for a in tc.schema_of(op).arguments)


class on(contextlib.ContextDecorator):  # noqa: N801  (reads as pf.eager.on(target))
    """Context manager and decorator: run eagerly on ``target`` (see the module docstring).

    ``session.stats`` (:class:`EagerStats`) accumulates over every entry.
    """

    def __init__(self, target: OpSet, *, use_cache: bool = True, on_unreachable: str = "raise",
                 floor: OpSet = RUNTIME_FLOOR):
        self.target = target
        self.stats = EagerStats()
        self._mode = EagerMode(target, use_cache=use_cache, on_unreachable=on_unreachable, stats=self.stats,
                               floor=floor)
        self._stack: list[contextlib.ExitStack] = []

    def __enter__(self) -> on:
        stack = contextlib.ExitStack()
        stack.enter_context(above_autograd.AutogradKernels(
            self._mode.kernels.lifted, on_call=self._count_lifted))
        stack.enter_context(self._mode)
        self._stack.append(stack)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.pop().close()

    def _count_lifted(self, op: tc.OpOverload) -> None:
        self.stats.above_autograd.add(op)
        self.stats.decomposed.add(op)
