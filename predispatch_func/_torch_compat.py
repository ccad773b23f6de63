"""Every private PyTorch API this project touches, wrapped in one place.

torch is pinned (2.13.0), so private APIs are fair game, but the next torch bump
should only have to read this file. Nothing outside this module imports from
``torch._*`` or calls ``torch._C`` directly.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterator

import torch
import torch.utils._pytree as pytree
from torch._ops import HigherOrderOperator, OpOverload
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch._subclasses.functional_tensor import (
    FunctionalTensor,
    FunctionalTensorMode,
    _can_decompose_fast,
)
from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing, make_fx
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._sympy.numbers import int_oo as INT_OO

__all__ = [
    "INT_OO",
    "FakeTensorMode",
    "FunctionalTensor",
    "FunctionalTensorMode",
    "HigherOrderOperator",
    "OpOverload",
    "ShapeEnv",
    "StorageWeakRef",
    "disable_proxy_modes_tracing",
    "make_fx",
    "pytree",
]

# --- dispatcher facts -------------------------------------------------------


def has_composite_implicit_kernel(op: torch._ops.OpOverload) -> bool:
    """True when ``op`` runs a CompositeImplicitAutograd decomposition."""
    return torch._C._dispatch_has_kernel_for_dispatch_key(
        op.name(), torch._C.DispatchKey.CompositeImplicitAutograd
    )


# dispatch key of each sparse layout's CPU kernels
_SPARSE_KEYS = {torch.sparse_coo: "SparseCPU", torch.sparse_csr: "SparseCsrCPU", torch.sparse_csc: "SparseCsrCPU",
                torch.sparse_bsr: "SparseCsrCPU", torch.sparse_bsc: "SparseCsrCPU"}


def has_sparse_kernel(op: torch._ops.OpOverload, layout: torch.layout) -> bool:
    """True when ``op`` registers a CPU kernel for tensors of sparse ``layout``."""
    return torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), getattr(torch._C.DispatchKey, _SPARSE_KEYS[layout]))


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


def torch_would_decompose(op: torch._ops.OpOverload, pre_dispatch: bool) -> bool | None:
    """torch's own export-time answer (None: it would consult autograd)."""
    return _can_decompose_fast(op, True, pre_dispatch)


def torch_tags_unsafe(op: torch._ops.OpOverload) -> bool:
    """torch's ``maybe_aliasing_or_mutating`` tag, which it always decomposes."""
    from torch._decomp import _should_decompose_because_unsafe_op

    return bool(_should_decompose_because_unsafe_op(op))


@contextlib.contextmanager
def below_pre_dispatch() -> Iterator[None]:
    """Run ops on fake tensors without our PreDispatch modes or proxy tracing."""
    keys = torch._C.DispatchKeySet(torch._C.DispatchKey.PreDispatch) | torch._C.DispatchKeySet(
        torch._C.DispatchKey.Functionalize
    )
    with torch._C._ExcludeDispatchKeyGuard(keys), disable_proxy_modes_tracing():
        yield


def schema_of(op: Any) -> Any:
    """``op``'s FunctionSchema (None for a higher-order op or a Python callable)."""
    return getattr(op, "_schema", None)


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


# --- functional tensors -----------------------------------------------------


def to_functional(t: torch.Tensor) -> torch.Tensor:
    return FunctionalTensor.to_functional(t)


def inner_of_functional(t: Any) -> Any:
    """The latest value behind a FunctionalTensor (after syncing pending views)."""
    if not isinstance(t, FunctionalTensor):
        return t
    torch._sync(t)
    return torch._from_functional_tensor(t.elem)


_FUNCTIONALIZE = torch._C.DispatchKey.Functionalize
_TENSOR_TYPES_FUNCTIONALIZED = (torch.Tensor, FakeTensor, FunctionalTensor)


