"""Where each CompositeImplicitAutograd op is kept as one node or decomposed.

A composite may stay a single node only if it is honest about its schema:
a ``-> Tensor`` result that is really the input (``type_as`` with a matching
dtype, ``einsum("ij->ji")``) makes functionalization drop every later in-place
op on it. The decision, in order:

1. ops with alias or mutation annotations, or tagged unsafe by torch: decompose
   (``WRITES_ONLY_WHEN``: tagged ops whose writes their arguments decide, kept for
   the calls that write nothing);
2. the user's per-op override (``export(..., composite_overrides=)``);
3. the schema audit's shipped table (``schema_audit``), if it has the op (for
   the few liars whose lie the guard below sees exactly, ``GUARD_DECIDES_PER_CALL``,
   the audit's "decompose" leaves the call to the guard);
4. a trace-time guard: run the op's decomposition on fresh fake tensors with
   the same metadata, and keep the op only if no result shares storage with an
   input and no input's version moved. Cached per op and input metadata: when
   no size is symbolic for the whole process and on disk (``persisted_guards``),
   per export otherwise.

Steps 1-3 depend on the op alone and are decided once per op and export.
Before any of this, :meth:`CompositePolicy.rerouted` may replace the op: by
its honest twin (an op whose schema declares the alias it makes), or by the
C++ composite kernel eager runs where torch's Python one differs.
"""

from __future__ import annotations

import contextlib
import contextvars
import enum
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from .. import _torch_compat as tc
from ..autograd_facts import may_carry_grad
from ..op_schema import takes_dtype_from_out, writes_besides_out
from .out_variants import (
    call_composite_out,
    call_in_out_dtype,
    call_inplace_through_twin,
    inplace_twin,
    is_composite_out,
    twin_writes_undeclared,
)
from .persisted_guards import PersistedVerdicts


class Decision(str, enum.Enum):  # noqa: UP042 (StrEnum would change what str() prints)
    """Keep a composite as one node, or decompose it (equal to its string, as users write it)."""

    KEEP = "keep"
    DECOMPOSE = "decompose"

    def __str__(self) -> str:  # printed as users write it, not as ``Decision.KEEP``
        return self.value


def named_overrides(overrides: dict[Any, Any]) -> dict[str, Decision]:
    """``composite_overrides`` by overload name. A key is an overload or a packet (``torch.ops.aten.
    linear``: each of its overloads), or its name (``"aten.linear.default"``, ``"aten.linear"``); a
    key that names no op, or a decision that is not "keep" or "decompose", is refused: ignoring it
    silently would export a program other than the one asked for."""
    named: dict[str, Decision] = {}
    for key, decision in overrides.items():
        try:
            chosen = Decision(decision)
        except ValueError:
            raise ValueError(f"composite_overrides[{key!r}] = {decision!r}: the decision is 'keep' or "
                             "'decompose'") from None
        for op in _overloads_named(key):
            named[str(op)] = chosen
    return named


def _overloads_named(key: Any) -> list[Any]:
    if isinstance(key, tc.OpOverload):
        return [key]
    packet = key if isinstance(key, tc.OpOverloadPacket) else None
    if isinstance(key, str):
        namespace, _, rest = key.replace("::", ".").partition(".")
        name, _, overload = rest.partition(".")
        found = tc.resolve_overload(namespace, f"{name}.{overload}") if overload else None
        if found is not None:
            return [found]
        if not overload:
            packet = getattr(getattr(torch.ops, namespace, None), name, None) if namespace and name else None
    if isinstance(packet, tc.OpOverloadPacket):
        return [getattr(packet, overload) for overload in packet.overloads()]
    raise ValueError(
        f"composite_overrides: {key!r} names no op torch knows; name an overload as "
        "'aten.linear.default' (or every overload of an op as 'aten.linear'), or pass the op itself "
        "(torch.ops.aten.linear.default)")


# composites export_joint asks to decompose (op name -> why): a kept node whose backward reads
# values the joint program cannot recompute (drawn from random numbers: attention's dropout)
_DECOMPOSED_FOR_THE_BACKWARD: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "decomposed_for_the_backward", default=None)


@contextlib.contextmanager
def decomposed_for_the_backward(reasons: dict[str, str]) -> Iterator[None]:
    """While inside, the composites named in ``reasons`` are decomposed (a user's override wins)."""
    token = _DECOMPOSED_FOR_THE_BACKWARD.set(dict(reasons))
    try:
        yield
    finally:
        _DECOMPOSED_FOR_THE_BACKWARD.reset(token)


