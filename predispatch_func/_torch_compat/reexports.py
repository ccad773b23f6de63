"""Private torch names: re-exported, or wrapped in a line or two.

What breaks here on a torch upgrade breaks loudly: a name that moved fails at
import (module top) or, for the names imported lazily (slow modules, or only
some commands need them), in ``tests/torch_compat/test_torch_assumptions.py``, which
resolves every private name this package reaches for.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch._dynamo.exc import UserError as TorchUserError
from torch._dynamo.exc import UserErrorType as TorchUserErrorType
from torch._ops import HigherOrderOperator, OpOverload, OpOverloadPacket
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch._subclasses.functional_tensor import FunctionalTensor, FunctionalTensorMode
from torch.export.dynamic_shapes import _IntWrapper as IntInputWrapper
from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing, make_fx
from torch.fx.experimental.symbolic_shapes import ConstraintViolationError, GuardOnDataDependentSymNode, ShapeEnv
from torch.fx.passes.runtime_assert import insert_deferred_runtime_asserts
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._sympy.numbers import int_oo as INT_OO

__all__ = [  # the private names the rest of the package uses as they are, then our wrappers
    "INT_OO", "IntInputWrapper", "FakeTensor", "FakeTensorMode", "FunctionalTensor", "FunctionalTensorMode",
    "FUNCTIONAL_MODE_ASKS_CAN_DECOMPOSE", "HigherOrderOperator", "OpOverload", "OpOverloadPacket", "ShapeEnv", "StorageWeakRef", "disable_proxy_modes_tracing", "make_fx",
    "pytree", "TORCH_INTERNAL_ANNOTATIONS", "TorchUserError", "TorchUserErrorType", "ConstraintViolationError",
    "insert_deferred_runtime_asserts", "GuardOnDataDependentSymNode", "recompute_unbacked_bindings",
    "has_composite_implicit_kernel",
    "is_module_backward_hook_function",
    "module_backward_hooks",
    "has_autocast_kernel",
    "autocast_casts_of",
    "calls_after_autocast",
    "written_arguments",
    "written_values",
    "graph_module_flat_inputs",
    "dtensor_local_shard",
    "dtensor_around",
    "FsdpUnit",
    "fsdp_units",
    "fsdp_forward_hook_handles",
    "functional_all_gather",
    "functional_reduce_scatter",
    "has_fbgemm",
    "has_sparse_kernel",
    "sparse_components",
    "has_functionalize_kernel",
    "has_python_composite",
    "decompose_like_eager",
    "torch_tags_unsafe",
    "schema_of",
    "version_of",
    "overload_name",
    "check",
    "module_parameters",
    "module_buffers",
    "non_persistent_buffer_names",
    "opinfo_db",
    "to_functional",
    "inner_of_functional",
    "fresh_inner_of_functional",
    "value_forced_by_guards",
    "has_kernel",
    "has_data_mutation",
    "fake_mode_of",
    "fake_dispatch_cache",
    "fake_dispatch_key",
    "fake_dispatch_key_parts",
    "fake_dispatch_record_classes",
    "shape_env_of",
    "discarding_unbacked_symbols",
    "SET_GRAD_ENABLED",
    "PROFILER_RANGE_OPS",
    "ENTER_AUTOCAST",
    "EXIT_AUTOCAST",
    "reparametrize",
    "fake_tensor_leak_check_requested",
    "module_inputs_flattened",
    "proxy_node_in",
    "value_behind_functional",
    "is_bare_functional_wrapper",
    "rename_node",
    "value_range",
    "symbol_range",
    "narrow_symbol_range", "relate_symbol", "phantom_symbol", "divisibility_guards", "record_guard", "divisible_by",
    "proxy_node_of",
    "is_functional_base",
    "storage_key",
    "last_recorded_call_source",
    "autocast_enabled_anywhere",
    "canonical_key_padding_mask",
    "set_version",
    "keep_calls_in_torch_dead_code_elimination",
    "storage_mutation_count",
    "torch_aot_export_module",
    "all_op_names",
    "resolve_overload",
    "torch_tag_maybe_aliasing",
    "function_has_setup_context",
    "current_proxy_tracer",
    "torch_function_modes_off",
    "stack_trace_anchors",
    "autocast_state",
    "all_higher_order_ops",
    "active_functional_mode",
    "core_aten_decomposition_table",
    "aten_decomposition_table",
    "prims_decomposition_ops",
    "wrap_submodules_with_tracepoints",
    "is_export_tracepoint",
    "collect_tracepoints",
    "UNCAPTURED_HOP_ERROR",
    "dynamo_is_capturing",
    "HopRules",
    "TorchDispatchMode",
    "is_traceable_wrapper_subclass",
    "memory_is_torchs",
    "ACCESS_SUBCLASS_INNER_TENSOR",
    "is_flat_apply",
    "backend_has_kernel",
    "has_composite_explicit_kernel",
    "call_backend_kernel",
    "SPARE_KEY", "spare_key_active", "including_spare_key", "excluding_spare_key", "registrations_on_key",
    "fall_through_spare_key", "PYTHON_FALLBACK_ON_SPARE_KEY",
    "entry_point",
    "math_attention_allowed",
]


# whether FunctionalTensorMode's dispatch asks its method ``_can_decompose(func, args, kwargs)``
# whether to decompose a composite (torch 2.12 on), which our mode overrides; torch 2.11
# decides in a closure inside ``__torch_dispatch__``, so our mode decides before calling it
FUNCTIONAL_MODE_ASKS_CAN_DECOMPOSE = hasattr(FunctionalTensorMode, "_can_decompose")


# the keys torch's ``@torch._disable_dynamo`` wrappers put in ``node.meta["custom"]`` of every
# node traced under them while ``torch.compiler.is_exporting()`` (torch/_dynamo/eval_frame.py)
TORCH_INTERNAL_ANNOTATIONS = frozenset({"_torchdynamo_disable", "_torchdynamo_disable_recursive",
                                        "_torchdynamo_disable_method"})


def has_composite_implicit_kernel(op: torch._ops.OpOverload) -> bool:
    """True when ``op`` runs a CompositeImplicitAutograd decomposition."""
    return torch._C._dispatch_has_kernel_for_dispatch_key(
        op.name(), torch._C.DispatchKey.CompositeImplicitAutograd
    )


class _CastsSeen(Exception):
    pass


# what autocast casts with (autocast_mode.h: cached_cast)
_AUTOCAST_CASTS = frozenset((torch.ops.aten._to_copy.default, torch.ops.aten._autocast_to_reduced_precision.default,
                             torch.ops.aten._autocast_to_full_precision.default))


def autocast_casts_of(op: OpOverload, args: tuple, kwargs: dict) -> dict[int, Any]:
    """The dtype autocast casts each tensor argument of ``op`` to, ``id(tensor) -> dtype``:
    ``op`` is called through the dispatcher and stopped at the first call after autocast's
    casts (its kernel never runs)."""
    casts: dict[int, Any] = {}

    class RecordingCasts(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
            kwargs = kwargs or {}
            if func in _AUTOCAST_CASTS:
                out = func(*args, **kwargs)
                if out.dtype != args[0].dtype:
                    casts.setdefault(id(args[0]), out.dtype)
                return out
            if func.namespace == "prim":  # a tensor subclass asked for its device or layout
                return func(*args, **kwargs)
            raise _CastsSeen

    try:
        with RecordingCasts():
            op(*args, **kwargs)
    except _CastsSeen:
        pass
    return casts


def calls_after_autocast(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, list[tuple]]:
    """``fn(*args, **kwargs)`` and the ops it runs as they reach the kernels, autocast's casts
    applied: ``(op, dtypes of its tensor arguments)``, casts themselves left out."""
    calls: list[tuple] = []

    class RecordingCalls(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
            kwargs = kwargs or {}
            if func not in _AUTOCAST_CASTS and func.namespace != "prim":
                calls.append((func, tuple(t.dtype for t in pytree.tree_leaves((args, kwargs))
                                          if isinstance(t, torch.Tensor))))
            return func(*args, **kwargs)

    with RecordingCalls():
        out = fn(*args, **kwargs)
    return out, calls


_AUTOCAST_KEYS = {"cuda": "AutocastCUDA", "cpu": "AutocastCPU"}


def has_autocast_kernel(op: torch._ops.OpOverload, device_type: str) -> bool:
    """True when autocast casts ``op``'s arguments by a policy of its own on ``device_type``
    (not the fallthrough every op meets)."""
    return torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), _AUTOCAST_KEYS[device_type])


_SPARSE_KEYS = {torch.sparse_coo: "SparseCPU", torch.sparse_csr: "SparseCsrCPU", torch.sparse_csc: "SparseCsrCPU",
                torch.sparse_bsr: "SparseCsrCPU", torch.sparse_bsc: "SparseCsrCPU"}


def has_sparse_kernel(op: torch._ops.OpOverload, layout: torch.layout) -> bool:
    """True when ``op`` registers a CPU kernel for tensors of sparse ``layout``."""
    key = getattr(torch._C.DispatchKey, _SPARSE_KEYS[layout])
    return torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), key)


def has_fbgemm() -> bool:
    """Whether this build has fbgemm and this CPU can run it: torch lists the engine only
    then. (No ``torch._C._has_fbgemm`` exists on 2.13 to 2.15; the probe is this list.)"""
    return "fbgemm" in torch.backends.quantized.supported_engines


def sparse_components(t: torch.Tensor) -> list[torch.Tensor]:
    """The strided tensors that hold a tensor's data: itself when strided; indices and
    values of a sparse COO tensor; compressed indices, plain indices and values of a
    CSR/CSC/BSR/BSC one (without coalescing or copying)."""
    if t.layout == torch.strided:
        return [t]
    if t.layout == torch.sparse_coo:
        return [t._indices(), t._values()]
    if t.layout in (torch.sparse_csr, torch.sparse_bsr):
        return [t.crow_indices(), t.col_indices(), t.values()]
    if t.layout in (torch.sparse_csc, torch.sparse_bsc):
        return [t.ccol_indices(), t.row_indices(), t.values()]
    return []


def has_functionalize_kernel(op: torch._ops.OpOverload) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), torch._C.DispatchKey.Functionalize)


def has_python_composite(op: torch._ops.OpOverload) -> bool:
    """torch registered a Python CompositeImplicitAutograd kernel, which tracing
    runs instead of the C++ one eager runs (dropout: clone vs. return input)."""
    return torch._C.DispatchKey.CompositeImplicitAutograd in op.py_kernels


def decompose_like_eager(op: torch._ops.OpOverload, *args: Any, **kwargs: Any) -> Any:
    """Run ``op``'s C++ composite kernel (the one eager runs), skipping Python overrides."""
    return op._op_dk(torch._C.DispatchKey.CompositeImplicitAutograd, *args, **kwargs)