def goes_straight_to_functionalization(op: Any) -> bool:
    """Whether FunctionalTensorMode, when it keeps ``op``, just runs torch's C++
    functionalization kernel on it: an aten op (never auto-functionalized), with no
    registered effect, no TorchBind argument, not a metadata query of FunctionalTensor."""
    from torch._higher_order_ops.effects import has_effects
    from torch._ops import TorchBindOpOverload

    return (isinstance(op, OpOverload) and not isinstance(op, TorchBindOpOverload) and op.namespace == "aten"
            and op not in FunctionalTensor.metadata_fns and not has_effects(op))


def only_functionalized_tensor_types(types: Any) -> bool:
    """FunctionalTensorMode answers NotImplemented to any other tensor subclass."""
    return all(t in _TENSOR_TYPES_FUNCTIONALIZED for t in types)


def has_kernel(op: OpOverload) -> bool:
    return torch._C._dispatch_has_kernel(op.name())


def functionalize_kept_op(mode: FunctionalTensorMode, op: OpOverload, args: tuple, kwargs: dict) -> Any:
    """``mode.__torch_dispatch__`` for an op that :func:`goes_straight_to_functionalization` and that
    the mode keeps, without the generic part that costs a tenth of a trace: two pytree walks per
    op and per-op checks for custom ops, effects and TorchBind. It runs the same steps (unwrap,
    C++ functionalization with views reapplied, wrap, the in-place view's metadata,
    aliasing correction), so its results are torch's (tests/test_mode_stack.py compares programs)."""
    include = torch._C._dispatch_tls_local_include_set() | torch._C.DispatchKeySet(_FUNCTIONALIZE)
    exclude = torch._C._dispatch_tls_local_exclude_set().remove(_FUNCTIONALIZE) - FunctionalTensor._extra_dispatch_keys
    inner_args = tuple(_inner_elems(a) for a in args)
    inner_kwargs = {k: _inner_elems(v) for k, v in kwargs.items()}
    with torch._C._ForceDispatchKeyGuard(include, exclude):
        reapply_views = torch._functionalize_enable_reapply_views(True)  # type: ignore[attr-defined]
        try:
            mode._sync_view_replay_annotations(args, kwargs)
            inner_out = op._op_dk(_FUNCTIONALIZE, *inner_args, **inner_kwargs)
            if mode.export and op is torch.ops.aten.dropout.default:
                torch._freeze_functional_tensor(inner_out)  # type: ignore[attr-defined]
            wrapped: list[bool] = []
            out = _functional_wrappers(inner_out, mode, wrapped)
        finally:
            torch._disable_functionalization()
            torch._functionalize_enable_reapply_views(reapply_views)  # type: ignore[attr-defined]
    if not wrapped or op is torch.ops.aten.lift_fresh.default:
        return out
    if torch.Tag.inplace_view in op.tags and op is not torch.ops.aten.set_.source_Tensor:
        with torch.utils._mode_utils.no_dispatch():
            op(*args, **kwargs)
    from torch.utils._python_dispatch import return_and_correct_aliasing

    return return_and_correct_aliasing(op, args, kwargs, out)


def _inner_elems(value: Any) -> Any:
    """FunctionalTensors replaced by their inner tensors (ATen arguments nest only lists/tuples)."""
    if isinstance(value, FunctionalTensor):
        return value.elem
    if type(value) in (list, tuple):
        return type(value)(_inner_elems(v) for v in value)
    return value


def _functional_wrappers(value: Any, mode: FunctionalTensorMode, wrapped: list[bool]) -> Any:
    """Inner functional tensors of a result wrapped for ``mode``; ``wrapped`` gets an entry per wrap."""
    if isinstance(value, torch.Tensor):
        if torch._is_functional_tensor(value):
            wrapped.append(True)
            return FunctionalTensor(value, mode)
        return value
    if isinstance(value, (list, tuple)):
        items = [_functional_wrappers(v, mode, wrapped) for v in value]
        return items if type(value) is list else tuple(items) if type(value) is tuple else type(value)(items)
    return value