AuditLookup = Callable[[tc.OpOverload], "str | None"]  # the audit's "keep" / "decompose"
# the sparse layouts ("sparse_csr", ...) the op accepts but the audit never ran it on
LayoutLookup = Callable[[tc.OpOverload], "Sequence[str]"]


def _guard_key(op: Any, args: tuple, kwargs: dict) -> tuple[Any, bool]:
    """The cache key of a trace-time check: the op and its arguments' metadata, read on the
    tensors below functionalization; and whether any size is symbolic. One walk per call."""
    symbolic = False

    def key(value: Any) -> Any:
        nonlocal symbolic
        if isinstance(value, torch.Tensor):
            value = tc.inner_of_functional(value)
            shape, stride = tuple(value.shape), value.stride()
            symbolic = symbolic or any(isinstance(s, torch.SymInt) for s in (*shape, *stride))
            return ("T", value.dtype, str(shape), str(stride), value.device.type, value.requires_grad)
        if isinstance(value, (list, tuple)):
            return (type(value).__name__, *(key(v) for v in value))
        if isinstance(value, dict):
            return tuple(sorted((k, key(v)) for k, v in value.items()))
        if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            symbolic = True
            return ("S", str(value))
        return ("V", repr(value))

    return (op, key(args), key(kwargs)), symbolic


def _fresh_like(t: torch.Tensor) -> torch.Tensor:
    fresh = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
    return fresh.requires_grad_(t.requires_grad) if may_carry_grad(t) else fresh


def _honest_twins() -> dict[Any, Any]:
    """Kernels whose schema hides an alias, and the op that declares it.

    ``unsafe_split`` returns views of its input under a ``-> Tensor[]`` schema
    (the schema audit finds it lying); ``split`` is the same computation with
    ``Tensor(a)[]``, so functionalization sees the views and writes back.
    ``x.data`` is a storage-sharing alias without autograd history whose
    composite leaves no trace in a functional graph; ``detach`` is the same
    alias as a view op, so a write through it keeps ``x``'s identity (a no_grad
    region) and the alias itself stays non-differentiable, as in eager.
    """
    aten = torch.ops.aten
    return {aten.unsafe_split.Tensor: aten.split.Tensor,
            aten.unsafe_split_with_sizes.default: aten.split_with_sizes.default,
            aten.data.default: aten.detach.default}


def _batch_norm_gather_stats_with_counts(input: Any, mean: Any, invstd: Any, running_mean: Any, running_var: Any,
                                         momentum: float, eps: float, counts: Any) -> Any:
    """``batch_norm_gather_stats_with_counts`` (SyncBatchNorm's merge of every rank's statistics;
    a CUDA kernel) writes the running statistics its schema does not mark (seen on the H200: the
    program held a node writing its buffers). Restated with the writes said: the ranks' means
    weighted by their counts, the variance their pooled sum of squares (the kernel merges them
    one rank after another, Welford's way: equal in exact arithmetic), in the kernel's
    accumulation type; the running statistics updated as the kernel does, from detached values."""
    acc = torch.float32 if mean.dtype in (torch.float16, torch.bfloat16) else mean.dtype
    means, weights = mean.to(acc), counts.to(acc).unsqueeze(1)
    total = weights.sum(0)
    average = (weights * means).sum(0) / total
    var_n = (weights * (invstd.to(acc).reciprocal().square() - eps)).sum(0) + (weights * (means - average).square()).sum(0)
    if running_mean is not None:  # detached rather than under no_grad: after autograd no region can be
        running_mean.copy_(((1 - momentum) * running_mean.to(acc) + momentum * average.detach()).to(running_mean.dtype))
    if running_var is not None:
        running_var.copy_(((1 - momentum) * running_var.to(acc)
                           + momentum * (var_n.detach() / (total - 1))).to(running_var.dtype))
    return average.to(mean.dtype), (var_n / total + eps).rsqrt().to(mean.dtype)