def torch_tags_unsafe(op: torch._ops.OpOverload) -> bool:
    """torch's ``maybe_aliasing_or_mutating`` tag, which it always decomposes."""
    from torch._decomp import _should_decompose_because_unsafe_op

    return bool(_should_decompose_because_unsafe_op(op))


def schema_of(op: Any) -> Any:
    """``op``'s FunctionSchema (None for a higher-order op or a Python callable)."""
    return getattr(op, "_schema", None)


def written_arguments(op: Any) -> tuple[tuple[int, str], ...]:
    """(position, name) of each argument ``op``'s schema marks written, in schema order; ()
    for an op that writes nothing or has no schema. Decided once per op."""
    found = _WRITTEN_ARGUMENTS.get(op)
    if found is None:
        schema = schema_of(op)
        found = _WRITTEN_ARGUMENTS[op] = () if schema is None or not schema.is_mutable else tuple(
            (i, a.name) for i, a in enumerate(schema.arguments) if a.alias_info is not None and a.alias_info.is_write)
    return found


_WRITTEN_ARGUMENTS: dict[Any, tuple[tuple[int, str], ...]] = {}


def written_values(op: Any, args: tuple, kwargs: dict) -> list[Any]:
    """What a call of ``op`` passes for the arguments it writes, positionally or by name
    (``out=`` is keyword-only)."""
    return [args[i] if i < len(args) else kwargs[name] for i, name in written_arguments(op)
            if i < len(args) or name in kwargs]


