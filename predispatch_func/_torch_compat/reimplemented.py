"""torch internals restated: code that does what a torch function does, our way.

Each may silently diverge from torch when torch changes, so each has a drift
test that runs our path and torch's on the same inputs and compares
(``tests/torch_compat/test_torch_drift.py``): ``functionalize_kept_op`` against
FunctionalTensorMode's dispatch on the edge-case catalogue,
``functionalize_inplace_through_twin`` likewise (catalogue cases of in-place ops with
Python Meta kernels), ``torch_export_keeps`` against ``aot_export_module(pre_dispatch=True)``'s
graphs, the node recorders against the graphs torch's tracer records,
``uninteresting_stack_files`` (beside the re-exported ``stack_trace_anchors``) and ``fake_with_dynamic_dims`` against torch.export's
stack traces and runtime shape checks, ``fake_of_plain_state`` against ``FakeTensorMode.from_tensor``, ``static_tensor_metadata`` against
``torch.fx.passes.shape_prop._extract_tensor_metadata``, ``record_op_call`` against fx's ``proxy_call``.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import Any

import torch
from torch.fx.experimental import proxy_tensor as _proxy_tensor

from .patches import NOT_RECORDED, outside_trace
from .reexports import (
    SET_GRAD_ENABLED,
    FakeTensor,
    FakeTensorMode,
    FunctionalTensor,
    FunctionalTensorMode,
    OpOverload,
    current_proxy_tracer,
    fake_mode_of,
    has_composite_implicit_kernel,
    inner_of_functional,
    torch_tags_unsafe,
)

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


def functionalize_kept_op(mode: FunctionalTensorMode, op: OpOverload, args: tuple, kwargs: dict) -> Any:
    """``mode.__torch_dispatch__`` for an op that :func:`goes_straight_to_functionalization` and that
    the mode keeps, without the generic part that costs a tenth of a trace: two pytree walks per
    op and per-op checks for custom ops, effects and TorchBind. It runs the same steps (unwrap,
    C++ functionalization with views reapplied, wrap, the in-place view's metadata,
    aliasing correction), so its results are torch's (tests/torch_compat/test_torch_drift.py compares programs)."""
    include = torch._C._dispatch_tls_local_include_set() | torch._C.DispatchKeySet(_FUNCTIONALIZE)
    exclude = torch._C._dispatch_tls_local_exclude_set().remove(_FUNCTIONALIZE) - FunctionalTensor._extra_dispatch_keys
    inner_args = tuple(_inner_elems(a) for a in args)
    inner_kwargs = {k: _inner_elems(v) for k, v in kwargs.items()}
    with torch._C._ForceDispatchKeyGuard(include, exclude):
        reapply_views = torch._functionalize_enable_reapply_views(True)  # type: ignore[attr-defined]
        try:
            _sync_view_replay_annotations(mode, args, kwargs)
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


def mirror_storage_swap(t: Any, source: Any) -> None:
    """After ``t.set_(source)`` went through functionalization (which makes ``t``'s functional
    wrapper an alias of ``source``'s), give the Python wrapper ``t`` the metadata of ``source``
    too, as FunctionalTensorMode does after other in-place view ops (it leaves ``set_`` out):
    indexing reads the wrapper's own sizes. Pinned by tests/state/test_storage_swaps.py."""
    with torch.utils._mode_utils.no_dispatch():
        t.set_(source)


def _sync_view_replay_annotations(mode: FunctionalTensorMode, args: tuple, kwargs: dict) -> None:
    """Sync each FunctionalTensor argument under the proxy node that made it, so views
    functionalization replays lazily carry the original view's node metadata. torch 2.12
    on has this as a method of the mode; 2.11 runs the same steps inline in its dispatch."""
    method = getattr(mode, "_sync_view_replay_annotations", None)
    if method is not None:
        method(args, kwargs)
        return
    import torch.fx.traceback as fx_traceback

    proxy_mode = torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.PROXY)
    if proxy_mode is None:
        return
    for a in torch.utils._pytree.tree_leaves([args, kwargs]):
        if isinstance(a, FunctionalTensor):
            unwrapped = torch._from_functional_tensor(a.elem)
            try:
                node = proxy_mode.tracer.tensor_tracker[unwrapped].proxy.node
            except KeyError:
                raise RuntimeError(f"cannot find {unwrapped} in tensor_tracker") from None
            with fx_traceback.set_current_replay_node(node):
                torch._sync(a)