def _batch_norm_update_stats(input: Any, running_mean: Any, running_var: Any, momentum: float) -> Any:
    """``batch_norm_update_stats`` writes the running statistics its schema does not mark (its
    CPU kernel; torch tags nothing and has no decomposition of it: the program held a node
    writing its inputs). Restated with the writes said: the batch's mean and biased variance
    per channel, summed in double as the kernel sums a float tensor, and the running statistics
    updated as the kernel updates them (the unbiased variance), from detached values."""
    dims = [0, *range(2, input.dim())]
    n = input.numel() // input.size(1)
    result_dtype = torch.float32 if input.dtype in (torch.float16, torch.bfloat16) else input.dtype
    acc = torch.float64 if result_dtype == torch.float32 else result_dtype
    mean = (input.to(acc).sum(dims) / n).to(result_dtype)
    centred = input.to(result_dtype) - mean.view([1, -1] + [1] * (input.dim() - 2))
    var_sum = (centred * centred).to(acc).sum(dims)
    if running_mean is not None:  # detached rather than under no_grad: after autograd no region can be
        running_mean.copy_(momentum * mean.detach() + (1 - momentum) * running_mean)
    if running_var is not None:
        running_var.copy_(momentum * (var_sum.detach() / (n - 1)).to(running_var.dtype) + (1 - momentum) * running_var)
    return mean, (var_sum / n).to(result_dtype)


HONEST_TWINS = _honest_twins()

# Composites the audit calls liars whose lie is a function of the call's non-tensor
# arguments and tensor metadata alone, so the trace-time guard (which runs the
# decomposition on fresh fakes with exactly those) tells each honest call from a
# lying one. ``einsum`` aliases its input only for equations that are a permutation
# or a diagonal ("ij->ji", "ii->i"); attention written as einsum never does, and
# decomposing it traced a dozen ops per call (funnel: 1.6x torch.export's time).
GUARD_DECIDES_PER_CALL = frozenset({torch.ops.aten.einsum.default})


def _argument(op: tc.OpOverload, args: tuple, kwargs: dict, name: str) -> Any:
    if name in kwargs:
        return kwargs[name]
    index = next(i for i, a in enumerate(tc.schema_of(op).arguments) if a.name == name)
    return args[index]


def _updates_running_stats(flag: str) -> Callable[[tc.OpOverload, tuple, dict], bool]:
    """Whether a normalisation call writes its running statistics: when ``flag`` (the
    argument saying it normalises by the input's own statistics) is true and they are given."""
    def writes(op: tc.OpOverload, args: tuple, kwargs: dict) -> bool:
        return bool(_argument(op, args, kwargs, flag)) and any(
            _argument(op, args, kwargs, stat) is not None for stat in ("running_mean", "running_var"))
    return writes


# Composites that write inputs their schema does not mark, but only for some values of the
# call's non-tensor arguments, which decide it exactly: op -> "does this call write?". A
# call that writes nothing stays one node, as in torch.export's programs.
# ``batch_norm`` (tagged maybe-aliasing-or-mutating by torch) writes its running
# statistics only when training with them; decomposing the eval-mode call traced four more
# ops per layer (half of a conv net's trace time). ``instance_norm`` (the audit finds it
# writing them) does the same with ``use_input_stats``; decomposing InstanceNorm without
# running statistics, the usual kind, traced five ops for one (raft: 20% of its export).
WRITES_ONLY_WHEN: dict[Any, Callable[[tc.OpOverload, tuple, dict], bool]] = {
    torch.ops.aten.batch_norm.default: _updates_running_stats("training"),
    torch.ops.aten.instance_norm.default: _updates_running_stats("use_input_stats"),
}


def _running_stats_written_by_kernel(op: tc.OpOverload, args: tuple, kwargs: dict) -> bool:
    return bool(_argument(op, args, kwargs, "training")) and _argument(op, args, kwargs, "running_mean") is not None \
        and _argument(op, args, kwargs, "running_var") is not None


def _native_batch_norm_training(input: Any, weight: Any, bias: Any, running_mean: Any, running_var: Any,
                                training: bool, exponential_average_factor: float, epsilon: float) -> Any:
    """The kernel's four results from ``_native_batch_norm_legit``: the fourth, cudnn's reserve
    space, is read only by cudnn's backward, which autograd (above this trace) never calls."""
    out, mean, invstd = torch.ops.aten._native_batch_norm_legit.default(
        input, weight, bias, running_mean, running_var, True, exponential_average_factor, epsilon)
    return out, mean, invstd, input.new_empty((0,), dtype=torch.uint8)