def version_of(t: torch.Tensor) -> int:
    """The tensor's in-place write counter (autograd's saved-tensor check reads it)."""
    return int(t._version)


def overload_name(op: OpOverload) -> str:
    return str(op._overloadname)


def check(cond: Any) -> None:
    """``torch._check``: assert a (symbolic) condition, recording it as a shape guard."""
    torch._check(cond)


def module_parameters(module: torch.nn.Module) -> dict[str, Any]:
    """The module's own parameters by local name, as it holds them now (no recursion)."""
    return module._parameters


def module_buffers(module: torch.nn.Module) -> dict[str, Any]:
    """The module's own buffers by local name, as it holds them now (no recursion)."""
    return module._buffers


def non_persistent_buffer_names(module: torch.nn.Module) -> set[str]:
    """Local names of the module's own buffers registered with ``persistent=False``."""
    return set(getattr(module, "_non_persistent_buffers_set", ()))


def opinfo_db() -> list[Any]:
    """torch's OpInfo database (``torch.testing._internal``; slow to import)."""
    from torch.testing._internal.common_methods_invocations import op_db

    return list(op_db)


def torch_function_modes_off() -> Any:
    """A context in which tensor methods skip every torch-function mode: for our own reads of
    tensor metadata inside the trace, which the tracer's modes would see and record nothing for."""
    return torch._C.DisableTorchFunction()


def to_functional(t: torch.Tensor) -> torch.Tensor:
    """``t`` wrapped for the active FunctionalTensorMode. The wrapper's construction reads
    ``t``'s metadata a dozen times; under the tracer each read would pass through its two
    torch-function modes, which record nothing for them (three quarters of the cost of
    wrapping a model's parameters). tests/torch_compat pins that the modes are bypassed."""
    with torch_function_modes_off():
        return FunctionalTensor.to_functional(t)


def inner_of_functional(t: Any) -> Any:
    """The latest value behind a FunctionalTensor (after syncing pending views)."""
    if not isinstance(t, FunctionalTensor):
        return t
    torch._sync(t)
    return torch._from_functional_tensor(t.elem)


def fresh_inner_of_functional(t: Any) -> Any:
    """The value behind a FunctionalTensor just made by an op, without syncing: nothing is
    pending on it yet, and a sync would replay a view (new nodes) where the trace did not."""
    if not isinstance(t, FunctionalTensor):
        return t
    return torch._from_functional_tensor(t.elem)


def is_bare_functional_wrapper(t: Any) -> bool:
    """``t`` is the C++ functional wrapper a FunctionalTensor holds (its ``elem``), met outside it."""
    return isinstance(t, torch.Tensor) and not isinstance(t, FunctionalTensor) and torch._is_functional_tensor(t)


def value_behind_functional(t: Any) -> Any:
    """The value a FunctionalTensor wraps, as it is (no sync: safe outside the trace)."""
    return torch._from_functional_tensor(t.elem) if isinstance(t, FunctionalTensor) else t


def memory_is_torchs(t: torch.Tensor) -> bool:
    """``t``'s memory is torch's own, its data pointer readable: not a ``__torch_dispatch__``
    subclass's (a wrapper subclass's storage has no data; its class decides what its writes do)
    nor functionalization's. Eager's memory checks (overlap) apply only to such tensors."""
    keys = torch._C._dispatch_keys(t)
    return not (keys.has(torch._C.DispatchKey.Python) or keys.has(torch._C.DispatchKey.Functionalize))


# torch.export's op for an inner tensor of a traceable subclass (``t.a`` of a TwoTensor): its
# Python and Autograd kernels return the attribute itself (torch/export/custom_ops.py)
ACCESS_SUBCLASS_INNER_TENSOR = torch.ops.export.access_subclass_inner_tensor.default


def is_flat_apply(target: Any) -> bool:
    """``target`` is torch's ``flat_apply`` HOP (a subclass built in forward, rebuilt by the program)."""
    from torch._higher_order_ops.flat_apply import flat_apply

    return target is flat_apply


def has_kernel(op: OpOverload) -> bool:
    return torch._C._dispatch_has_kernel(op.name())