def has_data_mutation(t: FunctionalTensor) -> bool:
    torch._sync(t)
    return bool(torch._functionalize_has_data_mutation(t.elem))  # type: ignore[attr-defined]


def fake_mode_of(tensors: list[Any]) -> FakeTensorMode | None:
    return torch._guards.detect_fake_mode(tensors)


def discarding_unbacked_symbols(fake_mode: FakeTensorMode) -> Any:
    """Unbacked symbols (``.item()``) made inside are thrown away, not pending
    for the trace's outputs: for trial runs whose results are dropped."""
    env = fake_mode.shape_env
    return env.ignore_fresh_unbacked_symbols() if env is not None else contextlib.nullcontext()


# --- export state -----------------------------------------------------------


@contextlib.contextmanager
def exporting_state() -> Iterator[None]:
    """Make ``torch.compiler.is_exporting()`` true while tracing, as torch.export does.

    transformers' masking code branches on it; without it, it takes
    data-dependent paths that cannot be traced.
    """
    old_compiling = torch.compiler._is_compiling_flag
    old_exporting = torch.compiler._is_exporting_flag
    torch.compiler._is_compiling_flag = True
    torch.compiler._is_exporting_flag = True
    try:
        yield
    finally:
        torch.compiler._is_compiling_flag = old_compiling
        torch.compiler._is_exporting_flag = old_exporting


# --- grad / autocast markers recorded by pre-dispatch tracing ----------------

SET_GRAD_ENABLED = torch._C._set_grad_enabled
ENTER_AUTOCAST = torch.amp.autocast_mode._enter_autocast
EXIT_AUTOCAST = torch.amp.autocast_mode._exit_autocast


def reparametrize(module: torch.nn.Module, tensors: dict[str, torch.Tensor]):
    """Temporarily swap named tensors (params, buffers, plain tensor attributes)."""
    from torch.nn.utils.stateless import _reparametrize_module

    return _reparametrize_module(module, tensors, tie_weights=True, strict=False)


# --- fx and symbolic shapes ------------------------------------------------------


def stack_trace_filter() -> tuple[set[tuple[str, str]], set[str]]:
    """What fx's tracer keeps of a stack when only ``forward`` frames are recorded:
    besides ``forward`` frames, the (filename, function) anchors torch registered (the
    live set: torch adds to it as it goes), less the files torch always drops."""
    import torch.fx.proxy as fx_proxy
    from torch.fx.experimental.symbolic_shapes import uninteresting_files

    # fx also keeps frames of torch/__init__.py, which uninteresting_files() then drops
    return fx_proxy._STACK_TRACE_ANCHORS, uninteresting_files()


def rename_node(node: torch.fx.Node, wanted: str) -> None:
    """Rename an fx node, letting the graph's namespace resolve clashes."""
    node._rename(wanted)


def fake_with_dynamic_dims(mode: FakeTensorMode, t: torch.Tensor, dims: set[int],
                           flat_index: int) -> torch.Tensor:
    """A fake tensor whose ``dims`` are fresh backed symbols.

    Its source is ``flat_args[flat_index]``, the name torch's unlifting
    rewrites into the user's argument path when it turns shape guards into
    the runtime checks of ``ep.module()``.
    """
    from torch._dynamo.source import GetItemSource, LocalSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic, StatelessSymbolicContext

    sizes = [DimDynamic.DYNAMIC if i in dims else DimDynamic.STATIC for i in range(t.dim())]
    return mode.from_tensor(t, source=GetItemSource(LocalSource("flat_args"), flat_index),
                            symbolic_context=StatelessSymbolicContext(dynamic_sizes=sizes))


def value_range(lower: Any, upper: Any) -> Any:
    from torch.utils._sympy.value_ranges import ValueRanges

    return ValueRanges(lower, upper)


def symbol_range(env: ShapeEnv, symbol: Any) -> Any:
    return env.var_to_range[symbol]