def is_unary_inplace_with_python_meta(op: Any) -> bool:
    """An aten in-place op on ``self`` alone whose Meta kernel is Python (torch's
    ``register_inplace`` decompositions: ``hardtanh_``, ``hardswish_``, ``hardsigmoid_``, ...).
    With its functional twin (op_schema.functional_twin, ``Match.IN_ORDER``) such an op
    takes :func:`functionalize_inplace_through_twin`."""
    if op not in _UNARY_INPLACE:
        _UNARY_INPLACE[op] = _unary_inplace_with_python_meta(op)
    return _UNARY_INPLACE[op]


_UNARY_INPLACE: dict[Any, bool] = {}


def _unary_inplace_with_python_meta(op: Any) -> bool:
    if not isinstance(op, OpOverload) or op.namespace != "aten" or torch._C.DispatchKey.Meta not in op.py_kernels:
        return False
    schema = op._schema
    name = schema.name.removeprefix("aten::")
    tensors = [a for a in schema.arguments if isinstance(a.type, torch.TensorType)]
    return not (not name.endswith("_") or name.endswith("__") or torch.Tag.inplace_view in op.tags
                or torch.Tag.nondeterministic_seeded in op.tags or len(tensors) != 1
                or schema.arguments[0] is not tensors[0] or not schema.arguments[0].is_write
                or any(a.is_write for a in schema.arguments[1:]) or len(schema.returns) != 1)


def functionalize_inplace_through_twin(mode: FunctionalTensorMode, op: OpOverload, twin: OpOverload,
                                       args: tuple, kwargs: dict) -> Any:
    """C++ functionalization of ``op`` (see :func:`is_unary_inplace_with_python_meta`) without its
    first step. That step runs ``op`` on meta copies of the inputs to catch shape errors the
    functional op would not raise; with a Python Meta kernel it runs the op's Python reference
    on meta tensors (60 ms a call: a tenth of a MobileNet's export). For an op on ``self``
    alone the check is the functional result having ``self``'s metadata, made below; the
    rest is functionalization's own steps: the functional op on the synced input, then
    ``self`` replaced by its result, the update committed to its aliases, and synced."""
    self_ = args[0]
    if not isinstance(self_, FunctionalTensor):
        return functionalize_kept_op(mode, op, args, kwargs)
    out = functionalize_kept_op(mode, twin, args, kwargs)
    if (not isinstance(out, FunctionalTensor) or out.shape != self_.shape or out.dtype != self_.dtype
            or out.device != self_.device):
        return functionalize_kept_op(mode, op, args, kwargs)  # its own check raises (the unused result is dead code)
    torch._functionalize_replace(self_.elem, torch._from_functional_tensor(out.elem))  # type: ignore[attr-defined]
    torch._functionalize_commit_update(self_.elem)  # type: ignore[attr-defined]
    torch._functionalize_sync(self_.elem)  # type: ignore[attr-defined]
    return self_


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


# the modules whose files torch's ``uninteresting_files`` names (torch/fx/experimental/symbolic_shapes.py
# and torch/_dynamo/guards.py), as paths under torch's directory; it imports each to ask for its file
_UNINTERESTING_MODULES = (
    "fx/experimental/symbolic_shapes", "export/_trace", "fx/experimental/recording", "fx/experimental/sym_node",
    "fx/interpreter", "fx/_symbolic_trace", "__init__", "_compile", "_dynamo/eval_frame", "_inductor/sizevars",
    "_library/custom_ops", "_library/fake_impl", "_subclasses/meta_utils", "_subclasses/fake_tensor",
    "_logging/_internal", "_logging/structured", "_dynamo/external_utils",
)
# whole folders it names (every HOP module), or whose loaded modules it names (dynamo's polyfills:
# taken whole, the few it leaves out are run only by dynamo, never in a trace's stack)
_UNINTERESTING_FOLDERS = ("_higher_order_ops", "_dynamo/polyfills")


def uninteresting_stack_files() -> set[str]:
    """The files whose frames fx's tracer always drops from a node's stack (fx also keeps
    frames of torch/__init__.py, which this set then drops). torch computes it by importing
    every module it names, torch.export's tracer and dynamo among them (a third of a second
    in a fresh process); this names the same files by path, importing nothing. A superset by
    dynamo polyfill files only (drift test: test_torch_drift.py)."""
    import glob
    import os

    root = os.path.dirname(torch.__file__)  # as torch's modules' __file__, which frames carry
    files = {os.path.join(root, *module.split("/")) + ".py" for module in _UNINTERESTING_MODULES}
    for folder in _UNINTERESTING_FOLDERS:
        files.update(glob.glob(os.path.join(root, *folder.split("/"), "*.py")))
    return files | {"<string>"}