def has_data_mutation(t: FunctionalTensor) -> bool:
    torch._sync(t)
    return bool(torch._functionalize_has_data_mutation(t.elem))  # type: ignore[attr-defined]


def fake_mode_of(tensors: list[Any]) -> FakeTensorMode | None:
    return torch._guards.detect_fake_mode(tensors)


def shape_env_of(fake_mode: FakeTensorMode | None) -> ShapeEnv | None:
    """The shape env of a fake mode (None for a static trace or no mode)."""
    return getattr(fake_mode, "shape_env", None)


def discarding_unbacked_symbols(fake_mode: FakeTensorMode) -> Any:
    """Unbacked symbols (``.item()``) made inside are thrown away, not pending
    for the trace's outputs: for trial runs whose results are dropped."""
    env = fake_mode.shape_env
    return env.ignore_fresh_unbacked_symbols() if env is not None else contextlib.nullcontext()


SET_GRAD_ENABLED = torch._C._set_grad_enabled


# the ops torch.profiler.record_function records in a trace (the range's start, with its
# ScriptObject handle, and its end)
PROFILER_RANGE_OPS = frozenset((torch.ops.profiler._record_function_enter.default,
                                torch.ops.profiler._record_function_enter_new.default,
                                torch.ops.profiler._record_function_exit._RecordFunction))
ENTER_AUTOCAST = torch.amp.autocast_mode._enter_autocast


EXIT_AUTOCAST = torch.amp.autocast_mode._exit_autocast


def reparametrize(module: torch.nn.Module, tensors: dict[str, torch.Tensor]):
    """Temporarily swap named tensors (params, buffers, plain tensor attributes)."""
    from torch.nn.utils.stateless import _reparametrize_module

    return _reparametrize_module(module, tensors, tie_weights=True, strict=False)


def rename_node(node: torch.fx.Node, wanted: str) -> None:
    """Rename an fx node, letting the graph's namespace resolve clashes."""
    node._rename(wanted)


def value_range(lower: Any, upper: Any) -> Any:
    from torch.utils._sympy.value_ranges import ValueRanges

    return ValueRanges(lower, upper)


def symbol_range(env: ShapeEnv, symbol: Any) -> Any:
    return env.var_to_range[symbol]


def narrow_symbol_range(env: ShapeEnv, symbol: Any, lower: int, upper: Any) -> None:
    env.constrain_symbol_range(symbol, compiler_min=lower, compiler_max=upper)


def record_guard(env: ShapeEnv, expr: Any) -> None:
    """Keep ``expr`` among the trace's guards, which ``ep.module()`` checks on every call
    (``Guard failed: ...``), where it holds by construction (a relation we imposed) and so
    would never be guarded by evaluating it."""
    from torch.fx.experimental.symbolic_shapes import ShapeGuard

    env.guards.append(ShapeGuard(expr, env._get_sloc(), size_oblivious=False))


def divisible_by(expr: Any, k: int) -> Any:
    """``Eq(expr % k, 0)`` in the form torch's shape guards print."""
    import sympy
    from torch.utils._sympy.functions import Mod

    return sympy.Eq(Mod(expr, k), 0)


def divisibility_guards(env: ShapeEnv) -> list[tuple[Any, int, int]]:
    """(symbol, k, c) for each guard ``Eq(Mod(symbol + c, k), 0)`` the trace made (``reshape(-1, k)``,
    ``y.shape[0] % 3 == 0`` of a size ``x.shape[0] + 1``)."""
    import sympy
    from torch.utils._sympy.functions import Mod

    out = []
    for guard in env.guards:
        expr = guard.expr
        if isinstance(expr, sympy.Eq) and expr.rhs == 0 and isinstance(expr.lhs, (Mod, sympy.Mod)):
            base, k = expr.lhs.args
            base = sympy.expand(base.xreplace(env.replacements))  # a size related to another after the guard
            symbols = base.free_symbols
            if len(symbols) == 1 and k.is_Integer:
                (symbol,) = symbols
                offset = base - symbol
                if offset.is_Integer:
                    out.append((symbol, int(k), int(offset)))
    return out


def value_forced_by_guards(env: ShapeEnv, symbol: Any) -> int | None:
    """The one size of ``symbol`` that an equality guard of the trace on it alone allows
    (``Eq(2*s - 12, s)``: 12), which the shape env kept as a guard instead of replacing the
    symbol with it; None if no such guard."""
    import sympy

    for guard in env.guards:
        expr = guard.expr
        if isinstance(expr, sympy.Eq) and expr.free_symbols == {symbol} \
                and (expr.lhs - expr.rhs).is_polynomial(symbol):  # not Mod(s, 3) == 0: a divisibility
            solutions = sympy.solve(expr, symbol)
            if len(solutions) == 1 and solutions[0].is_Integer:
                return int(solutions[0])
    return None


def relate_symbol(env: ShapeEnv, symbol: Any, expr: Any) -> None:
    """Make ``symbol`` stand for ``expr`` everywhere in ``env`` (a derived Dim: ``dx + 1``), the
    direction fixed, where a ``torch._check(a == b)`` would let torch pick which side to solve for."""
    env._set_replacement(symbol, expr, "derived Dim")