def narrow_symbol_range(env: ShapeEnv, symbol: Any, lower: int, upper: Any) -> None:
    env.constrain_symbol_range(symbol, compiler_min=lower, compiler_max=upper)


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


def ops_with_cached_pre_dispatch_handler() -> list[str]:
    """Ops whose Python dispatch cache holds a PreDispatch entry: none, while torch keeps
    its rule that PreDispatch handlers are not cached (what
    :func:`pre_dispatch_pushes_without_uncache` relies on; a test checks it)."""
    from torch._ops import get_cached_ops

    key = torch._C.DispatchKey.PreDispatch
    return sorted(str(op) for op in get_cached_ops() if key in op._dispatch_cache)


def push_mode_is_torchs() -> bool:
    """``_push_mode`` is torch's own again (the shortcut is undone after each trace)."""
    import torch.utils._python_dispatch as python_dispatch

    return python_dispatch._push_mode is _TORCH_PUSH_MODE


def lazy_graph_modules() -> Any:
    """Graph modules made meanwhile generate their Python code on first use, not when made:
    the traced graph is edited by our passes and copied into the ExportedProgram's own
    module, so code generated at trace time would only be thrown away."""
    from torch.fx._lazy_graph_module import _use_lazy_graph_module

    return _use_lazy_graph_module(True)


def _torch_push_mode() -> Callable[[Any], None]:
    import torch.utils._python_dispatch as python_dispatch

    return python_dispatch._push_mode


_TORCH_PUSH_MODE = _torch_push_mode()


@contextlib.contextmanager
def pre_dispatch_pushes_without_uncache() -> Iterator[None]:
    """Push PreDispatch modes without clearing every op's PreDispatch dispatch cache.

    torch's ``_push_mode`` loops over every op the process has dispatched to drop
    its cached PreDispatch handler, but PreDispatch handlers are never cached
    (``OpOverload._get_dispatch``: "Not Caching Per-Dispatch-Key Mode Handlers"),
    so the loop removes nothing. FunctionalTensorMode re-enters itself for every
    decomposition, so the loop ran hundreds of times per export, each over all
    ops used so far (a quarter of a second per export in a long-lived process).
    """
    import torch.utils._python_dispatch as python_dispatch
    from torch._ops import _set_mode_pre_dispatch

    original = python_dispatch._push_mode

    def push(mode: Any) -> None:
        if getattr(mode, "_dispatch_key", None) == torch._C.DispatchKey.PreDispatch:
            _set_mode_pre_dispatch(mode)
        else:
            original(mode)

    python_dispatch._push_mode = push
    try:
        yield
    finally:
        python_dispatch._push_mode = original


@contextlib.contextmanager
def autocast_cache_as(enabled: bool) -> Iterator[None]:
    """Set autocast's weight-cache flag (make_fx turns it off while tracing).

    ``torch.autocast()`` without ``cache_enabled`` takes the flag of the moment it
    is built, and the region records it; the model must record what eager used.
    """
    previous = torch.is_autocast_cache_enabled()
    torch.set_autocast_cache_enabled(enabled)
    try:
        yield
    finally:
        torch.set_autocast_cache_enabled(previous)


def autocast_enabled_anywhere() -> bool:
    return any(torch.is_autocast_enabled(d) for d in ("cpu", "cuda"))


def record_grad_marker(enabled: bool) -> torch.fx.Node | None:
    """Record a ``_set_grad_enabled(enabled)`` marker in the graph being traced.

    Used to turn a write through a ``detach()``-ed alias into the no_grad region
    it is equivalent to (eager changes the data and keeps autograd history), and
    to rebuild a stale view in the grad mode eager made it in.
    """
    from torch._ops import _get_dispatch_mode_pre_dispatch

    mode = _get_dispatch_mode_pre_dispatch(torch._C._TorchDispatchModeKey.PROXY)
    if mode is None:
        return None
    node = mode.tracer.create_node("call_function", SET_GRAD_ENABLED, (enabled,), {})
    node.meta["val"] = None
    return node


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