def torchs_uninteresting_stack_files() -> set[str]:
    """torch's own set (imports what it names): for the drift test."""
    from torch.fx.experimental.symbolic_shapes import uninteresting_files

    return uninteresting_files()


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


def fake_of_plain_state(mode: FakeTensorMode, t: torch.Tensor) -> torch.Tensor | None:
    """``mode.from_tensor(t, static_shapes=True)`` for a plain dense parameter or buffer, in a
    tenth of the time; None for any other tensor (the caller takes ``from_tensor``).

    torch's converter describes the tensor in full (views, subclasses, sparse layouts,
    conj bits, gradients, symbolic sizes) before building it; a plain leaf that owns its
    storage needs none of that: the result is the same fake (an empty meta tensor of its
    size, strides and dtype on its device, ``requires_grad`` and parameter-ness kept),
    entered in the converter's tensor and storage memos as torch enters it, so a later
    ``from_tensor`` of it, or of a view of it, finds it. With tens of parameters per
    model that is a few percent of an export."""
    if not _is_plain_state(t) or torch.is_inference_mode_enabled():  # (its fakes are inference tensors)
        return None
    converter = mode.fake_tensor_converter
    meta = converter.meta_converter
    storage_id = meta.describer.get_storage_id(t.untyped_storage())
    if converter._get_memo(t) is not None or storage_id in meta.storage_memo:
        return None  # met before, or shares its storage with a tensor met before: torch's path
    with torch.utils._mode_utils.no_dispatch():
        fake = FakeTensor(mode, torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta"), t.device)
    if t.requires_grad:
        fake.requires_grad_(True)
    if type(t) is torch.nn.Parameter:  # marked as torch's converter marks it
        fake._is_param = True  # type: ignore[attr-defined]
    converter.set_tensor_memo(t, fake)
    meta.storage_memo[storage_id] = fake.untyped_storage()
    return fake


def _is_plain_state(t: Any) -> bool:
    """A dense, strided, non-view leaf tensor of the CPU or a GPU that owns its whole storage
    and carries nothing torch's converter would also convert (a gradient, conj/neg bits,
    inference or functorch wrapping, ``nn.Buffer`` metadata, a gradient dtype of its own)."""
    if type(t) not in (torch.Tensor, torch.nn.Parameter) or t.layout is not torch.strided:
        return False
    if t.device.type not in ("cpu", "cuda") or t.is_quantized or t.is_mkldnn or t.is_nested:
        return False
    if t._is_view() or not t.is_leaf or t.grad is not None or t.is_conj() or t.is_neg() or t.is_inference():
        return False
    if torch._C._functorch.is_functorch_wrapped_tensor(t) or torch._is_functional_tensor(t):
        return False
    if getattr(t, "_is_buffer", False) or getattr(t, "grad_dtype", None) not in (None, t.dtype):
        return False
    if t.storage_offset() != 0:
        return False
    # its storage is exactly what ``empty_strided`` of its size and strides allocates
    span = 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride())) if t.numel() else 0
    return t.untyped_storage().nbytes() == span * t.element_size()


def static_tensor_metadata(t: torch.Tensor) -> Any:
    """``torch.fx.passes.shape_prop._extract_tensor_metadata(t)`` (a traced node's ``tensor_meta``)
    for a dense, strided, unquantized tensor whose sizes and strides are plain ints; None for any
    other tensor (the caller takes torch's).

    torch's asks the tensor's layout four times and finds its memory format with the
    SymInt-aware checks of ``torch._prims_common``, which guard each comparison: about a
    twentieth of a transformer's export. With int sizes and strides those checks are the
    integer rules restated here (:func:`_memory_format`), and the result is the same tuple."""
    from torch.fx.passes.shape_prop import TensorMetadata

    if t.layout is not torch.strided or t.is_quantized:
        return None
    shape, stride = t.shape, t.stride()
    if not all(type(v) is int for v in (*shape, *stride)):
        return None
    return TensorMetadata(shape, t.dtype, t.requires_grad, stride, _memory_format(shape, stride), False, {})


class _Unrecorded(Exception):  # noqa: N818 (control flow: an argument the common call has not)
    """An argument :func:`record_op_call` leaves to torch's ``proxy_call``."""


