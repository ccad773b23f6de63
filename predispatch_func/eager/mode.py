"""How ``pf.eager.on(target)`` runs an op: as if the backend had only ``target``.

:class:`EagerMode` is a dispatch mode below autograd: it sees every op that
reaches the backend level, the forward ops and the ops autograd's backward
formulas call. Each op in ``target | RUNTIME_FLOOR`` runs as it is; every
other op runs by its :class:`~.plans.Plan`, whose own ops come back through
this mode, so lowering repeats until only target ops run::

    with pf.eager.on(pf.OpSet.core_aten()) as session:
        loss = model(x).sum()
        loss.backward()
    session.stats.decomposed   # which ops the backend was spared, and how often

The same object runs keyed (``keyed=True``, ``session_key``): then it is never
entered as a mode, and kernels on the session's dispatch key call its
:meth:`EagerMode.run` for the ops outside the target only; its ops come back
through that key instead of the mode.

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
import marshal
import zlib
from collections.abc import Callable
from typing import Any

import torch

from .. import _torch_compat as tc
from ..errors import Refusal, UnsupportedError, user_source_line
from ..op_schema import dtype_from_out
from ..opsets import Lowering, OpSet, is_infrastructure
from . import above_autograd, cache
from .floor import RUNTIME_FLOOR
from .persisted_kernels import PersistedKernels
from .plans import How, Plan, check_in_place_cast, check_no_partial_overlap, check_out_as_eager, plan_for
from .stats import EagerStats

aten = torch.ops.aten
_MAX_NESTING = 4  # a decomposition may call its own op again (other arguments); a cycle goes deeper
_CYCLE = ("its lowering leads back to itself (torch's kernel for it calls its out= form, whose functional form "
          "is the op again)")
# In-place ops whose eager kernel grows ``self`` to the result's shape (``addbmm_`` is its out= form
# writing into ``self``, resized as an out= tensor is); every other in-place op through a twin
# refuses a result that does not fit ``self``. Found by running every in-place op_db variant in
# eager (tests/eager/test_eager_assumptions.py pins it).
GROWS_SELF = frozenset({"aten::addbmm_"})
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


def _identity(ops: OpSet) -> list[str] | None:
    """What names the target on disk: its ops, and each user decomposition by its function's code
    (an edited function starts a new file); None (nothing kept on disk) when one has no code."""
    names = sorted(ops.names())
    for op, fn in sorted(ops.decompositions.items(), key=lambda item: str(item[0])):
        code = getattr(fn, "__code__", None)
        if code is None:
            return None
        names.append(f"decomposition {op} = {fn.__module__}.{fn.__qualname__} "
                     f"{zlib.crc32(marshal.dumps(code)):08x}")
    return names


class Kernels:
    """Per target: the plans and the traced kernels, shared by every session on it."""

    def __init__(self, target: OpSet, floor: OpSet):
        self.target, self.floor = target, floor
        self.lowering = Lowering(target | floor, above_autograd=False)
        self.direct = frozenset(target | floor)
        self.direct_ids = frozenset(id(op) for op in self.direct)  # OpOverload hashes in Python: ids do not
        self.plans: dict[int, Plan | None] = {}
        self.graphs: dict[int, dict[tuple, Any]] = {}  # op's id -> signature -> traced kernel
        self.graph_ops: dict[int, tc.OpOverload] = {}  # op's id -> op, for each key of ``graphs``
        # op's id -> signature -> trace of its decomposition, for the ops decomposed above autograd
        self.lifted_graphs: dict[int, dict[tuple, Any]] = {}
        self.persisted = PersistedKernels(_identity(target | floor), self.graphs, self.graph_ops,
                                          self.lifted_graphs)
        self.persisted.restore()
        self.lifted = self._lifted()

    def _lifted(self) -> list[tuple[tc.OpOverload, Callable]]:
        """The ops decomposed above autograd (``above_autograd``), from disk where known."""
        if self.persisted.lifted is None:
            found = above_autograd.ops_to_lift(self.lowering)
            self.persisted.lifted = [op.name() for op, _ in found]
            return found
        ops = [tc.resolve_overload(*name.split("::", 1)) for name in self.persisted.lifted]
        return [(op, above_autograd.lazily(op, self.lowering)) for op in ops if op is not None]

    def lifted_kernels_of(self, op: Any) -> dict[tuple, Any]:
        """The traces of ``op``'s decomposition above autograd by signature (``above_autograd``)."""
        return self._by_signature("lifted_kernels", self.lifted_graphs, op)

    def kernels_of(self, op: Any) -> dict[tuple, Any]:
        """The op's traced kernels by signature (the dict the keyed kernels read); the first ask
        unpickles what the disk holds of the op."""
        return self._by_signature("kernels", self.graphs, op)

    def _by_signature(self, name: str, table: dict[int, dict[tuple, Any]], op: Any) -> dict[tuple, Any]:
        found = table.get(id(op))
        if found is None:
            self.persisted.take(name, op)
            found = table.get(id(op))
        if found is None:
            found = table[id(op)] = {}
            self.graph_ops[id(op)] = op  # the file names each table's entries by op
        return found

    def plan(self, op: Any) -> Plan | None:
        """The op's plan; None for what the target does not govern (bookkeeping, and non-aten ops
        the user gave no decomposition of)."""
        key = id(op)
        if key not in self.plans:
            governed = (isinstance(op, tc.OpOverload) and not is_infrastructure(op)
                        and (op.namespace == "aten" or op in self.lowering.target.decompositions))
            self.plans[key] = plan_for(op, self.lowering) if governed else None
        return self.plans[key]

    def governed_outside(self) -> list[tuple[tc.OpOverload, Plan]]:
        """Every aten op outside ``target | floor`` that can reach a backend (a CompositeImplicitAutograd
        op never does: autograd runs its decomposition), and each other op the user decomposes, with
        its plan: the ops a backend needs kernels for."""
        found = []
        for name in tc.all_op_names():
            namespace, _, rest = name.partition("::")
            op = tc.resolve_overload(namespace, rest) if namespace == "aten" else None
            if op is None or id(op) in self.direct_ids or tc.has_composite_implicit_kernel(op):
                continue
            plan = self.plan(op)
            if plan is not None:
                found.append((op, plan))
        for op in self.lowering.target.decompositions:  # the user's, of ops outside aten
            plan = self.plan(op)
            if op.namespace != "aten" and id(op) not in self.direct_ids and plan is not None:
                found.append((op, plan))
        return found


