"""Private torch APIs a joint trace (predispatch_func/joint/) leans on: the proxy tracer's
table of tracked tensors, a proxy mode below autograd sharing the trace's tracer, and a
patch letting the PreDispatch proxy mode find tensors the autograd engine re-wrapped.

Re-exports and one patch (restored on every path); each assumption is pinned by
``tests/joint/test_torch_assumptions_joint.py``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.fx.experimental.proxy_tensor import (
    ProxyTorchDispatchMode,
    PythonKeyTracer,
    _ProxyTensor,
    get_proxy_slot,
    set_proxy_slot,
)
from torch.multiprocessing.reductions import StorageWeakRef

__all__ = ["pre_dispatch_proxy_mode", "is_tracked", "track_as", "recorded_below_autograd",
           "untracked_arguments_resolved"]

_PRE_DISPATCH = torch._C.DispatchKeySet(torch._C.DispatchKey.PreDispatch)


def pre_dispatch_proxy_mode() -> Any:
    """The PreDispatch proxy mode of the ``make_fx(pre_dispatch=True)`` trace in progress."""
    from torch._ops import _get_dispatch_mode_pre_dispatch

    return _get_dispatch_mode_pre_dispatch(torch._C._TorchDispatchModeKey.PROXY)


def is_tracked(tracer: Any, t: Any) -> bool:
    """Whether ``tracer`` has a graph value for tensor ``t`` (by object)."""
    return isinstance(t, torch.Tensor) and get_proxy_slot(t, tracer, None) is not None


def track_as(tracer: Any, t: torch.Tensor, like: torch.Tensor) -> None:
    """Make ``tracer`` read ``t`` as the graph value it has for ``like`` (same value, another object)."""
    set_proxy_slot(t, tracer, get_proxy_slot(like, tracer))


def detached_untraced(t: torch.Tensor) -> torch.Tensor:
    """``t.detach()`` without recording a node (the caller tracks the result itself)."""
    with torch._C._ExcludeDispatchKeyGuard(_PRE_DISPATCH):
        return t.detach()


__all__ += ["detached_untraced"]


@contextlib.contextmanager
def recorded_below_autograd(tracer: Any, decomposing_as: Any = None) -> Iterator[None]:
    """Ops called inside are recorded into ``tracer``'s graph after autograd, autocast and
    composite decompositions ran (the PreDispatch modes skipped): what a kept composite
    or an autocast cast computed internally becomes visible as plain ATen nodes.
    ``decomposing_as``: a proxy mode whose decomposition table applies here too (a target's
    lowering). From torch 2.13 on each proxy mode holds its own table; before, the table
    is a global that make_fx sets for its whole trace, so it applies already."""
    lower = ProxyTorchDispatchMode(tracer, "real", pre_dispatch=False)
    table = getattr(decomposing_as, "decomposition_table", None)
    if table:
        lower.decomposition_table = table
    with torch._C._ExcludeDispatchKeyGuard(_PRE_DISPATCH), lower:
        yield


@contextlib.contextmanager
def untracked_arguments_resolved(mode: Any, resolve: Callable[[torch.Tensor], None]) -> Iterator[None]:
    """While inside, ``mode`` (the PreDispatch proxy mode) calls ``resolve(t)`` on each tensor
    argument it has no graph value for, before recording the op. The autograd engine hands
    a backward op a new tensor object for each saved tensor that had autograd history; the
    proxy mode tracks tensors by object and would otherwise record it as a constant.

    Where ``resolve`` knows no value for it either, the argument is read as the value the mode
    tracks in the same storage with the same layout: a tensor made below the recording level
    from a graph value, kept outside autograd's saved tensors (the chunked
    ``linear_cross_entropy`` keeps detached forward outputs on its ctx). The traced program is
    functional, so one storage and layout hold one value.

    Any other proxy mode meeting such an argument meanwhile is one a torch HOP's backward
    traces its body with (``cond``'s, the engine running inside that trace): it reads the
    argument as the value it tracks in the same storage and layout. A HOP's own arguments
    (``cond`` called by a backward) are unwrapped by the tracer, not dispatched: resolved
    there too. (Only FunctionalTensorMode, ProxyTorchDispatchMode and SchemaCheckMode may sit
    on the PreDispatch stack, so this patches the class's method instead of stacking a mode.)"""
    dispatch_of = ProxyTorchDispatchMode.__torch_dispatch__
    unwrap_of = PythonKeyTracer.unwrap_proxy

    def fix(tracer: Any, t: Any) -> None:
        if isinstance(t, torch.Tensor) and get_proxy_slot(t, tracer, None) is None:
            if tracer is mode.tracer:
                resolve(t)
            if get_proxy_slot(t, tracer, None) is None and t.layout == torch.strided:
                _resolve_by_storage(tracer, t)

    def dispatch(self: Any, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        for value in (*args, *(kwargs or {}).values()):
            for t in (value if isinstance(value, (list, tuple)) else (value,)):
                fix(self.tracer, t)
        return dispatch_of(self, func, types, args, kwargs)

    def unwrap_proxy(self: Any, e: Any) -> Any:
        fix(self, e)
        return unwrap_of(self, e)

    ProxyTorchDispatchMode.__torch_dispatch__ = dispatch  # type: ignore[method-assign]
    PythonKeyTracer.unwrap_proxy = unwrap_proxy  # type: ignore[method-assign]
    try:
        yield
    finally:
        ProxyTorchDispatchMode.__torch_dispatch__ = dispatch_of  # type: ignore[method-assign]
        PythonKeyTracer.unwrap_proxy = unwrap_of  # type: ignore[method-assign]


def _resolve_by_storage(tracer: Any, t: torch.Tensor) -> None:
    """Track ``t`` as the value ``tracer`` has in its storage with its layout, if one: a tensor it
    tracks, else a node's recorded value (the tracker holds tensors weakly, and a saved value's
    Python object may be gone by the time the engine hands the backward its copy)."""
    storage = StorageWeakRef(t.untyped_storage())
    layout = _layout(t)
    for known in list(tracer.tensor_tracker.keys()):
        if StorageWeakRef(known.untyped_storage()) == storage and _layout(known) == layout:
            track_as(tracer, t, known)
            return
    base = None
    for node in reversed(tracer.graph.nodes):
        value = node.meta.get("val")
        if isinstance(value, torch.Tensor) and StorageWeakRef(value.untyped_storage()) == storage:
            if _layout(value) == layout:
                set_proxy_slot(t, tracer, _ProxyTensor(torch.fx.Proxy(node, tracer), None))
                return
            if base is None or (value._base is None and base.meta["val"]._base is not None):
                base = node  # the storage's own tensor rather than a view of it, where recorded
    if base is not None and _static(t) and _static(base.meta["val"]):
        # a view a kept composite made inside (``linear``'s ``w.t()``): the same view of its
        # base (the storage offset is the fake's: the body's ops make the same views when run)
        node = tracer.create_node("call_function", torch.ops.aten.as_strided.default,
                                  (base, tuple(t.shape), tuple(t.stride()), t.storage_offset()), {})
        node.meta["val"] = t
        set_proxy_slot(t, tracer, _ProxyTensor(torch.fx.Proxy(node, tracer), None))


def _static(t: torch.Tensor) -> bool:
    return all(isinstance(n, int) for n in (*t.shape, *t.stride(), t.storage_offset()))


def _layout(t: torch.Tensor) -> tuple:
    return t.dtype, str(tuple(t.shape)), str(tuple(t.stride())), str(t.storage_offset())


def hop_autograd_kernel(op: Any) -> Callable[..., Any] | None:
    """A torch HOP's own autograd kernel (``py_autograd_impl``): calling it directly runs the
    HOP's ``autograd.Function`` above whatever records below it; None if it has none."""
    kernels = getattr(op, "py_kernels", {})
    return kernels.get(torch._C.DispatchKey.Autograd)


__all__ += ["hop_autograd_kernel"]


@contextlib.contextmanager
def hop_joint_graphs_traced_apart() -> Iterator[None]:
    """While it is open, the forward/backward graphs a HOP's autograd kernel builds of its body
    (``HopGraphMinCutPartitioner.create_partitioned_graph``: ``scan``'s) are traced by a fresh
    make_fx instead of re-entering the one running. Re-entering a ``pre_dispatch=True`` trace (the
    joint program's) loses every value autograd saved inside the body: its joint graph reads them
    as constants holding fake tensors, a program that cannot run (torch 2.11 to 2.15; with an outer
    ``pre_dispatch=False`` trace the same body comes out right). The graphs it returns are then
    recorded by the running trace like any body (the HOP's own proxy-mode rule re-enters it).
    Where the running trace lowers (its decomposition table: ``target=``), the two graphs are
    traced again through that table, as a re-entered trace would have lowered them."""
    import torch.fx.experimental.proxy_tensor as proxy_tensor
    from torch._higher_order_ops.partitioner import HopGraphMinCutPartitioner

    original = HopGraphMinCutPartitioner.__dict__["create_partitioned_graph"]

    def apart(*args: Any, **kwargs: Any) -> Any:
        running = proxy_tensor._CURRENT_MAKE_FX_TRACER
        proxy_tensor._CURRENT_MAKE_FX_TRACER = None
        try:
            partitioned = original.__func__(*args, **kwargs)
            table = getattr(running, "decomposition_table", None)
            if table:
                partitioned.fw_gm = _traced_through(partitioned.fw_gm, table)
                partitioned.bw_gm = _traced_through(partitioned.bw_gm, table)
            return partitioned
        finally:
            proxy_tensor._CURRENT_MAKE_FX_TRACER = running

    HopGraphMinCutPartitioner.create_partitioned_graph = staticmethod(apart)  # type: ignore[method-assign]
    try:
        with hop_partitioner_quiet():
            yield
    finally:
        HopGraphMinCutPartitioner.create_partitioned_graph = original  # type: ignore[method-assign]


@contextlib.contextmanager
def hop_partitioner_quiet() -> Iterator[None]:
    """torch 2.11 and 2.12 set the HOP partitioner's logger to DEBUG when it is imported, so every
    partition of a body (scan's, with an operand that requires grad) prints its graphs: a thousand
    lines for one export. While open, the logger takes its parent's level (torch's: warnings)."""
    import logging

    log = logging.getLogger("torch._higher_order_ops.partitioner")
    level = log.level
    if level != logging.DEBUG:  # (torch 2.13 on): nothing to do. ``setLevel`` clears the cache of
        yield  # every logger the process has, some 0.2 ms an export with transformers loaded
        return
    log.setLevel(logging.NOTSET)
    try:
        yield
    finally:
        log.setLevel(level)


__all__ += ["hop_joint_graphs_traced_apart", "hop_partitioner_quiet"]


def _traced_through(gm: torch.fx.GraphModule, table: dict) -> torch.fx.GraphModule:
    """``gm`` traced again over its placeholders' values, each op through ``table``."""
    from torch._guards import detect_fake_mode
    from torch.fx.experimental.proxy_tensor import make_fx

    values = [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]
    fake_mode = detect_fake_mode(values)
    with fake_mode if fake_mode is not None else contextlib.nullcontext():
        return make_fx(gm, decomposition_table=table, tracing_mode="real")(*values)


def torch_export_forward_backward(ep: Any, joint_loss_index: int = 0) -> Any:
    """torch's joint program of an exported forward (``torch.export.experimental``), for comparisons."""
    import torch.export.experimental as experimental

    return experimental._export_forward_backward(ep, joint_loss_index=joint_loss_index)


def torch_aot_export_joint_with_descriptors(mod: torch.nn.Module, args: tuple, kwargs: dict | None = None) -> Any:
    """torch's ``aot_export_joint_with_descriptors`` (a fresh ExitStack, closed after): its joint
    graph module, each placeholder's and output's descriptor in ``meta["desc"]``, for comparisons."""
    from torch._functorch.aot_autograd import aot_export_joint_with_descriptors

    with contextlib.ExitStack() as stack:
        return aot_export_joint_with_descriptors(stack, mod, args, kwargs or {}).graph_module


__all__ += ["torch_export_forward_backward", "torch_aot_export_joint_with_descriptors"]


def leaf_gradient_hooks(t: torch.Tensor) -> tuple[list[Callable[..., Any]], int]:
    """The hooks ``t.register_hook`` put on a leaf (run on its gradient), in order, and how many
    ``register_post_accumulate_grad_hook`` hooks it has."""
    hooks = list((t._backward_hooks or {}).values())
    post = len(getattr(t, "_post_accumulate_grad_hooks", None) or {})
    return hooks, post


__all__ += ["leaf_gradient_hooks"]


@contextlib.contextmanager
def autocast_recorded(device: str, enabled: bool, dtype: Any) -> Iterator[None]:
    """Autocast set as ``with torch.autocast(device, dtype, enabled)`` sets it, its enter and
    exit recorded in the pre-dispatch trace in progress as torch records them. torch's own
    recording goes through the PreDispatch torch-function mode, which is off the stack while a
    dispatch mode handles a call: a region entered there would go unrecorded."""
    tracer = pre_dispatch_proxy_mode().tracer
    cache = torch.is_autocast_cache_enabled()
    enter = tracer.create_node("call_function", torch.amp.autocast_mode._enter_autocast,
                               (device, dtype, enabled, cache), {})
    enter.meta["val"] = None
    before = (torch.is_autocast_enabled(device), torch.get_autocast_dtype(device))
    torch.set_autocast_enabled(device, enabled)
    torch.set_autocast_dtype(device, dtype)
    try:
        yield
    finally:
        torch.set_autocast_enabled(device, before[0])
        torch.set_autocast_dtype(device, before[1])
        exit_node = tracer.create_node("call_function", torch.amp.autocast_mode._exit_autocast, (enter,), {})
        exit_node.meta["val"] = None


__all__ += ["autocast_recorded"]


def autograd_sequence_nr() -> int:
    """The sequence number the next autograd node made on this thread will take: the nodes an
    op creates are numbered from the value before it up to the value after it."""
    return torch.autograd._get_sequence_nr()  # type: ignore[attr-defined]


def sequence_nr_of(grad_fn: Any) -> int:
    """The number ``grad_fn`` (an autograd graph node) took when it was made."""
    return grad_fn._sequence_nr()


__all__ += ["autograd_sequence_nr", "sequence_nr_of"]