# Kernels that write their running statistics in training although their schema declares no
# write: ``cudnn_batch_norm`` (torch 2.11 and 2.12 decompose ``batch_norm`` into it on CUDA at
# pre-dispatch) and ``miopen_batch_norm``. Traced as is, the program called a functional-looking
# node that wrote its buffer inputs, and the signature lacked those writes. Such a call is traced
# as ``_native_batch_norm_legit``, which declares the writes (functionalized: its functional
# form, the op torch 2.13 on records for CUDA batch norm). Checked on the GPU (tests/cuda/).
# Likewise ``batch_norm_update_stats`` (CPU) and ``batch_norm_gather_stats_with_counts``
# (SyncBatchNorm's, CUDA), which write them whenever they are given: restated with the writes said.
UNDECLARED_STAT_WRITERS: dict[Any, Callable[..., Any]] = {
    **{op: _native_batch_norm_training for op in (torch.ops.aten.cudnn_batch_norm.default,
                                              torch.ops.aten.miopen_batch_norm.default)},
    torch.ops.aten.batch_norm_update_stats.default: _batch_norm_update_stats,
    torch.ops.aten.batch_norm_gather_stats_with_counts.default: _batch_norm_gather_stats_with_counts,
}


def _writes_running_stats(op: tc.OpOverload, args: tuple, kwargs: dict) -> bool:
    """Whether this call of an op of ``UNDECLARED_STAT_WRITERS`` writes: a ``training`` flag decides
    where the op has one (cudnn's, miopen's), else the statistics being given."""
    if any(a.name == "training" for a in tc.schema_of(op).arguments):
        return _running_stats_written_by_kernel(op, args, kwargs)
    return any(_argument(op, args, kwargs, stat) is not None for stat in ("running_mean", "running_var"))


def _batch_norm_as_on_the_gpu(input: Any, weight: Any, bias: Any, running_mean: Any, running_var: Any,
                              training: bool, momentum: float, eps: float, cudnn_enabled: bool) -> Any:
    """``batch_norm`` in training on a GPU, traced as the op that picks its kernel at run time as
    eager's does (cuDNN where it takes the call): ``_batch_norm_with_update``, which declares its
    writes (functionalized: ``_batch_norm_with_update_functional``, the op torch.export records)."""
    return torch.ops.aten._batch_norm_with_update.default(input, weight, bias, running_mean, running_var,
                                                          momentum, eps)[0]


def _batch_norm_as_on_the_cpu(input: Any, weight: Any, bias: Any, running_mean: Any, running_var: Any,
                              training: bool, momentum: float, eps: float, cudnn_enabled: bool) -> Any:
    """``batch_norm`` in training on the CPU, traced as the op eager's composite chain ends in
    (``batch_norm`` -> ``_batch_norm_impl_index`` -> ``native_batch_norm`` ->
    ``_native_batch_norm_legit``, one C++ kernel throughout): the same node, without three
    trips through the trace's Python per layer (a tenth of a training-mode MobileNet's export)."""
    return torch.ops.aten._native_batch_norm_legit.default(input, weight, bias, running_mean, running_var, True,
                                                           momentum, eps)[0]


def _cpu_chain_known(input: Any) -> bool:
    """Where eager's chain is known to end in ``_native_batch_norm_legit``: a CPU input with
    elements (``_batch_norm_impl_index`` takes another path for an empty one; a symbolic size
    keeps the chain, which guards as eager branches), outside autocast (whose casts are chosen
    per op of the chain)."""
    numel = input.numel()
    return input.device.type == "cpu" and type(numel) is int and numel != 0 and not torch.is_autocast_enabled("cpu")


def _training_batch_norm_rerouted(op: Any, args: tuple, kwargs: dict) -> Callable[..., Any] | None:
    """``batch_norm`` writing its running statistics, traced as the op its device's kernel choice
    ends in: on a GPU, torch's composite takes cuDNN or its native kernel, whose statistics differ
    in the last bits (amplified by later layers, by 1e-3 (fp32) at a ResNet's output: found on
    the H200), so the op that chooses at run time; on the CPU the chain's last op, directly."""
    if op is not torch.ops.aten.batch_norm.default or not _running_stats_written_by_kernel(op, args, kwargs):
        return None
    input = _argument(op, args, kwargs, "input")
    if input.device.type == "cuda":
        return _batch_norm_as_on_the_gpu
    return _batch_norm_as_on_the_cpu if _cpu_chain_known(input) else None