def recompute_unbacked_bindings(gm: torch.fx.GraphModule, env: ShapeEnv) -> None:
    """torch.export's pass over a traced graph's ``unbacked_bindings``: recomputed from each node's
    value, so a binding of a symbol the trace replaced (``torch._check(u0 == 4)``) is dropped, as
    in torch.export's programs (a stale one names a symbol the program no longer has).

    A trace with no unbacked symbol has nothing to recompute, and skipping the pass keeps
    its module (it imports aot_autograd and networkx: a tenth of a second) out of a first export."""
    from torch.utils._sympy.symbol import SymT, symbol_is_type

    if not any("unbacked_bindings" in node.meta for node in gm.graph.nodes) and \
            not any(symbol_is_type(s, (SymT.UNBACKED_INT, SymT.UNBACKED_FLOAT)) for s in env.var_to_range):
        return
    from torch.export._trace import _replace_unbacked_bindings

    _replace_unbacked_bindings(gm)


def phantom_symbol(env: ShapeEnv, hint: int, name: str) -> torch.SymInt | int:
    """A backed SymInt for a Dim that only appears inside derived Dims (no input has it as a size);
    an int where torch specialises the hint (0 or 1)."""
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic

    symbol = env.create_symbol(hint, ConstantSource(name), DimDynamic.DYNAMIC)
    return env.create_symintnode(symbol, hint=hint)


def module_inputs_flattened(inputs: Any) -> contextlib.AbstractContextManager[None]:
    """While it is open, an ``nn.Module`` among ``inputs`` is a pytree node whose leaves are its
    parameters and buffers (unflattened: a copy holding the given tensors), as torch.export
    takes module inputs; ``ep.module()`` opens the same around each call."""
    from torch._export.non_strict_utils import _enable_graph_inputs_of_type_nn_module

    return _enable_graph_inputs_of_type_nn_module(inputs)


def fake_tensor_leak_check_requested() -> bool:
    """torch.export's switch for reporting traced tensors the model keeps past export."""
    import torch._export.config as export_config

    return bool(getattr(export_config, "detect_non_strict_fake_tensor_leaks", False))


def proxy_node_in(tracer: Any, t: torch.Tensor) -> torch.fx.Node | None:
    """The fx node ``tracer`` recorded for ``t``, if any (the tracer may have finished)."""
    from torch.fx.experimental.proxy_tensor import get_proxy_slot

    try:
        return get_proxy_slot(value_behind_functional(t), tracer).proxy.node
    except (KeyError, RuntimeError, AttributeError):
        return None


def proxy_node_of(t: torch.Tensor) -> torch.fx.Node | None:
    """The fx node the active pre-dispatch proxy mode recorded for ``t``, if any."""
    from torch._ops import _get_dispatch_mode_pre_dispatch
    from torch.fx.experimental.proxy_tensor import get_proxy_slot

    mode = _get_dispatch_mode_pre_dispatch(torch._C._TorchDispatchModeKey.PROXY)
    if mode is None:
        return None
    try:
        return get_proxy_slot(t, mode.tracer).proxy.node
    except (KeyError, RuntimeError, AttributeError):
        return None


def is_functional_base(t: FunctionalTensor) -> bool:
    return bool(t.is_base_tensor())


def storage_key(t: FunctionalTensor) -> StorageWeakRef:
    return StorageWeakRef(t.elem.untyped_storage())


def last_recorded_call_source(target: Any) -> str | None:
    """Stack trace of the latest node calling ``target`` in the graph being traced."""
    from torch._ops import _get_dispatch_mode_pre_dispatch

    mode = _get_dispatch_mode_pre_dispatch(torch._C._TorchDispatchModeKey.PROXY)
    if mode is None:
        return None
    for node in reversed(mode.tracer.graph.nodes):
        if node.target is target:
            return (node.meta.get("stack_trace") or "").strip() or None
    return None


def autocast_enabled_anywhere() -> bool:
    return any(torch.is_autocast_enabled(d) for d in ("cpu", "cuda"))


def canonical_key_padding_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A key padding mask as nn.TransformerEncoder reads it (bool -> 0 / -inf floats)."""
    import torch.nn.functional as F

    canonical = F._canonical_mask(mask=mask, mask_name="src_key_padding_mask", other_type=None,
                                  other_name="mask", target_type=dtype)
    assert canonical is not None  # only None for a None mask
    return canonical


def set_version(t: torch.Tensor, version: int) -> None:
    """Set ``t``'s autograd version counter (as a write through ``t.data`` leaves it)."""
    torch._C._autograd._unsafe_set_version_counter((t,), (version,))


def keep_calls_in_torch_dead_code_elimination(fn: Any) -> None:
    """fx's dead-code elimination (``ep.module()`` runs it when unlifting) must not drop
    calls of ``fn`` whose results are unused."""
    torch.fx.node.has_side_effect(fn)


def storage_mutation_count(t: FunctionalTensor) -> int:
    """How many writes functionalization has seen to ``t``'s storage (through any alias)."""
    return int(torch._functionalize_mutation_counter(t.elem))


def torch_aot_export_module(mod: torch.nn.Module, args: tuple, kwargs: dict | None = None, *,
                            pre_dispatch: bool = True) -> tuple[Any, Any]:
    """torch's ``aot_export_module`` (forward only): (graph module, torch's GraphSignature)."""
    from torch._functorch.aot_autograd import aot_export_module as torch_aot

    return torch_aot(mod, args, trace_joint=False, pre_dispatch=pre_dispatch, kwargs=kwargs)


def all_op_names() -> list[str]:
    """Every registered operator, as ``ns::name.overload`` (overload may be absent)."""
    return list(torch._C._dispatch_get_all_op_names())


def is_module_backward_hook_function(cls: type) -> bool:
    """The autograd.Function torch wraps a module call's inputs and outputs in when the module
    (or the global registry) has a full backward hook."""
    from torch.nn.modules._functions import BackwardHookFunction

    return cls is BackwardHookFunction