def _governing_input(args: tuple) -> torch.Tensor | None:
    """The input whose dtype an out= op's twin follows: the first tensor with dimensions, else
    the first tensor. A 0-dim tensor ahead of it (``10000 ** x``: pow.Scalar's CPU kernel calls
    ``pow.Tensor_Tensor_out`` with the number wrapped as an int64 tensor) promotes by its kind
    only, so its dtype says nothing about eager's checks (and sent every such call to the meta
    check: 450 us each, funnel's step 1.5x plain eager)."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    return next((t for t in tensors if t.dim() > 0), tensors[0] if tensors else None)


def kernels_for(target: OpSet, floor: OpSet = RUNTIME_FLOOR) -> Kernels:
    """The kernels of one (target, floor), kept for the process: a later session reuses its traces."""
    return _kernels_for(target, floor)


@functools.lru_cache(maxsize=16)
def _kernels_for(target: OpSet, floor: OpSet) -> Kernels:
    return Kernels(target, floor)


class EagerMode(tc.TorchDispatchMode):
    """The dispatch mode of one session (see the module docstring)."""

    def __init__(self, target: OpSet, *, use_cache: bool = True, on_unreachable: str = "raise",
                 stats: EagerStats | None = None, floor: OpSet = RUNTIME_FLOOR, tracing: bool = False,
                 keyed: bool = False):
        super().__init__()
        self.tracing = tracing
        self.keyed = keyed  # run by kernels on the session's dispatch key (``session_key``), not as a mode
        if on_unreachable not in ("raise", "run"):
            raise ValueError(f"on_unreachable must be 'raise' or 'run', not {on_unreachable!r}")
        self.kernels = kernels_for(target, floor)
        self._lowering_now: dict[int, int] = collections.defaultdict(int)  # ops being lowered, nested, by id
        self.use_cache = use_cache
        self.on_unreachable = on_unreachable
        self.stats = stats if stats is not None else EagerStats()
        self._direct_ids = self.kernels.direct_ids
        self._reached = self.stats.reached.by_id
        self._graphs = self.kernels.graphs
        self._persisted = self.kernels.persisted
        self._decomposed, self._hits = self.stats.decomposed.by_id, self.stats.cache_hits.by_id

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
        by_signature = self._graphs.get(id(op)) if self.use_cache else None
        if by_signature is None and self.use_cache and self._persisted.holds("kernels", op):
            by_signature = self.kernels.kernels_of(op)  # the first call of an op the disk holds
        if by_signature is not None:  # the steady state: a kernel traced for this signature, replayed
            signature, tensors = cache.signature(args, kwargs)
            graph = by_signature.get(signature)
            if graph is not None and graph is not cache.UNCACHEABLE:
                self.count_hit(op)
                return self._replay(graph, tensors)
        plan = self.kernels.plan(op)
        if plan is None:  # the target names aten ops; others (profiler, custom) are the caller's
            return self._as_is(op, args, kwargs)
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
        with self._reentered():
            if plan.how is How.COMPOSITE_KERNEL:
                return tc.call_backend_kernel(op, _device_of(args, kwargs), *args, **kwargs)
            return plan.decomposition(*args, **kwargs)  # type: ignore[misc]

    def _call(self, op: Any, args: tuple, kwargs: dict) -> Any:
        if id(op) in self._direct_ids:
            self.stats.reached.add(op)
            return self._as_is(op, args, kwargs)
        return self.run(op, args, kwargs)

    def _decompose(self, plan: Plan, args: tuple, kwargs: dict) -> Any:
        decomposition: Callable = plan.decomposition  # type: ignore[assignment]
        if not self.use_cache:
            with self._reentered():
                out = decomposition(*args, **kwargs)
            if out is NotImplemented:
                if self.tracing:
                    raise _NotTraceable(plan.op)
                return self._unreachable(Plan(How.UNREACHABLE, plan.op, why=_DECLINED), args, kwargs)
            return out
        key, tensors = cache.signature(args, kwargs)
        graphs = self.kernels.kernels_of(plan.op)
        graph = graphs.get(key)
        if graph is None:
            self.stats.cache_misses.add(plan.op)
            with tc.excluding_spare_key() if self.keyed else contextlib.nullcontext():
                graph = graphs[key] = cache.trace(self._tracing_call(decomposition), args, kwargs)
            if graph is not cache.UNCACHEABLE:
                for op in cache.ops_of(graph):
                    self.stats.reached.add(op, 0)
        elif graph is not cache.UNCACHEABLE:
            self.stats.cache_hits.add(plan.op)
        if graph is cache.UNCACHEABLE:
            self.stats.uncached.add(plan.op)
            with self._reentered():
                out = decomposition(*args, **kwargs)
            if out is NotImplemented:
                return self._unreachable(Plan(How.UNREACHABLE, plan.op, why=_DECLINED), args, kwargs)
            return out
        return self._replay(graph, tensors)

    def count_hit(self, op: Any) -> None:
        """``stats.decomposed.add(op); stats.cache_hits.add(op)``, inlined: once per replay."""
        key = id(op)
        for counter in (self._decomposed, self._hits):
            entry = counter.get(key)
            if entry is None:
                counter[key] = [op, 1]
            else:
                entry[1] += 1

    def _replay(self, graph: Any, tensors: list) -> Any:
        if not self.keyed:
            return graph.run(*tensors)
        with tc.excluding_spare_key():  # target ops only: the backend's, inside and out
            return graph.run(*tensors)

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
        bound = dict(zip(plan.arguments, args), **kwargs)
        in_place = not kwargs.keys() & set(plan.written)
        # in place: self is both an argument and the destination
        destinations = [bound[plan.written[0]]] if in_place else [bound.pop(name) for name in plan.written]
        twin: tc.OpOverload = plan.twin  # type: ignore[assignment]
        taken_from_out = None if in_place else dtype_from_out(plan.op, args, kwargs)
        if taken_from_out is not None:  # a reduction into out= computes in out's dtype, as eager
            bound["dtype"] = taken_from_out
        twin_args = tuple(bound[n] for n in plan.twin_positional if n in bound)
        twin_kwargs = {n: bound[n] for n in plan.twin_keyword if n in bound}
        for destination in destinations:
            if isinstance(destination, torch.Tensor):
                check_no_partial_overlap(destination, (*twin_args, *twin_kwargs.values()))
        result = self._call(twin, twin_args, twin_kwargs)
        results = list(result) if isinstance(result, (tuple, list)) else [result]
        # out= of another dtype than the result or the input: eager's checks, on meta (only then:
        # mixtral's grouped mm writes with mm.out 48 times a step, each check some 100 us)
        first = _governing_input(args)
        cast_refused = not in_place and any(
            isinstance(value, torch.Tensor) and isinstance(destination, torch.Tensor)
            and (value.dtype != destination.dtype or (first is not None and first.dtype != destination.dtype))
            for destination, value in zip(destinations, results)) and check_out_as_eager(plan.op, args, kwargs)
        if (in_place or cast_refused) and isinstance(results[0], torch.Tensor):
            check_in_place_cast(results[0], destinations[0])
        for destination, value in zip(destinations, results):
            if destination.shape != value.shape and in_place and plan.op.name() not in GROWS_SELF:
                raise RuntimeError(f"output with shape {list(destination.shape)} doesn't match the broadcast "
                                   f"shape {list(value.shape)}")
            if destination.shape != value.shape:  # an out= tensor (or GROWS_SELF's self): resized, as eager resizes it
                self._call(aten.resize_.default, (destination, value.shape), {})
            self._call(aten.copy_.default, (destination, value), {})
        if isinstance(result, (tuple, list)):
            return tuple(destinations)
        return destinations[0]

    def _unreachable(self, plan: Plan, args: tuple, kwargs: dict) -> Any:
        source = user_source_line()
        if self.on_unreachable == "raise":
            why = plan.why or self.kernels.lowering.why_missing(str(plan.op))
            raise EagerUnreachableError(plan.op, self.kernels.target, why, source)
        lines = self.stats.unreachable.setdefault(plan.op, [])
        if source and source not in lines:
            lines.append(source)
        self.stats.reached.add(plan.op)
        return self._as_is(plan.op, args, kwargs)

    def _reentered(self) -> Any:
        """Where a decomposition run as Python finds its ops lowered again: inside this mode, or (keyed)
        simply through the dispatcher, whose key sends them back here."""
        return contextlib.nullcontext() if self.keyed else self

    def _as_is(self, op: Any, args: tuple, kwargs: dict) -> Any:
        """``op`` run by the backend: keyed, with the key off for the length of the call, so a
        kernel of the backend that calls other ops (torch's composite ones do) is its own business,
        as it is below a Python mode."""
        if not self.keyed:
            return op(*args, **kwargs)
        with tc.excluding_spare_key():
            return op(*args, **kwargs)


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