def record_op_call(mode: Any, func: Any, pre_dispatch: bool, args: tuple, kwargs: dict) -> Any:
    """fx's ``proxy_call`` for the common op call; ``NOT_RECORDED`` for any other (torch's records it).

    The common call: an aten op without a decomposition of the tracer's, a data-dependent
    output, or a rewrite of torch's (``lift_fresh``, ``is_nonzero``), whose tensors are all
    traced by fx's proxy tracer without a constant value and whose other arguments are plain
    values (numbers, strings, dtypes, devices) in tuples and lists; pre-dispatch, or below
    autograd an op without a CompositeImplicitAutograd kernel (one with it, torch's proxy_call
    may decompose as autograd would have: left to it). The joint trace's recomputations
    record below autograd (joint/saved_values.py). There
    torch's steps come to: one node whose arguments are the tensors' nodes, the op run,
    its results tracked. torch flattens the arguments twice and puts each through the
    tracer's ``create_arg`` checks (symbolic, opaque and script objects, parameters,
    devices): about a tenth of a transformer's export. Here they are read once, with the
    same node, name, metadata and results (tests/torch_compat/test_torch_drift.py)."""
    tracer = mode.tracer
    if not _records_as_torch(type(tracer)) or not _common_op(func) or func in _tracer_decompositions(mode) \
            or (not pre_dispatch and _composite_implicit(func)):
        return NOT_RECORDED
    traced = tracer.tensor_tracker

    def node_of(value: Any) -> Any:
        kind = type(value)
        if kind in _PLAIN_ARGUMENTS:
            return value
        if kind in _TRACED_TENSOR_TYPES:
            tracked = traced.get(value)
            if tracked is None or tracked.constant is not None:
                raise _Unrecorded
            return tracked.proxy.node
        if kind is tuple or kind is list:
            return kind(node_of(v) for v in value)
        if kind is torch.device and not _devices_rewritten():
            return value
        raise _Unrecorded

    try:
        node_args = tuple(node_of(a) for a in args)
        node_kwargs = {k: node_of(v) for k, v in kwargs.items()}
    except _Unrecorded:
        return NOT_RECORDED
    node = tracer.create_node("call_function", func, node_args, node_kwargs,
                              tracer.graph._target_to_str(func.overloadpacket.__name__))
    result = tracer.proxy(node)
    with _proxy_tensor._enable_thunkify(tracer):
        out = func(*args, **kwargs)
    _proxy_tensor.track_tensor_tree(out, result, constant=None, tracer=tracer)
    _proxy_tensor._maybe_record_pointwise_barrier(func, mode)
    return out


def _tracer_decompositions(mode: Any) -> Any:
    """The decomposition table ``proxy_call`` consults: the proxy mode's own from torch 2.13 on;
    before, the table of the innermost ``decompose(...)`` context, a module global of
    ``proxy_tensor`` (a plain dict on 2.11, a ContextVar on 2.12)."""
    table = getattr(mode, "decomposition_table", None)
    if table is not None:
        return table
    current = _proxy_tensor.CURRENT_DECOMPOSITION_TABLE  # type: ignore[attr-defined]  # before torch 2.13
    return current.get({}) if hasattr(current, "get") and not isinstance(current, dict) else current


# what fx's create_arg passes through as it is; a Python scalar's type exactly (a SymInt,
# an enum or a numpy number is left to torch)
_PLAIN_ARGUMENTS = frozenset({int, float, bool, complex, str, type(None), torch.dtype, torch.layout,
                              torch.memory_format})
_TRACED_TENSOR_TYPES = frozenset({torch.Tensor, torch.nn.Parameter, FakeTensor})  # proxy_call's HANDLED_TYPES
# torch 2.14's and 2.15's proxy_call turn a device argument into a node under compile-on-one-rank
_devices_rewritten = getattr(_proxy_tensor, "_coor_enabled", lambda: False)


def _records_as_torch(tracer_type: Any) -> bool:
    """A tracer whose nodes are made as fx's proxy tracer makes them: ``create_proxy`` turning
    proxies into their nodes with ``PythonKeyTracer.create_arg``, then ``create_node``."""
    from torch.fx.proxy import TracerBase

    as_torch = _TRACERS_AS_TORCH.get(tracer_type)
    if as_torch is None:
        as_torch = _TRACERS_AS_TORCH[tracer_type] = (
            tracer_type.create_proxy is TracerBase.create_proxy and tracer_type.proxy is TracerBase.proxy
            and tracer_type.create_arg is _proxy_tensor.PythonKeyTracer.create_arg)
    return as_torch


_TRACERS_AS_TORCH: dict[Any, bool] = {}