def last_recorded_node() -> torch.fx.Node | None:
    """The node the pre-dispatch tracer recorded last (None when not tracing)."""
    from torch._ops import _get_dispatch_mode_pre_dispatch

    mode = _get_dispatch_mode_pre_dispatch(torch._C._TorchDispatchModeKey.PROXY)
    if mode is None:
        return None
    last = mode.tracer.graph._root.prev
    return last if last.op != "root" else None


def keep_calls_in_torch_dead_code_elimination(fn: Any) -> None:
    """fx's dead-code elimination (``ep.module()`` runs it when unlifting) must not drop
    calls of ``fn`` whose results are unused."""
    torch.fx.node.has_side_effect(fn)


def erase_if_last_recorded(node: torch.fx.Node | None) -> bool:
    """Erase ``node`` if nothing was recorded after it; whether it was erased."""
    if node is None or node.next.op != "root" or node.users:
        return False
    node.graph.erase_node(node)
    return True


def storage_mutation_count(t: FunctionalTensor) -> int:
    """How many writes functionalization has seen to ``t``'s storage (through any alias)."""
    return int(torch._functionalize_mutation_counter(t.elem))


@contextlib.contextmanager
def grad_mode_untraced(enabled: bool) -> Iterator[None]:
    """Set grad mode without recording a marker (the caller records its own)."""
    previous = torch.is_grad_enabled()
    torch._C._set_grad_enabled(enabled)
    try:
        yield
    finally:
        torch._C._set_grad_enabled(previous)


# --- torch's own entry points, used only to compare against (scripts/) ------------


def torch_aot_export_module(mod: torch.nn.Module, args: tuple, kwargs: dict | None = None, *,
                            pre_dispatch: bool = True) -> tuple[Any, Any]:
    """torch's ``aot_export_module`` (forward only): (graph module, torch's GraphSignature)."""
    from torch._functorch.aot_autograd import aot_export_module as torch_aot

    return torch_aot(mod, args, trace_joint=False, pre_dispatch=pre_dispatch, kwargs=kwargs)


# --- operator registry ----------------------------------------------------------


def all_op_names() -> list[str]:
    """Every registered operator, as ``ns::name.overload`` (overload may be absent)."""
    return list(torch._C._dispatch_get_all_op_names())


def resolve_overload(namespace: str, name_and_overload: str) -> torch._ops.OpOverload | None:
    """``("aten", "add.Tensor")`` -> ``torch.ops.aten.add.Tensor``; None if Python cannot see it."""
    name, _, overload = name_and_overload.partition(".")
    try:
        return getattr(getattr(getattr(torch.ops, namespace), name), overload or "default")
    except (AttributeError, RuntimeError):
        return None


@contextlib.contextmanager
def outside_all_modes() -> Iterator[None]:
    """Run real ops from inside a trace: no dispatch modes, no PreDispatch/Functionalize keys.

    The schema audit of a custom op met during export runs the op on real CPU
    tensors; nothing of the trace may see those calls.
    """
    from torch.utils._python_dispatch import _disable_current_modes

    keys = torch._C.DispatchKeySet(torch._C.DispatchKey.PreDispatch) | torch._C.DispatchKeySet(
        torch._C.DispatchKey.Functionalize
    )
    with _disable_current_modes(), torch._C._ExcludeDispatchKeyGuard(keys), disable_proxy_modes_tracing():
        yield


def torch_tag_maybe_aliasing(op: torch._ops.OpOverload) -> bool:
    """Only the tag (``torch_tags_unsafe`` also counts native_batch_norm)."""
    return torch.Tag.maybe_aliasing_or_mutating in op.tags