def module_backward_hooks(model: torch.nn.Module) -> list[tuple[str, str]]:
    """(module name, kind of hook) for every backward hook torch would run on ``model``'s calls:
    the global registries first, then each submodule's own."""
    from torch.nn.modules import module as module_module

    found = [("every module", f"global {kind}") for kind, registry in (
        ("register_module_full_backward_hook", module_module._global_backward_hooks),
        ("register_module_full_backward_pre_hook", module_module._global_backward_pre_hooks)) if registry]
    for name, sub in model.named_modules():
        where = f"module {name!r} ({type(sub).__name__})" if name else f"the model ({type(sub).__name__})"
        if sub._backward_pre_hooks:
            found.append((where, "register_full_backward_pre_hook"))
        if sub._backward_hooks:
            full = sub._is_full_backward_hook
            found.append((where, "register_full_backward_hook" if full else "register_backward_hook"))
    return found


def resolve_overload(namespace: str, name_and_overload: str) -> torch._ops.OpOverload | None:
    """``("aten", "add.Tensor")`` -> ``torch.ops.aten.add.Tensor``; None if Python cannot see it."""
    name, _, overload = name_and_overload.partition(".")
    try:
        return getattr(getattr(getattr(torch.ops, namespace), name), overload or "default")
    except (AttributeError, RuntimeError):
        return None


def torch_tag_maybe_aliasing(op: torch._ops.OpOverload) -> bool:
    """Only the tag (``torch_tags_unsafe`` also counts native_batch_norm)."""
    return torch.Tag.maybe_aliasing_or_mutating in op.tags


def function_has_setup_context(cls: type) -> bool:
    from torch.autograd.function import _is_setup_context_defined

    return bool(_is_setup_context_defined(cls.setup_context))  # type: ignore[attr-defined]


def current_proxy_tracer() -> Any:
    """The tracer of the pre-dispatch proxy mode in use (None when not tracing)."""
    from torch._ops import _get_dispatch_mode_pre_dispatch

    mode = _get_dispatch_mode_pre_dispatch(torch._C._TorchDispatchModeKey.PROXY)
    return None if mode is None else mode.tracer


def autocast_state() -> dict[str, tuple[bool, Any]]:
    """Autocast's thread-local state, per device: (enabled, dtype)."""
    return {d: (torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in ("cpu", "cuda")}


def stack_trace_anchors() -> set[tuple[str, str]]:
    """What fx's tracer keeps of a stack besides ``forward`` frames when only those are
    recorded: the (filename, function) anchors torch registered (the live set: torch adds
    to it as it goes). Frames of :func:`uninteresting_stack_files` are dropped after.
    torch before 2.13 has no anchors (``fx.proxy._STACK_TRACE_ANCHORS`` is absent): an empty set."""
    import torch.fx.proxy as fx_proxy

    return getattr(fx_proxy, "_STACK_TRACE_ANCHORS", set())


def all_higher_order_ops() -> list[Any]:
    """Every HigherOrderOperator registered so far (torch's and ours)."""
    from torch._ops import _higher_order_ops

    return list(_higher_order_ops.values())


def active_functional_mode() -> Any:
    """The FunctionalTensorMode in use (either dispatch stack), or None."""
    from torch.utils._python_dispatch import _detect_infra_mode

    return _detect_infra_mode(torch._C._TorchDispatchModeKey.FUNCTIONAL)


def core_aten_decomposition_table() -> dict[torch._ops.OpOverload, Any]:
    """torch's table for lowering to Core ATen (what ``run_decompositions()`` uses)."""
    from torch._decomp import core_aten_decompositions

    return dict(core_aten_decompositions())


def aten_decomposition_table() -> dict[torch._ops.OpOverload, Any]:
    """Every decomposition torch registers into ATen (``torch._decomp.decompositions``);
    the refs (``torch._refs``) lower to prims, which no ATen op set holds."""
    from torch._decomp import decomposition_table

    return {op: fn for op, fn in decomposition_table.items()  # type: ignore[misc]
            if getattr(fn, "__module__", None) == "torch._decomp.decompositions"}


def prims_decomposition_ops() -> frozenset[torch._ops.OpOverload]:
    """Ops whose only registered decomposition is a ref into prims (``torch._refs``)."""
    from torch._decomp import decomposition_table

    return frozenset(op for op, fn in decomposition_table.items()  # type: ignore[misc]
                     if str(getattr(fn, "__module__", "")).startswith("torch._refs"))


def wrap_submodules_with_tracepoints(mod: torch.nn.Module, paths: tuple[str, ...],
                                     specs: dict[str, dict[str, Any]]) -> Any:
    """torch.export's hooks: ``_export_tracepoint`` around each call of ``paths``."""
    from torch._export.wrappers import _wrap_submodules

    return _wrap_submodules(mod, paths, specs)


def is_export_tracepoint(target: Any) -> bool:
    return target is getattr(torch.ops.higher_order, "_export_tracepoint", None)


def collect_tracepoints(gm: torch.fx.GraphModule, signatures: dict[str, Any], graph_signature: Any) -> None:
    """torch.export's pass: fill ``signatures``' inputs/outputs from the tracepoints, then drop them."""
    from torch._export.passes.collect_tracepoints_pass import CollectTracepointsPass

    CollectTracepointsPass(signatures, graph_signature)(gm)


def _uncaptured_hop_error() -> type:
    from torch._dynamo.exc import UncapturedHigherOrderOpError

    return UncapturedHigherOrderOpError


UNCAPTURED_HOP_ERROR = _uncaptured_hop_error()


def dynamo_is_capturing() -> bool:
    """True while dynamo captures code symbolically (torch's HOPs capture their bodies so)."""
    return bool(torch.compiler.is_dynamo_compiling())


class HopRules:
    """Where a HOP of ours registers how torch's tracers (``run_decompositions``,
    ``torch.export.export``) handle it, so a call stays one node through them."""

    AUTOGRAD = torch._C.DispatchKey.Autograd
    DENSE = torch._C.DispatchKey.CompositeExplicitAutograd

    @staticmethod
    def proxy_mode_type() -> type:
        from torch.fx.experimental.proxy_tensor import ProxyTorchDispatchMode

        return ProxyTorchDispatchMode

    @staticmethod
    def trace_nested(fn: Callable[..., Any], *args: Any) -> torch.fx.GraphModule:
        """``fn`` traced into a graph by the torch tracer in progress (its decompositions apply)."""
        from torch._higher_order_ops.utils import reenter_make_fx

        return reenter_make_fx(fn)(*args)


def backend_has_kernel(op: torch._ops.OpOverload, key: str) -> bool:
    """Whether a kernel for ``op`` is registered on dispatch key ``key`` (``"PrivateUse1"``) itself:
    torch's composite kernel of a floor op (``copy_``) would only call the backend's own."""
    return torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), key)