def _common_op(func: Any) -> bool:
    common = _COMMON_OPS.get(func)
    if common is None:
        common = _COMMON_OPS[func] = (
            isinstance(func, OpOverload) and func.namespace == "aten"
            and torch.Tag.data_dependent_output not in func.tags
            and func not in (torch.ops.aten.lift_fresh.default, torch.ops.aten.is_nonzero.default))
    return common


_COMMON_OPS: dict[Any, bool] = {}


def _composite_implicit(func: Any) -> bool:
    composite = _COMPOSITE_IMPLICIT.get(func)
    if composite is None:
        composite = _COMPOSITE_IMPLICIT[func] = has_composite_implicit_kernel(func)
    return composite


_COMPOSITE_IMPLICIT: dict[Any, bool] = {}


_CHANNELS_LAST_ORDER = {4: ((1, 3, 2, 0), torch.channels_last), 5: ((1, 4, 3, 2, 0), torch.channels_last_3d)}


def _memory_format(shape: tuple[int, ...], stride: tuple[int, ...]) -> torch.memory_format | None:
    """The first of contiguous, channels-last (4-d) and channels-last-3d (5-d) the layout is,
    by ``torch._prims_common``'s rules: dims of size 1 are skipped, a tensor of fewer than two
    elements is contiguous, and each other dim's stride is the product of the sizes inside it."""
    if math.prod(shape) < 2 or _nested(shape, stride, range(len(shape) - 1, -1, -1)):
        return torch.contiguous_format
    channels_last = _CHANNELS_LAST_ORDER.get(len(shape))
    if channels_last is not None and _nested(shape, stride, channels_last[0]):
        return channels_last[1]
    return None


def _nested(shape: tuple[int, ...], stride: tuple[int, ...], inner_to_outer: Any) -> bool:
    expected = 1
    for dim in inner_to_outer:
        if shape[dim] == 1:
            continue
        if stride[dim] != expected:
            return False
        expected *= shape[dim]
    return True


def symbolic_int(mode: FakeTensorMode, value: int, flat_index: int) -> Any:
    """A fresh backed symbol for a Python int input declared dynamic, its source named as
    :func:`fake_with_dynamic_dims` names a tensor's, so ``ep.module()`` checks it at run time."""
    from torch._dynamo.source import GetItemSource, LocalSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic

    source = GetItemSource(LocalSource("flat_args"), flat_index)
    return mode.shape_env.create_unspecified_symint_and_symbol(value, source, DimDynamic.DYNAMIC)


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


def last_recorded_node() -> torch.fx.Node | None:
    """The node the pre-dispatch tracer recorded last (None when not tracing)."""
    from torch._ops import _get_dispatch_mode_pre_dispatch

    mode = _get_dispatch_mode_pre_dispatch(torch._C._TorchDispatchModeKey.PROXY)
    if mode is None:
        return None
    last = mode.tracer.graph._root.prev
    return last if last.op != "root" else None


def erase_if_last_recorded(node: torch.fx.Node | None) -> bool:
    """Erase ``node`` if nothing was recorded after it; whether it was erased."""
    if node is None or node.next.op != "root" or node.users:
        return False
    node.graph.erase_node(node)
    return True


def torch_export_keeps(op: torch._ops.OpOverload) -> bool:
    """Would torch's functional pre-dispatch export (FunctionalTensorMode with
    ``export=True``, as in ``aot_export_module(pre_dispatch=True)``) keep ``op`` as one node?

    Kernels (no composite) are always kept, except the one torch force-decomposes
    (native_batch_norm); composites are kept unless annotated or tagged.
    (``torch.export.export``'s own training IR keeps every composite it meets;
    its ``run_decompositions`` decides later.)
    """
    import warnings

    if not has_composite_implicit_kernel(op):
        return not torch_tags_unsafe(op)
    with warnings.catch_warnings():  # torch warns that it keeps custom composites
        warnings.simplefilter("ignore")
        return not torch_would_decompose(op, pre_dispatch=True)


def torch_would_decompose(op: torch._ops.OpOverload, pre_dispatch: bool) -> bool:
    """FunctionalTensorMode's keep-or-decompose answer for a composite in an export trace
    (``export=True``): never dropout; always an op tagged unsafe or whose schema aliases or
    writes; otherwise keep at pre-dispatch, decompose after. torch 2.13 on names this
    ``functional_tensor._can_decompose_fast``; 2.11 and 2.12 keep it as a closure inside
    ``__torch_dispatch__``, so it is restated here, one path for every release."""
    if op is torch.ops.aten.dropout.default:
        return False
    if torch_tags_unsafe(op):
        return True
    schema = op._schema
    if schema.is_mutable or any(a.alias_info for a in schema.arguments):
        return True
    return not pre_dispatch


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