def torch_export_keeps(op: torch._ops.OpOverload) -> bool:
    """Would ``torch.export`` (pre-dispatch) keep ``op`` as one node?

    Kernels (no composite) are always kept, except the one torch force-decomposes
    (native_batch_norm); composites are kept unless annotated or tagged.
    """
    import warnings

    if not has_composite_implicit_kernel(op):
        return not torch_tags_unsafe(op)
    with warnings.catch_warnings():  # torch warns that it keeps custom composites
        warnings.simplefilter("ignore")
        return _can_decompose_fast(op, True, True) is False


# --- torch.autograd.Function and recording our own HOP calls (hop/function_trace.py) ----


@contextlib.contextmanager
def patched_function_apply(apply: Callable[..., Any]) -> Iterator[None]:
    """Route ``torch.autograd.Function.apply`` (every user Function's entry point)
    through ``apply(cls, original, *args, **kwargs)`` while tracing.

    ``Function.apply`` is not reachable through ``__torch_function__`` nor the
    dispatcher (the C++ ``THPFunction_apply`` runs forward with grad off and the
    ops are recorded inline, losing the user's backward), so it is patched here.
    """
    owner = torch.autograd.Function
    # a Python classmethod up to torch 2.13, a C classmethod_descriptor from 2.14
    # on: both bind to a class through the descriptor protocol
    original = owner.__dict__["apply"]

    def routed(cls, *args, **kwargs):
        return apply(cls, original.__get__(None, cls), *args, **kwargs)

    owner.apply = classmethod(routed)  # type: ignore[assignment, method-assign]
    try:
        yield
    finally:
        owner.apply = original  # type: ignore[method-assign]


def function_has_setup_context(cls: type) -> bool:
    from torch.autograd.function import _is_setup_context_defined

    return bool(_is_setup_context_defined(cls.setup_context))  # type: ignore[attr-defined]


@contextlib.contextmanager
def outside_trace() -> Iterator[None]:
    """Leave the trace in progress (all dispatch modes popped), to trace a body
    of a HOP into its own graph with a fresh tracer, then come back."""
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        yield


def current_proxy_tracer() -> Any:
    """The tracer of the pre-dispatch proxy mode in use (None when not tracing)."""
    from torch._ops import _get_dispatch_mode_pre_dispatch

    mode = _get_dispatch_mode_pre_dispatch(torch._C._TorchDispatchModeKey.PROXY)
    return None if mode is None else mode.tracer


def record_hop_call(hop: Any, subgraphs: list[tuple[str, torch.fx.GraphModule]], constants: tuple,
                    operands: list[torch.Tensor], results: list[torch.Tensor], *,
                    single: bool = False, tracer: Any = None) -> torch.fx.Node:
    """Record ``hop(*subgraphs, *constants, *operands)`` in the graph being traced;
    ``results`` (fresh fake tensors) become its tracked outputs (a tuple of them, or
    the one result itself when ``single``).

    ``operands`` are the traced inner tensors (below functionalization).
    """
    from torch.fx.experimental.proxy_tensor import track_tensor_tree

    tracer = tracer if tracer is not None else current_proxy_tracer()
    refs = []
    for hint, gm in subgraphs:
        i = 0
        while hasattr(tracer.root, f"{hint}_{i}"):
            i += 1
        tracer.root.register_module(f"{hint}_{i}", gm)
        refs.append(tracer.create_proxy("get_attr", f"{hint}_{i}", (), {}))
    proxies = [tracer.unwrap_proxy(t) for t in operands]
    out = tracer.create_proxy("call_function", hop, (*refs, *constants, *proxies), {})
    track_tensor_tree(results[0] if single else tuple(results), out, constant=None, tracer=tracer)
    return out.node