def has_composite_explicit_kernel(op: torch._ops.OpOverload) -> bool:
    """True when ``op``'s kernel for every backend is torch's CompositeExplicitAutograd one
    (it calls other ops through the dispatcher: what a backend gets without registering it)."""
    return torch._C._dispatch_has_kernel_for_dispatch_key(
        op.name(), torch._C.DispatchKey.CompositeExplicitAutograd)


def call_backend_kernel(op: torch._ops.OpOverload, on_device: torch.device, *args: Any, **kwargs: Any) -> Any:
    """``op``'s kernel for ``device``'s backend, skipping the keys above it (Python modes
    included), on ``on_device``: how a composite kernel runs inside a dispatch mode without meeting it again."""
    key = torch._C._dispatch_key_for_device(on_device.type)
    return op.redispatch(torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, key)), *args, **kwargs)


# the functionality key torch reserves for an out-of-tree fake tensor (torchdistx) and registers
# nothing on: below autograd and the Python key, above every backend; pf.eager's session owns it
SPARE_KEY = "Fake"
_SPARE: Any = torch._C._parse_dispatch_key(SPARE_KEY)
_SPARE_SET = torch._C.DispatchKeySet(_SPARE)


def spare_key_active() -> bool:
    """Whether this thread's dispatch passes through ``SPARE_KEY``: included, and not excluded
    for the moment (a kernel on it calling its op as it is)."""
    return (torch._C._dispatch_tls_is_dispatch_key_included(_SPARE)
            and not torch._C._dispatch_tls_is_dispatch_key_excluded(_SPARE))


def including_spare_key() -> Any:
    """Context: this thread's dispatch passes through ``SPARE_KEY`` (thread-local, and carried by
    autograd to the threads that run this thread's backward)."""
    return torch._C._IncludeDispatchKeyGuard(_SPARE)


def excluding_spare_key() -> Any:
    """Context: this thread's dispatch skips ``SPARE_KEY`` (a kernel on it calling its op as it is)."""
    return torch._C._ExcludeDispatchKeyGuard(_SPARE_SET)


_BELOW_SPARE = torch._C._dispatch_keyset_full_after(_SPARE)
# Whether a Python fallback on SPARE_KEY can serve every call: torch 2.11 and 2.12 put the key above
# the Python key, and there a Python fallback called while a TorchDispatchMode is active fails an
# internal assert (python_dispatch.cpp: "func != nullptr"); from 2.13 the key sits below it
PYTHON_FALLBACK_ON_SPARE_KEY = int(_SPARE) < torch._C.DispatchKey.Python.value


def fall_through_spare_key(op: torch._ops.OpOverload, keyset: Any, args: tuple, kwargs: dict) -> Any:
    """What a fallthrough kernel on ``SPARE_KEY`` does, from a Python kernel registered there
    ``with_keyset``: ``op`` sent on to the keys below it, the thread's dispatch unchanged (the
    op's own inner calls still pass through the key)."""
    return op.redispatch(keyset & _BELOW_SPARE, *args, **kwargs)


def math_attention_allowed() -> bool:
    """Whether the user left sdpa's math backend on (``sdpa_kernel`` can turn it off)."""
    return bool(torch._C._get_math_sdp_enabled())


def entry_point(op: torch._ops.OpOverload) -> Callable[..., Any]:
    """The C++ callable ``op(*args, **kwargs)`` ends in (``OpOverload.__call__`` is one Python
    frame around it): same dispatch, same result, a frame less per call on a replay's hot path."""
    return op._op


def registrations_on_key(key: str) -> list[str]:
    """The ops with a kernel registered on dispatch key ``key``."""
    return list(torch._C._dispatch_get_registrations_for_dispatch_key(key))


def graph_module_flat_inputs(ep: Any, args: tuple, kwargs: dict) -> tuple:
    """What ``ep.graph_module`` takes for the call ``ep.module()(*args, **kwargs)``: the
    program's parameters, buffers and constants in placeholder order, then the user's
    inputs flattened."""
    return tuple(ep._graph_module_flat_inputs(args, kwargs))