class CompositePolicy:
    """Decides keep/decompose for one export; remembers trace-time evidence."""

    __slots__ = ("audit_lookup", "untested_layouts", "overrides", "lowering", "_guard_cache", "_eager_cache", "_by_op",
                 "_reroute_by_op", "decisions")

    def __init__(self, audit_lookup: AuditLookup | None = None,
                 overrides: dict[str, str] | None = None, lowering: Any = None,
                 untested_layouts: LayoutLookup | None = None):
        self.audit_lookup = audit_lookup
        self.untested_layouts = untested_layouts
        self.overrides = named_overrides(overrides or {})
        # an ``opsets.Lowering`` when exporting to a target op set: its composites
        # outside the target are decomposed whatever the audit says
        self.lowering = lowering
        self._guard_cache: dict[Any, str | None] = {}
        self._eager_cache: dict[Any, bool] = {}
        self._by_op: dict[tc.OpOverload, bool | str | None] = {}
        self._reroute_by_op: dict[Any, tuple[Callable[..., Any] | None, bool, Callable[..., Any] | None]] = {}
        # op name -> (decision, why); read by the CLI and tests
        self.decisions: dict[str, tuple[Decision, str]] = {}

    def should_decompose(self, op: tc.OpOverload, args: tuple, kwargs: dict) -> bool:
        if op not in self._by_op:  # everything that depends on the op alone, once per op
            self._by_op[op] = self._decide_by_op(op)
        fixed = self._by_op[op]
        writes = WRITES_ONLY_WHEN.get(op)
        if writes is not None and fixed is not True:  # not even a user's "keep" keeps a call that writes
            if writes(op, args, kwargs):
                return self._record(op, Decision.DECOMPOSE, "this call writes an input its schema does not mark")
            return False if fixed is False else self._record(op, Decision.KEEP, "writes nothing for these arguments")
        if isinstance(fixed, bool):
            return fixed
        untested = self._untested_layout(op, args, kwargs)
        if untested is not None:  # the audit's "keep" holds only for the layouts it ran
            return self._record(op, Decision.DECOMPOSE, f"the schema audit never ran it on {untested} inputs")
        lie = self._trace_time_lie(op, args, kwargs)
        if lie is not None:
            return self._record(op, Decision.DECOMPOSE, lie)
        return self._record(op, Decision.KEEP, "audit" if fixed == Decision.KEEP else "trace-time guard")

    def _decide_by_op(self, op: tc.OpOverload) -> bool | str | None:
        """True/False when the op alone decides; else the audit's answer, for the guard."""
        if not tc.has_composite_implicit_kernel(op):
            # without a composite kernel there is nothing to decompose into (torch's
            # OpOverload.decompose returns NotImplemented) unless torch registered a Python
            # one; answering False spares re-entering the mode for every view op
            return tc.has_python_composite(op) and bool(tc.torch_would_decompose(op, pre_dispatch=True))
        if self.lowering is not None and self.lowering.forces_decomposition(op):
            return self._record(op, Decision.DECOMPOSE, "not in the target op set")
        schema = tc.schema_of(op)
        if schema.is_mutable or any(a.alias_info for a in schema.arguments):
            return self._record(op, Decision.DECOMPOSE, "schema declares aliasing or mutation")
        if tc.torch_tags_unsafe(op) and op not in WRITES_ONLY_WHEN:
            return self._record(op, Decision.DECOMPOSE, "torch tags it maybe aliasing or mutating")
        name = str(op)
        if name in self.overrides:
            return self._record(op, self.overrides[name], "user override")
        for_the_backward = (_DECOMPOSED_FOR_THE_BACKWARD.get() or {}).get(name)
        if for_the_backward is not None:
            return self._record(op, Decision.DECOMPOSE, for_the_backward)
        audited = self.audit_lookup(op) if self.audit_lookup is not None else None
        if audited == Decision.DECOMPOSE and op not in GUARD_DECIDES_PER_CALL and op not in WRITES_ONLY_WHEN:
            return self._record(op, Decision.DECOMPOSE, "schema audit")
        return audited

    def rerouted(self, op: Any, args: tuple, kwargs: dict) -> Callable[..., Any] | None:
        """What to trace instead of ``op`` (None: ``op`` itself): eager's C++ composite kernel
        when that is what eager runs and ``op`` is decomposed, its honest twin, or its lowering
        to the target op set."""
        if op not in self._reroute_by_op:  # every op takes this path: the op-only part once per op
            self._reroute_by_op[op] = self._reroute_of_op(op)
        twin, may_run_eager_kernel, otherwise = self._reroute_by_op[op]
        if twin is not None:
            return twin
        if op in UNDECLARED_STAT_WRITERS and _writes_running_stats(op, args, kwargs):
            return UNDECLARED_STAT_WRITERS[op]
        batch_norm = _training_batch_norm_rerouted(op, args, kwargs)
        if batch_norm is not None:
            return batch_norm
        # decided first: the eager-kernel check runs the decomposition on the call's fakes, and a
        # kept op's decomposition must not leave its guards behind (pad_sequence's C++ kernel
        # reads its sizes as ints: a dynamic dim specialised to the example's size)
        if may_run_eager_kernel and self.should_decompose(op, args, kwargs) \
                and self.needs_eager_kernel(op, args, kwargs):
            return functools.partial(tc.decompose_like_eager, op)
        return otherwise

    def _reroute_of_op(self, op: Any) -> tuple[Callable[..., Any] | None, bool, Callable[..., Any] | None]:
        """What :meth:`rerouted` decides from the op alone: its honest twin, whether eager's
        kernel may differ from torch's Python composite, and the reroute otherwise."""
        if is_composite_out(op) or writes_besides_out(op) or twin_writes_undeclared(op):
            otherwise: Callable[..., Any] | None = lambda *a, **k: call_composite_out(op, a, k)  # noqa: E731
        else:
            otherwise = self._through_inplace_twin(op) or self._lowered(op)
            if otherwise is None and takes_dtype_from_out(op):
                otherwise = lambda *a, **k: call_in_out_dtype(op, a, k)  # noqa: E731
        return HONEST_TWINS.get(op), _has_two_composites(op), otherwise

    def rerouted_after_autograd(self, op: Any, args: tuple, kwargs: dict) -> Callable[..., Any] | None:
        """The same with ``pre_dispatch=False``, where autograd already chose the kernels."""
        if writes_besides_out(op) or twin_writes_undeclared(op):
            return lambda *a, **k: call_composite_out(op, a, k, after_autograd=True)
        if op in UNDECLARED_STAT_WRITERS and _writes_running_stats(op, args, kwargs):
            return UNDECLARED_STAT_WRITERS[op]
        in_out_dtype = (lambda *a, **k: call_in_out_dtype(op, a, k)) if takes_dtype_from_out(op) else None
        return HONEST_TWINS.get(op) or self._through_inplace_twin(op) or self._lowered(op) or in_out_dtype

    @staticmethod
    def _through_inplace_twin(op: Any) -> Callable[..., Any] | None:
        """An in-place composite, or an in-place op functionalization has no kernel for, as its
        functional twin plus a write into ``self``."""
        twin = inplace_twin(op)
        return None if twin is None else (lambda *a, **k: call_inplace_through_twin(op, twin, a, k))

    def _lowered(self, op: Any) -> Callable[..., Any] | None:
        """The lowering of an op outside the target op set, traced in this mode."""
        return self.lowering.functional_decomposition(op) if self.lowering is not None else None

    def needs_eager_kernel(self, op: tc.OpOverload, args: tuple, kwargs: dict) -> bool:
        """Decompose with the C++ kernel eager runs, not torch's Python one?

        torch's Python composite for ``dropout`` clones where eager returns the
        input (``train=False``, ``p=0``), so a later in-place op would miss the
        input. When eager's kernel aliases or writes an input for these
        arguments (checked on fresh fakes, cached), trace that kernel instead.
        """
        if not _has_two_composites(op):
            return False
        key, symbolic = _guard_key(op, args, kwargs)
        cache = self._eager_cache if symbolic else _STATIC_EAGER_KERNELS
        if key not in cache:
            inner_args, inner_kwargs = _inner(args, kwargs)
            try:
                cache[key] = _run_decomposition_and_watch(
                    op, inner_args, inner_kwargs, kernel=tc.decompose_like_eager) is not None
            except RuntimeError:  # eager's kernel reads an input's data (tensor_split with a
                # tensor of indices): it cannot be traced at all, torch's Python composite can
                cache[key] = False
        return cache[key]

    def _untested_layout(self, op: tc.OpOverload, args: tuple, kwargs: dict) -> str | None:
        untested = set(self.untested_layouts(op)) if self.untested_layouts is not None else set()
        if not untested:
            return None
        layouts = {t.layout for t in tc.pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        if layouts <= {torch.strided}:
            return None
        return next((name for name in sorted(str(lay).removeprefix("torch.") for lay in layouts)
                     if name in untested), None)

    def _record(self, op: tc.OpOverload, decision: Decision, why: str) -> bool:
        self.decisions.setdefault(str(op), (decision, why))
        return decision is Decision.DECOMPOSE

    def _trace_time_lie(self, op: tc.OpOverload, args: tuple, kwargs: dict) -> str | None:
        key, symbolic = _guard_key(op, args, kwargs)
        casting = _autocast_casting(args, kwargs)
        if casting:  # the check runs through autocast's casts: another verdict, held apart
            key, symbolic = (key, casting), True
        cache = self._guard_cache if symbolic else _STATIC_GUARDS
        if key not in cache:
            kernel = _dispatched_through_autocast if casting else None
            cache[key] = _run_decomposition_and_watch(op, *_inner(args, kwargs), kernel=kernel)
        return cache[key]


# Guard results for inputs without symbolic sizes depend only on the op and the
# key's metadata, so they hold for every export of this process, and of later
# processes on the same torch build (kept on disk for aten ops).
_STATIC_GUARDS = PersistedVerdicts("composite-guards")
_STATIC_EAGER_KERNELS = PersistedVerdicts("eager-kernel-checks")  # the same for needs_eager_kernel


def _has_two_composites(op: Any) -> bool:
    """A C++ composite kernel (eager's) and a Python one (what tracing runs)."""
    return isinstance(op, tc.OpOverload) and tc.has_python_composite(op) and tc.has_composite_implicit_kernel(op)


def _inner(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The arguments below functionalization (the fake tensors the checks run on)."""
    return tc.pytree.tree_map_only(tc.FunctionalTensor, tc.inner_of_functional, (args, kwargs))


def _autocast_casting(args: tuple, kwargs: dict) -> tuple:
    """The autocast regions enabled for the devices of the tensor arguments: (device, dtype)."""
    devices = {t.device.type for t in tc.pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
    return tuple((device, dtype) for device, (enabled, dtype) in sorted(tc.autocast_state().items())
                 if enabled and device in devices)


def _dispatched_through_autocast(op: tc.OpOverload, *args: Any, **kwargs: Any) -> Any:
    """``op`` called from the top of the dispatcher: autocast casts its arguments as eager
    does (a kept ``conv2d`` of a bf16 activation and fp32 weights), then its composite
    kernel runs. Calling the composite kernel directly skips the casts and fails on
    arguments that eager never gives it."""
    return op(*args, **kwargs)


def _run_decomposition_and_watch(op: tc.OpOverload, args: tuple, kwargs: dict,
                                 kernel: Callable[..., Any] | None = None) -> str | None:
    """Run ``op``'s decomposition (or ``kernel``) on fresh fakes; describe any alias or mutation."""
    tensors = [t for t in tc.pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    fake_mode = tc.fake_mode_of(tensors)
    if fake_mode is None:
        return None
    with tc.below_pre_dispatch(), fake_mode, tc.discarding_unbacked_symbols(fake_mode):
        fresh_args, fresh_kwargs = tc.pytree.tree_map_only(torch.Tensor, _fresh_like, (args, kwargs))
        fresh = [t for t in tc.pytree.tree_leaves((fresh_args, fresh_kwargs)) if isinstance(t, torch.Tensor)]
        versions = [tc.version_of(t) for t in fresh]
        storages = {key: i for i, t in enumerate(fresh) if (key := _storage_key(t)) is not None}
        out = (kernel or type(op).decompose)(op, *fresh_args, **fresh_kwargs)
        if out is NotImplemented:
            return None
        for i, t in enumerate(fresh):
            if tc.version_of(t) != versions[i]:
                return f"decomposition writes input {i}"
        for j, o in enumerate(tc.pytree.tree_leaves(out)):
            if isinstance(o, torch.Tensor):
                key = _storage_key(o)
                if key is None:  # decomposing is right whatever it aliases
                    return f"result {j} is {o.layout}: what it aliases cannot be checked"
                hit = storages.get(key)
                if hit is not None:
                    return f"result {j} aliases input {hit}"
    return None


def _storage_key(t: torch.Tensor) -> Any:
    """The tensor's storage, or None for a layout without one (sparse)."""
    return tc.StorageWeakRef(t.untyped_storage()) if t.layout == torch.strided else None