def autocast_state() -> dict[str, tuple[bool, Any]]:
    """Autocast's thread-local state, per device: (enabled, dtype)."""
    return {d: (torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in ("cpu", "cuda")}


@contextlib.contextmanager
def autocast_state_as(state: dict[str, tuple[bool, Any]]) -> Iterator[None]:
    """Set autocast's state without recording a marker (a HOP body traced on its own
    runs under its caller's autocast; the caller's graph already records it)."""
    before = autocast_state()
    for device, (enabled, dtype) in state.items():
        torch.set_autocast_enabled(device, enabled)
        torch.set_autocast_dtype(device, dtype)
    try:
        yield
    finally:
        for device, (enabled, dtype) in before.items():
            torch.set_autocast_enabled(device, enabled)
            torch.set_autocast_dtype(device, dtype)


@contextlib.contextmanager
def patched_tensor_methods(**methods: Callable[..., Any]) -> Iterator[None]:
    """Route ``torch.Tensor.<name>`` through ``methods[name](original, self, *args)``
    while tracing (``register_hook``, ``requires_grad_``: no dispatcher op to see them)."""
    owned = {name: name in torch.Tensor.__dict__ for name in methods}
    originals = {name: getattr(torch.Tensor, name) for name in methods}
    for name, route in methods.items():
        def routed(self, *args, _route=route, _original=originals[name], **kwargs):
            return _route(_original, self, *args, **kwargs)
        setattr(torch.Tensor, name, routed)
    try:
        yield
    finally:
        for name in methods:
            if owned[name]:
                setattr(torch.Tensor, name, originals[name])
            else:
                delattr(torch.Tensor, name)


@contextlib.contextmanager
def rng_reseeds_routed(on_reseed: Callable[[str], None]) -> Iterator[None]:
    """Call ``on_reseed(name)`` before ``torch.manual_seed``/``torch.seed``, and before a
    ``torch.set_rng_state`` that changes the CPU generator's state (torch's own tracers
    restore the state they saved, which changes nothing)."""
    import torch.random as random_module

    originals = {name: getattr(random_module, name) for name in ("manual_seed", "seed", "set_rng_state")}

    def routed(name: str, *args: Any, **kwargs: Any) -> Any:
        if name != "set_rng_state" or not torch.equal(args[0] if args else kwargs["new_state"],
                                                      torch.get_rng_state()):
            on_reseed(name)
        return originals[name](*args, **kwargs)

    for name in originals:
        setattr(random_module, name, functools.partial(routed, name))
        setattr(torch, name, getattr(random_module, name))
    try:
        yield
    finally:
        for name, fn in originals.items():
            setattr(random_module, name, fn)
            setattr(torch, name, fn)


def redirect_traced_tensor(t: torch.Tensor, node: torch.fx.Node) -> None:
    """Later ops that read ``t`` (a traced inner tensor) record ``node`` instead."""
    from torch.fx.experimental.proxy_tensor import _ProxyTensor

    tracer = current_proxy_tracer()
    tracer.tensor_tracker[t] = _ProxyTensor(torch.fx.Proxy(node, tracer), None)


@contextlib.contextmanager
def inference_mode_as_grad_mode() -> Iterator[None]:
    """``torch.inference_mode(m)`` sets grad mode to ``not m`` (recorded like ``no_grad``)
    instead of entering C++ inference mode, which a trace cannot hold: its values are
    a ``no_grad`` region's (see README, Regions)."""
    cls = torch.autograd.grad_mode.inference_mode
    enter, exit_ = cls.__enter__, cls.__exit__

    def entered(self):
        self._pf_previous = torch.is_grad_enabled()
        torch.set_grad_enabled(not self.mode)

    def exited(self, *exc):
        torch.set_grad_enabled(self._pf_previous)

    cls.__enter__, cls.__exit__ = entered, exited  # type: ignore[method-assign]
    try:
        yield
    finally:
        cls.__enter__, cls.__exit__ = enter, exit_  # type: ignore[method-assign]


@contextlib.contextmanager
def compiled_modules_run_eagerly() -> Iterator[None]:
    """A ``torch.compile``-d submodule (``OptimizedModule``) calls the module it wraps,
    so the trace sees its ops (as torch.export does), not dynamo's generated code.
    A compiled plain function runs what it wraps too: its wrapper does so while
    exporting inside a ``TracingContext`` (torch.export's non-strict trace holds one).
    Not a global ``set_stance("force_eager")``: torch's own HOPs (``cond``, ``map``)
    compile their bodies with dynamo to lift closed-over tensors."""
    from torch._dynamo.eval_frame import OptimizedModule

    original = OptimizedModule.__dict__.get("__call__")

    def call(self, *args, **kwargs):
        return self._orig_mod(*args, **kwargs)

    OptimizedModule.__call__ = call  # type: ignore[method-assign]
    context: Any = contextlib.nullcontext()
    if torch._guards.TracingContext.try_get() is None:
        context = torch._guards.tracing(torch._guards.TracingContext(torch._guards.detect_fake_mode()))
    try:
        with context:
            yield
    finally:
        if original is None:
            del OptimizedModule.__call__
        else:
            OptimizedModule.__call__ = original  # type: ignore[method-assign]


def all_higher_order_ops() -> list[Any]:
    """Every HigherOrderOperator registered so far (torch's and ours)."""
    from torch._ops import _higher_order_ops

    return list(_higher_order_ops.values())


def active_functional_mode() -> Any:
    """The FunctionalTensorMode in use (either dispatch stack), or None."""
    from torch.utils._python_dispatch import _detect_infra_mode

    return _detect_infra_mode(torch._C._TorchDispatchModeKey.FUNCTIONAL)


# --- decomposition tables (opsets/lowering.py) ------------------------------------


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


# --- preserve_module_call_signature (module_signatures.py) ------------------------


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


def hop_capture_static() -> Any:
    """torch's HOP wrappers (``map``, ``cond``) capture their bodies with dynamo, which
    after a first capture in the process makes changed Python ints (pytree spec
    sizes) graph inputs without values; keep them constants, as on a first capture."""
    return torch._dynamo.config.patch(automatic_dynamic_shapes=False)


def dynamo_is_capturing() -> bool:
    """True while dynamo captures code symbolically (torch's HOPs capture their bodies so)."""
    return bool(torch.compiler.is_dynamo_compiling())


@contextlib.contextmanager
def dynamo_function_capture_refused(refuse: Callable[[type], None]) -> Iterator[None]:
    """Call ``refuse(cls)`` when dynamo captures ``cls.apply`` (a custom autograd.Function
    inside a torch HOP body): dynamo inlines its forward when nothing requires grad."""
    from torch._dynamo.variables.misc import AutogradFunctionVariable

    original = AutogradFunctionVariable.call_apply

    def call_apply(self, *args, **kwargs):
        refuse(self.fn_cls)
        return original(self, *args, **kwargs)

    AutogradFunctionVariable.call_apply = call_apply  # type: ignore[method-assign]
    try:
        yield
    finally:
        AutogradFunctionVariable.call_apply = original  # type: ignore[method-assign]


# --- the rules of our HOPs under torch's own tracers ------------------------


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


@contextlib.contextmanager
def below_autograd() -> Iterator[None]:
    """Dispatch below the Autograd key (a HOP's autograd rule calling the HOP again)."""
    with torch._C._AutoDispatchBelowAutograd():
        yield


def flex_attention_joint_graph(score_mod: Callable[..., Any], query: torch.Tensor,
                               other_buffers: tuple) -> Any:
    """The joint (forward + backward) graph of a flex_attention ``score_mod``, as
    ``flex_attention_backward``'s eager kernel (and dynamo) derive it when none is given."""
    from torch._higher_order_ops.flex_attention import create_fw_bw_graph

    inner = inner_of_functional(query)
    with outside_trace(), (fake_mode_of([inner]) or contextlib.nullcontext()):
        example = (inner.new_zeros((), requires_grad=True),
                   *(inner.new_zeros((), dtype=torch.int) for _ in range(4)))
        buffers = tuple(inner_of_functional(b) for b in other_buffers)
        return create_fw_bw_graph(score_mod, example, buffers)[1]