def dtensor_local_shard(t: Any) -> torch.Tensor:
    """The local shard a DTensor holds, read without ``to_local()`` (an autograd Function,
    which a trace would record as a Function call rather than see through)."""
    return t._local_tensor


def dtensor_around(local: torch.Tensor, like: Any) -> Any:
    """A DTensor over ``local`` with the mesh, placements and global shape of DTensor ``like``,
    built by its constructor (not ``from_local``'s Function), so a trace below autograd sees
    DTensor's dispatch run on ``local``."""
    from torch.distributed.tensor import DTensor

    return DTensor(local, like._spec, requires_grad=local.requires_grad)


@dataclasses.dataclass(frozen=True)
class FsdpUnit:
    """One ``fully_shard``'ed module as FSDP2 keeps it: the parameters it shards (the
    ``nn.Parameter`` DTensor FSDP2 registers between forwards, by owning module and name) and
    the policies that change what its forward computes."""

    module: torch.nn.Module
    sharded: tuple[tuple[torch.nn.Module, str, Any], ...]  # (owner, name, DTensor parameter)
    mixed_precision: Any  # a MixedPrecisionPolicy
    offloads_to_cpu: bool
    gradient_settings: tuple[str, ...]  # the FSDPModule.set_* calls in effect that change its gradients


def fsdp_units(model: torch.nn.Module) -> list[FsdpUnit]:
    """Every ``fully_shard``'ed module of ``model``, read from FSDP2's state: its parameter
    groups (one attribute on torch 2.11, a list from 2.13) and their ``FSDPParam``s."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    kind = getattr(fsdp, "FSDPModule", None)
    units = []
    for module in model.modules():
        if kind is None or not isinstance(module, kind):
            continue
        state: Any = module._get_fsdp_state()  # type: ignore[operator]
        groups = getattr(state, "_fsdp_param_groups", None)
        if groups is None:
            group = state._fsdp_param_group
            groups = [group] if group is not None else []
        params = [p for g in groups for p in g.fsdp_params]
        settings = [f"set_requires_gradient_sync({g.reduce_grads})" for g in groups if not g.reduce_grads]
        settings += [f"set_gradient_divide_factor({g.gradient_divide_factor})" for g in groups
                     if g.gradient_divide_factor is not None]
        settings += ["set_all_reduce_hook(...)" for g in groups if g._all_reduce_hook is not None]
        units.append(FsdpUnit(
            module=module,
            sharded=tuple((p._module_info.module, p._module_info.param_name, p.sharded_param) for p in params),
            mixed_precision=state._mp_policy,
            offloads_to_cpu=any(p.offload_to_cpu for p in params),
            gradient_settings=tuple(settings)))
    return units


def fsdp_forward_hook_handles(module: torch.nn.Module) -> list[Any]:
    """The ``RemovableHandle``s of the forward pre- and post-hooks FSDP2 registered on ``module``
    (one each, or a ``_MultiHandle`` of several when modules share one ``fully_shard`` call)."""
    state: Any = module._get_fsdp_state()  # type: ignore[operator]
    handles: list[Any] = []
    for handle in (state._pre_forward_hook_handle, state._post_forward_hook_handle):
        for h in getattr(handle, "handles", (handle,)):
            if h is not None and h not in handles:
                handles.append(h)
    return handles


def functional_all_gather(t: torch.Tensor, world_size: int, group_name: str) -> torch.Tensor:
    """``t`` of every rank concatenated along dim 0, as the functional collective and its wait."""
    gathered = torch.ops._c10d_functional.all_gather_into_tensor(t, world_size, group_name)
    return torch.ops._c10d_functional.wait_tensor(gathered)


def functional_reduce_scatter(t: torch.Tensor, op: str, world_size: int, group_name: str) -> torch.Tensor:
    """This rank's block (along dim 0) of ``t`` reduced over the ranks by ``op``, functional plus its wait."""
    scattered = torch.ops._c10d_functional.reduce_scatter_tensor(t, op, world_size, group_name)
    return torch.ops._c10d_functional.wait_tensor(scattered)


# --- FakeTensorMode's dispatch cache (trace/persisted_fake_dispatch.py) -----------------------


def fake_dispatch_cache() -> dict[Any, Any]:
    """FakeTensorMode's process-wide dispatch cache: key -> the result's metadata (or why the op
    bypasses the cache). Insertion-ordered (a dict), shared by every FakeTensorMode."""
    return FakeTensorMode.cache


def fake_dispatch_key_parts(key: Any) -> tuple[Any, ...]:
    """The tuple a cache key was made from (the op first, then what torch read of its inputs)."""
    return key.key


def fake_dispatch_key(parts: tuple[Any, ...]) -> Any:
    """The cache key of ``parts``, hashed in this process (a key's hash covers strings, which
    each process hashes differently)."""
    from torch._subclasses.fake_tensor import _DispatchCacheKey

    return _DispatchCacheKey(parts)


def fake_dispatch_record_classes() -> dict[tuple[str, str], type]:
    """The classes of a cache entry and what a key holds besides plain values, by (module, name)
    as pickle names them: a persisted entry may build these and no other class."""
    from torch._subclasses import fake_tensor as ft
    from torch.fx.experimental.symbolic_shapes import ShapeEnvSettings

    classes = (ft._DispatchCacheValidEntry, ft._DispatchCacheBypassEntry, ft._DispatchCacheEntryOutputInfo,
               ft.TensorMetadata, ft.SingletonConstant, ShapeEnvSettings)
    return {(cls.__module__, cls.__qualname__): cls for cls in classes}