def record_flat_apply(func: Callable[..., Any], args: tuple, result: torch.Tensor, *, spec_name: str) -> torch.fx.Node:
    """Record ``func(*args)`` as torch.export records a subclass constructor
    (``torch._export.wrappers._emit_flat_apply_call``): a ``flat_apply`` call whose first two
    arguments read the function and the arguments' structure from attributes of the graph module
    (pytree specs), the arguments' leaves after them; ``result`` becomes its tracked output.
    ``args`` holds traced inner tensors (below functionalization), ints and SymInts. Replaying
    the node calls ``func(*args)``. The drift test compares the node with the one torch.export records."""
    from torch._higher_order_ops.flat_apply import _ConstantFunction, flat_apply
    from torch.fx.experimental.proxy_tensor import track_tensor_tree

    tracer = current_proxy_tracer()
    _, func_spec = torch.utils._pytree.tree_flatten(_ConstantFunction(func))
    flat, in_spec = torch.utils._pytree.tree_flatten((tuple(args), {}))
    refs = []
    for name, spec in ((f"{spec_name}_const_func_spec", func_spec), (spec_name, in_spec)):
        qualname = tracer.get_fresh_qualname(name)
        setattr(tracer.root, qualname, spec)
        refs.append(tracer.create_proxy("get_attr", qualname, (), {}))
    out = tracer.create_proxy("call_function", flat_apply, (*refs, *(tracer.unwrap_proxy(a) for a in flat)), {})
    track_tensor_tree(result, out, constant=None, tracer=tracer)
    return out.node


def redirect_traced_tensor(t: torch.Tensor, node: torch.fx.Node) -> None:
    """Later ops that read ``t`` (a traced inner tensor) record ``node`` instead."""
    from torch.fx.experimental.proxy_tensor import _ProxyTensor

    tracer = current_proxy_tracer()
    tracer.tensor_tracker[t] = _ProxyTensor(torch.fx.Proxy(node, tracer), None)


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


def partially_overlapping(a: torch.Tensor, b: torch.Tensor) -> bool:
    """ATen's ``get_overlap_status(a, b) == Partial`` (MemoryOverlap.cpp), on which eager's kernels
    refuse a write into ``a`` that reads ``b``: only between tensors dense in memory (anything else
    is "too hard", never refused); the same memory with the same strides is a full overlap, allowed.
    No Python binding exposes it (the session's C++ kernel calls ATen's own); pinned against eager's
    refusals by tests/torch_compat/test_torch_drift.py."""
    if a is b or a.numel() == 0 or b.numel() == 0 or not (_dense(a) and _dense(b)):
        return False
    a_begin, b_begin = a.data_ptr(), b.data_ptr()
    a_end, b_end = a_begin + a.numel() * a.element_size(), b_begin + b.numel() * b.element_size()
    if a_begin == b_begin and a_end == b_end:
        return a.stride() != b.stride()
    return a_begin < b_end and b_begin < a_end


def _dense(t: torch.Tensor) -> bool:
    """Non-overlapping and dense (``is_non_overlapping_and_dense``): its elements fill a block of
    memory, each once, in any order of dims."""
    if t.dim() == 1:
        return t.size(0) < 2 or t.stride(0) == 1
    expected = 1
    for d in sorted(range(t.dim()), key=t.stride):
        if t.size(d) < 2:
            continue
        if t.stride(d) != expected:
            return False
        expected *= t.size(d)
    return True


__all__ = [
    "partially_overlapping",
    "mirror_storage_swap",
    "goes_straight_to_functionalization",
    "only_functionalized_tensor_types",
    "functionalize_kept_op",
    "is_unary_inplace_with_python_meta",
    "functionalize_inplace_through_twin",
    "uninteresting_stack_files",
    "torchs_uninteresting_stack_files",
    "fake_with_dynamic_dims",
    "fake_of_plain_state",
    "static_tensor_metadata",
    "record_op_call",
    "symbolic_int",
    "record_grad_marker",
    "last_recorded_node",
    "erase_if_last_recorded",
    "torch_export_keeps",
    "torch_would_decompose",
    "record_hop_call",
    "redirect_traced_tensor",
    "record_flat_apply",
    "flex_attention_joint_graph",
]
