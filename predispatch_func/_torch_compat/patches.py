"""Patches of torch's globals and thread-local state, for the length of a trace.

Each is a context manager that restores what it changed on every path, the
error path included (``tests/torch_compat/test_torch_assumptions.py`` raises inside each
and checks). What breaks here on a torch upgrade: the patched attribute moves
or torch stops reading it; both show as failing tests of the behaviour.
"""

from __future__ import annotations

import contextlib
import functools
import operator
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from .reexports import (
    FakeTensor,
    FunctionalTensor,
    all_higher_order_ops,
    autocast_state,
    disable_proxy_modes_tracing,
    fsdp_forward_hook_handles,
    fsdp_units,
    stack_trace_anchors,
    written_arguments,
    written_values,
)
from .sdpa_choice import CUDNN, EFFICIENT, FLASH, fused_sdp_choice_on_gpu


@contextlib.contextmanager
def functional_tensor_detach_without_mode() -> Iterator[None]:
    """A ``detach`` of a FunctionalTensor that reaches the tensor's own dispatch with no
    FunctionalTensorMode in the way returns the tensor, as torch 2.15 does: autograd ran
    above this layer, so the detach has no effect there. Torch 2.11 and 2.12 raise
    "Attempting to use FunctionalTensor on its own" instead, and a factory call in forward
    (``torch.arange(n)``, whose C++ wrapper detaches the traced result) failed the export."""
    from torch._subclasses.functional_tensor import FunctionalTensor

    original = FunctionalTensor.__torch_dispatch__
    detach = torch.ops.aten.detach.default

    def dispatch(self: Any, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is detach and len(args) == 1 and isinstance(args[0], FunctionalTensor):
            return args[0]
        return original(self, func, types, args, kwargs)

    FunctionalTensor.__torch_dispatch__ = dispatch  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        FunctionalTensor.__torch_dispatch__ = original  # type: ignore[method-assign]


CUDA_AUTOCAST_KEPT_WARNING = ("torch.autocast('cuda') on a host without a usable GPU: torch turns the "
                              "region off there; the program keeps it, as a GPU host exports it")


@contextlib.contextmanager
def cuda_autocast_kept_without_gpu() -> Iterator[None]:
    """``torch.autocast("cuda", ...)`` opened during the trace stays enabled on a host
    without a usable GPU, where torch's constructor would turn it off (warning "CUDA is not
    available ... Disabling autocast") and the program would silently lose the region. A
    build machine without a GPU then exports the program a GPU host exports (for fake CUDA
    tensors; a CPU tensor is not cast by a CUDA region on either host). One warning of ours
    replaces torch's, naming the model's line."""
    import warnings

    from torch.amp import autocast_mode

    cls = autocast_mode.autocast
    original = cls.__init__

    def init(self: Any, device_type: str, dtype: Any = None, enabled: bool = True,
             cache_enabled: Any = None) -> None:
        if device_type != "cuda" or not enabled or not torch.cuda.amp.common.amp_definitely_not_available():
            original(self, device_type, dtype, enabled, cache_enabled)
            return
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="CUDA is not available")
            original(self, device_type, dtype, enabled, cache_enabled)
        self._enabled = True
        warnings.warn(CUDA_AUTOCAST_KEPT_WARNING, UserWarning, stacklevel=2)

    cls.__init__ = init  # type: ignore[method-assign]
    try:
        yield
    finally:
        cls.__init__ = original  # type: ignore[method-assign]


# each fused attention backend's switch, as ``torch.backends.cuda.sdpa_kernel`` sets them (the
# CPU's flash kernel included): the getter and the setter, for those this torch has
_FUSED_SDP_SWITCHES = [(getattr(torch._C, f"_get_{name}_sdp_enabled"), getattr(torch._C, f"_set_sdp_use_{name}"))
                       for name in ("flash", "mem_efficient", "cudnn", "fa3", "fa4", "overrideable")
                       if hasattr(torch._C, f"_get_{name}_sdp_enabled") and hasattr(torch._C, f"_set_sdp_use_{name}")]


@contextlib.contextmanager
def fused_attention_switched_off() -> Iterator[None]:
    """sdpa's fused backends off, as ``sdpa_kernel([SDPBackend.MATH])`` leaves them: the
    composite then runs its math path on every device. The switches are process-wide, so
    this is for the length of one call; each is restored as it was."""
    was = [get() for get, _ in _FUSED_SDP_SWITCHES]
    for _, set_ in _FUSED_SDP_SWITCHES:
        set_(False)
    try:
        yield
    finally:
        for (_, set_), on in zip(_FUSED_SDP_SWITCHES, was):
            set_(on)


@contextlib.contextmanager
def cuda_sdpa_choice_without_gpu() -> Iterator[None]:
    """On a host without a GPU, sdpa of fake CUDA tensors computes its result with the
    kernel an sm80+ GPU would pick (``sdpa_choice.py``), not the math kernel the CPU
    build falls back to: the result's strides, and with them the program (a view or a
    copy after ``transpose(1, 2).reshape``), are then the GPU host's.

    torch's composite asks a CUDA-only dispatch stub for the choice, not the
    ``_fused_sdp_choice`` op, so the choice cannot be steered; a Python kernel for
    sdpa's CUDA keys stands in for the composite for the length of the trace. Only
    values are computed here (the trace records sdpa itself, above these keys). On a
    host with a GPU nothing changes."""
    if torch.cuda.is_available() or _SDPA_STAND_IN:  # a nested trace (a Function's body) keeps the outer's
        yield
        return
    aten = torch.ops.aten
    sdpa = aten.scaled_dot_product_attention.default

    def fused(query: Any, key: Any, value: Any, dropout_p: float, is_causal: bool, scale: Any,
              choice: int) -> Any:
        if choice == CUDNN:  # the result's layout does not depend on the mask
            return aten._scaled_dot_product_cudnn_attention.default(
                query, key, value, None, False, dropout_p, is_causal, False, scale=scale)[0]
        if choice == FLASH:  # sdpa pads the head dim to a multiple of 8, then slices
            pad = -query.size(-1) % 8
            padded = [aten.constant_pad_nd.default(t, [0, pad]) if pad else t for t in (query, key, value)]
            out = aten._scaled_dot_product_flash_attention.default(*padded, dropout_p, is_causal, False,
                                                                   scale=scale)[0]
            return aten.slice.Tensor(out, -1, 0, query.size(-1)) if pad else out
        return aten._scaled_dot_product_efficient_attention.default(  # nor here
            query, key, value, None, False, dropout_p, is_causal, scale=scale)[0]

    def kernel(query: Any, key: Any, value: Any, attn_mask: Any = None, dropout_p: float = 0.0,
               is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False) -> Any:
        choice = fused_sdp_choice_on_gpu(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
        if choice not in (CUDNN, FLASH, EFFICIENT):
            return sdpa.decompose(query, key, value, attn_mask, dropout_p, is_causal, scale=scale,
                                  enable_gqa=enable_gqa)
        with torch._C._AutoDispatchBelowAutograd():
            out = fused(query, key, value, dropout_p, is_causal, scale, choice)
            # a tensor of its own, as the GPU's kernel returns (the meta kernels' results are views)
            return aten.empty_strided.default(out.shape, out.stride(), dtype=out.dtype, device=out.device)

    library = torch.library.Library("aten", "IMPL")
    _SDPA_STAND_IN.append(library)
    try:
        for key in ("AutogradCUDA", "CUDA"):
            library.impl("scaled_dot_product_attention", kernel, key)
        yield
    finally:
        _SDPA_STAND_IN.pop()
        library._destroy()


_SDPA_STAND_IN: list[Any] = []  # the registration in force: one per process, however nested the traces


@contextlib.contextmanager
def cuda_grid_sampler_faked_without_gpu() -> Iterator[None]:
    """On a host without a GPU, cuDNN's grid sampler gets a fake kernel for the length of the
    trace (torch has none; it runs real kernels on fakes, which needs a GPU). The GPU host's
    trace takes it where cuDNN takes the call (an fp32 ``grid_sampler`` inside CUDA autocast:
    trace/autocast_composites.py), so the host without a GPU records the same op. Shapes only:
    the result is (N, C, grid's H, grid's W), the gradients are laid out as the inputs."""
    if torch.cuda.is_available() or _GRID_SAMPLER_FAKE:
        yield
        return

    def forward(self: Any, grid: Any) -> Any:
        return self.new_empty((self.size(0), self.size(1), grid.size(1), grid.size(2)))

    def backward(self: Any, grid: Any, grad_output: Any) -> Any:
        return torch.empty_like(self), torch.empty_like(grid)

    library = torch.library.Library("aten", "IMPL")
    _GRID_SAMPLER_FAKE.append(library)
    try:
        library.impl("cudnn_grid_sampler", forward, "Meta")
        library.impl("cudnn_grid_sampler_backward", backward, "Meta")
        yield
    finally:
        _GRID_SAMPLER_FAKE.pop()
        library._destroy()


_GRID_SAMPLER_FAKE: list[Any] = []  # the registration in force, however nested the traces


@contextlib.contextmanager
def cuda_batch_norm_reserve_without_gpu() -> Iterator[None]:
    """On a host without a GPU, ``_batch_norm_with_update`` of fake CUDA tensors (training batch
    norm on a GPU: trace/composite_policy.py) gets an empty cuDNN reserve space: torch's fake
    kernel asks cuDNN for the reserve's size, which needs a GPU. The reserve is read only by
    cuDNN's backward, so only that value's size differs from the GPU host's, never the program's
    ops. On a host with a GPU nothing changes."""
    if torch.cuda.is_available():
        yield
        return
    name = "_get_cudnn_batch_norm_reserve_space_size"  # not in torch._C's stubs
    original = getattr(torch._C, name)
    setattr(torch._C, name, lambda input, training: 0)
    try:
        yield
    finally:
        setattr(torch._C, name, original)


def cudnn_draws_rnn_dropout(op: Any, args: tuple) -> bool:
    """Whether a call of ``lstm``/``gru``/``rnn_*`` drops between layers inside cuDNN (training on
    CUDA with cuDNN on): its mask comes from cuDNN's own dropout state, which no op reads."""
    names = ("aten.lstm.input", "aten.gru.input", "aten.rnn_tanh.input", "aten.rnn_relu.input")
    if str(op) not in names or len(args) < 7:
        return False
    first, num_layers, dropout, train = args[0], args[4], args[5], args[6]
    return (isinstance(first, torch.Tensor) and first.is_cuda and bool(torch.backends.cudnn.enabled)
            and bool(dropout) and bool(train) and num_layers > 1)


@contextlib.contextmanager
def rnn_decompositions_as_eager() -> Iterator[None]:
    """torch's Python decompositions of ``lstm``, ``gru`` and ``rnn_*`` (what a trace runs: torch
    registers them for the Autograd key too) differ from eager's kernels in two ways, fixed while
    inside:

    * ``lstm`` takes oneDNN's layer in inference mode (``train=False``, no workspace) whenever the
      *input* does not require grad, even where the weights do (a model's first LSTM over data):
      autograd then records oneDNN's backward, which needs the workspace, and the traced step fails
      when run (torch's own joint path fails alike). The oneDNN layer is taken here only where no
      operand requires grad or grad is off; otherwise the per-step decomposition.
    * the dropout between layers (``nn.LSTM(..., dropout=p)`` in training) is never applied: the
      helper zeroes it on every layer (``num_layers < i - 1``). A lowered program ran without it;
      a kept node's backward, recomputed through the decomposition, was silently wrong. Here each
      layer after the first gets its input through ``torch.dropout`` as eager's kernel drops the
      layer below's output (the same draws, in the same order); only where torch's helper is
      seen to drop nothing (``_rnn_helper_drops_nothing``), so a torch that fixes it is left as is.
    """
    from torch._decomp import decompositions

    original_select = decompositions.select_one_layer_lstm_function
    original_helper = decompositions._rnn_helper

    def select(input: torch.Tensor, hx: Any, params: Any) -> Any:
        chosen = original_select(input, hx, params)
        operands = [input, *hx, *(t for layer in params for t in layer)]
        if chosen is decompositions.mkldnn_one_layer_lstm and torch.is_grad_enabled() and any(
                isinstance(t, torch.Tensor) and t.requires_grad for t in operands):
            return decompositions.one_layer_lstm
        return chosen

    def helper(input: Any, hidden: Any, params: Any, has_biases: bool, num_layers: int, dropout: float,
               train: bool, bidirectional: bool, batch_first: bool, layer_fn: Any) -> Any:
        if dropout and train and num_layers > 1 and _rnn_helper_drops_nothing():
            layer_fn = _dropping_between_layers(layer_fn, float(dropout))
        return original_helper(input, hidden, params, has_biases, num_layers, dropout, train, bidirectional,
                               batch_first, layer_fn)

    _rnn_helper_drops_nothing()  # probed once per process, before any layer asks
    decompositions.select_one_layer_lstm_function = select
    decompositions._rnn_helper = helper
    try:
        yield
    finally:
        decompositions.select_one_layer_lstm_function = original_select
        decompositions._rnn_helper = original_helper


@contextlib.contextmanager
def rnn_weights_left_unflattened() -> Iterator[None]:
    """``nn.LSTM``/``GRU``/``RNN`` on CUDA flatten their weights into one cuDNN buffer when they see
    new weight tensors (a trace's fakes are new), reading each one's ``data_ptr()``, which a fake
    tensor has none of: the export failed ("Cannot access data pointer"). While inside, weights
    that are a trace's tensors are left as they are: the flattening only lays out memory for
    cuDNN, and the recorded ``lstm`` call takes the weights either way."""
    original = torch.nn.RNNBase.flatten_parameters

    def flatten_parameters(self: torch.nn.RNNBase) -> None:
        if any(isinstance(w, (FakeTensor, FunctionalTensor)) for w in self._flat_weights):
            return
        original(self)

    torch.nn.RNNBase.flatten_parameters = flatten_parameters  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.nn.RNNBase.flatten_parameters = original  # type: ignore[method-assign]


def _dropping_between_layers(layer_fn: Callable[..., Any], p: float) -> Callable[..., Any]:
    """``layer_fn`` whose input, from the second layer on, is the layer below's output dropped once
    (a bidirectional layer's two directions read the same dropped tensor)."""
    first: list[Any] = []
    last: list[Any] = []  # (the raw input, its dropped value) of the latest layer after the first

    def layer(inp: Any, *args: Any, **kwargs: Any) -> Any:
        if not first:
            first.append(inp)
        elif inp is not first[0]:
            if not last or last[0][0] is not inp:
                last[:] = [(inp, torch.dropout(inp, p, True))]
            inp = last[0][1]
        return layer_fn(inp, *args, **kwargs)
    return layer


@functools.cache
def _rnn_helper_drops_nothing() -> bool:
    """Whether torch's ``_rnn_helper`` skips the dropout between layers, seen by running it once
    with layers that return their input (an all-ones input comes back unchanged only if nothing
    dropped it)."""
    from torch._decomp import decompositions

    def identity_layer(inp: Any, hidden: Any, params: Any, has_biases: bool, reverse: bool = False) -> Any:
        return inp, hidden

    with outside_all_modes():  # real tensors, whatever trace is running (the answer is cached)
        ones = torch.ones(4, 1, 64)
        state = torch.get_rng_state()
        try:
            out, _ = decompositions._rnn_helper(ones, [None, None], [(), ()], True, 2, 0.5, True, False, False,
                                                identity_layer)
        finally:
            torch.set_rng_state(state)
        return bool(torch.equal(out, ones))


@contextlib.contextmanager
def below_pre_dispatch() -> Iterator[None]:
    """Run ops on fake tensors without our PreDispatch modes or proxy tracing."""
    keys = torch._C.DispatchKeySet(torch._C.DispatchKey.PreDispatch) | torch._C.DispatchKeySet(
        torch._C.DispatchKey.Functionalize
    )
    with torch._C._ExcludeDispatchKeyGuard(keys), disable_proxy_modes_tracing():
        yield


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


@contextlib.contextmanager
def exported_program_code_on_first_use() -> Iterator[None]:
    """An ExportedProgram made meanwhile holds a graph module whose Python code is generated
    on first use (a call, ``.code``, printing, pickling), not when the program is made:
    most programs are unlifted (``module()`` generates its own code), serialized or handed
    to a compiler, and never run through that code. torch's constructor builds the module in
    ``_create_graph_module_for_export``; it is swapped for the length of the block."""
    import torch.export.exported_program as exported_program
    from torch.fx._lazy_graph_module import _LazyGraphModule

    eager = exported_program._create_graph_module_for_export
    exported_program._create_graph_module_for_export = _LazyGraphModule
    try:
        yield
    finally:
        exported_program._create_graph_module_for_export = eager


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


@contextlib.contextmanager
def grad_mode_untraced(enabled: bool) -> Iterator[None]:
    """Set grad mode without recording a marker (the caller records its own)."""
    previous = torch.is_grad_enabled()
    torch._C._set_grad_enabled(enabled)
    try:
        yield
    finally:
        torch._C._set_grad_enabled(previous)


def _a_recordable_frame_on_the_stack(frame: Any, anchors: set[tuple[str, str]]) -> bool:
    """Whether any live frame is one fx's stack filter could keep: a ``forward``, a frame of
    ``torch/__init__.py`` or one of torch's anchors (``TracerBase._filter_traceback_frames``,
    both of its branches); without one its filtered stack is empty, whatever else is there."""
    while frame is not None:
        code = frame.f_code
        if code.co_name == "forward" or code.co_filename.endswith("torch/__init__.py") \
                or (code.co_filename, code.co_name) in anchors:
            return True
        frame = frame.f_back
    return False


@contextlib.contextmanager
def stack_capture_only_under_a_recordable_frame() -> Iterator[None]:
    """fx's tracer captures and symbolizes the whole Python stack (some 60 frames inside our
    trace, 50-100 us) for every node made without a ``stack_trace`` in the current meta, then
    keeps only the frames its filter names. A node made with none of them on the stack (the
    placeholders and output, whose trace make_fx deletes anyway; grad-mode markers of a body's
    entry; nodes our passes add) got nothing from it: 20-50 captures an export, 2-5 ms. Here
    such a node skips the capture, after a walk of the live frames (a few us) finds none; a
    node made under one is captured by fx as before, so every stack_trace is fx's. A tracer with a
    filter of its own is left alone."""
    from torch.fx.proxy import TracerBase

    original = TracerBase.create_node
    anchors = stack_trace_anchors()

    import torch.fx.traceback as fx_traceback

    def meta_gives_one() -> bool:  # fx then copies the current meta's stack_trace and captures nothing
        return fx_traceback.has_preserved_node_meta() and bool(fx_traceback.get_current_meta().get("stack_trace"))

    filter_frames = TracerBase._filter_traceback_frames  # the filter the walk restates

    @functools.wraps(original)
    def create_node(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not self.record_stack_traces or meta_gives_one() \
                or type(self)._filter_traceback_frames is not filter_frames \
                or _a_recordable_frame_on_the_stack(sys._getframe(1), anchors):  # noqa: SLF001
            return original(self, *args, **kwargs)
        self.record_stack_traces = False
        try:
            return original(self, *args, **kwargs)
        finally:
            self.record_stack_traces = True

    TracerBase.create_node = create_node  # type: ignore[method-assign]
    try:
        yield
    finally:
        TracerBase.create_node = original  # type: ignore[method-assign]


def _passes_modules_through(wrapper: Any) -> bool:
    """Whether ``wrapper`` (fx's ``module_call_wrapper`` or ``module_getattr_wrapper``) belongs to
    a tracer whose ``call_module`` and ``getattr`` are make_fx's: the call, and the attribute, as
    they are. The tracer is the one the wrapper closes over."""
    from torch.fx import Tracer
    from torch.fx.experimental.proxy_tensor import PythonKeyTracer

    for cell in getattr(wrapper, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if isinstance(value, Tracer):
            kind = type(value)
            return kind.call_module is PythonKeyTracer.call_module and kind.getattr is PythonKeyTracer.getattr
    return False


@contextlib.contextmanager
def module_methods_left_unpatched() -> Iterator[None]:
    """fx's ``Tracer.trace`` sets ``nn.Module.__call__`` and ``__getattr__`` to wrappers around
    its tracer's ``call_module`` and ``getattr``, and restores them after: four ``setattr`` on
    ``nn.Module`` a trace, each invalidating the type cache of every subclass (60 us in a bare
    process, 300 us with transformers, timm and torchvision imported: 1-5% of a small model's
    export, three times over with a custom Function's bodies). make_fx's tracer passes both
    through (``call_module`` calls ``forward``, ``getattr`` returns the value; the autowrap check
    the call wrapper makes patches functions that run as they are on tensors), so for it the
    patch is skipped; any other tracer is patched by fx as before."""
    from torch.fx import _symbolic_trace

    patcher = _symbolic_trace._Patcher
    original = patcher.patch_method

    @functools.wraps(original)
    def patch_method(self: Any, cls: type, name: str, new_fn: Any, deduplicate: bool = True) -> None:
        if cls is torch.nn.Module and name in ("__call__", "__getattr__") and _passes_modules_through(new_fn):
            return
        original(self, cls, name, new_fn, deduplicate)

    patcher.patch_method = patch_method  # type: ignore[method-assign]
    try:
        yield
    finally:
        patcher.patch_method = original  # type: ignore[method-assign]


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


@contextlib.contextmanager
def only_function_modes(kept: Callable[[Any], bool]) -> Iterator[None]:
    """Only the torch-function modes ``kept`` accepts on the stack while active; the stack is the
    same objects in the same order after, on every path. Every mode on the stack sees each
    tensor property read in Python (``t.shape``, ``t.stride()``): a body traced inside a trace,
    or fakes made outside it, paid the trace in progress's five modes on each (a quarter of a
    small custom Function's export); and torch's ``autocast.__enter__``/``__exit__`` record the
    region into the *first* ``PreDispatchTorchFunctionMode`` of the stack (``amp/autocast_mode.py``),
    which, while a body is traced inside a trace, is the caller's unless hidden."""
    modes = torch.overrides._get_current_function_mode_stack()
    left = [m for m in modes if kept(m)]
    if len(left) == len(modes):
        yield
        return
    _replace_function_mode_stack(left)
    try:
        yield
    finally:
        _replace_function_mode_stack(modes)


def non_strict_export_handler(mode: Any) -> bool:
    """torch.export's torch-function handler (its rewrites of ``torch.tensor``, scalar-tensor
    indexing, asserts and collectives), which a body must see as the program's code does."""
    from torch._export.non_strict_utils import _NonStrictTorchFunctionHandler

    return isinstance(mode, _NonStrictTorchFunctionHandler)


def _replace_function_mode_stack(modes: list[Any]) -> None:
    while torch._C._len_torch_function_stack() > 0:
        torch._C._pop_torch_function_stack()
    for mode in modes:
        torch._C._push_on_torch_function_stack(mode)


@contextlib.contextmanager
def outside_trace() -> Iterator[None]:
    """Leave the trace in progress (all dispatch modes popped), to trace a body
    of a HOP into its own graph with a fresh tracer, then come back."""
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        yield


@contextlib.contextmanager
def callers_fake_mode_unset() -> Iterator[None]:
    """Export called inside the user's ``with FakeTensorMode():`` (a model built on fakes) runs
    outside it, as torch.export does: the program's values belong to the export's own fake
    mode, and torch's ExportedProgram refuses two active fake modes. The user's fake inputs
    and parameters are fake-ified again in the export's mode."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():
        yield


@contextlib.contextmanager
def autocast_nesting_restored() -> Iterator[None]:
    """Put autocast's nesting count back after the trace. ``torch.autocast.__enter__`` raises
    it and ``__exit__`` lowers it, clearing the weight-cast cache at zero; a model that enters
    autocast and raises (or never exits) left it raised, so the caller's later autocast
    regions kept reusing casts of weights an optimizer had since updated."""
    before = torch.autocast_increment_nesting() - 1
    torch.autocast_decrement_nesting()
    try:
        yield
    finally:
        now = torch.autocast_increment_nesting() - 1
        torch.autocast_decrement_nesting()
        for _ in range(now - before):
            if torch.autocast_decrement_nesting() == 0:
                torch.clear_autocast_cache()


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
def autograd_engine_runs_routed(on_run: Callable[[str], None]) -> Iterator[None]:
    """Call ``on_run(what)`` before autograd's engine runs a backward pass: ``what`` is
    ``"torch.autograd.grad"`` (it asks for gradients, ``accumulate_grad=False``) or
    ``"backward()"`` (``Tensor.backward``, ``torch.autograd.backward``: they accumulate into
    ``.grad``). All three reach the engine through ``torch.autograd._engine_run_backward``,
    the name ``torch/autograd/__init__.py`` imports and calls, so the patch is that global."""
    import torch.autograd as autograd_module

    original = autograd_module._engine_run_backward

    def routed(t_outputs: Any, *args: Any, **kwargs: Any) -> Any:
        on_run("torch.autograd.grad" if kwargs.get("accumulate_grad") is False else "backward()")
        return original(t_outputs, *args, **kwargs)

    autograd_module._engine_run_backward = routed
    try:
        yield
    finally:
        autograd_module._engine_run_backward = original


@contextlib.contextmanager
def rng_reseeds_routed(on_reseed: Callable[[str], None]) -> Iterator[None]:
    """Call ``on_reseed(name)`` before ``torch.manual_seed``/``torch.seed``, and before a
    ``torch.set_rng_state`` that changes the CPU generator's state (torch's own tracers
    restore the state they saved, which changes nothing)."""
    import torch.random as random_module

    originals = {name: getattr(random_module, name) for name in ("manual_seed", "seed", "set_rng_state")}
    # torch's own names may differ from torch.random's: dynamo wraps torch.manual_seed in
    # torch._disable_dynamo once imported, and that wrapper must come back
    torch_originals = {name: getattr(torch, name) for name in originals}

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
            setattr(torch, name, torch_originals[name])


@contextlib.contextmanager
def inference_mode_as_grad_mode() -> Iterator[None]:
    """``torch.inference_mode(m)`` sets grad mode to ``not m`` (recorded like ``no_grad``)
    instead of entering C++ inference mode, which a trace cannot hold: its values are
    a ``no_grad`` region's (see docs/regions.md)."""
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


def hop_capture_static() -> Any:
    """torch's HOP wrappers (``map``, ``cond``) capture their bodies with dynamo, which
    after a first capture in the process makes changed Python ints (pytree spec
    sizes) graph inputs without values; keep them constants, as on a first capture."""
    return torch._dynamo.config.patch(automatic_dynamic_shapes=False)


@contextlib.contextmanager
def dynamo_function_capture_refused(refuse: Callable[[type], None]) -> Iterator[None]:
    """Call ``refuse(cls)`` when dynamo captures ``cls.apply`` (a custom autograd.Function
    inside a torch HOP body): dynamo inlines its forward when nothing requires grad."""
    from torch._dynamo.variables.misc import AutogradFunctionVariable

    original = AutogradFunctionVariable.call_apply

    def call_apply(self, *args, **kwargs):
        refuse(self.fn_cls)
        return original(self, *args, **kwargs)

    with _replaced(AutogradFunctionVariable, "call_apply", call_apply):
        yield


@contextlib.contextmanager
def below_autograd() -> Iterator[None]:
    """Dispatch below the Autograd key (a HOP's autograd rule calling the HOP again)."""
    with torch._C._AutoDispatchBelowAutograd():
        yield


@contextlib.contextmanager
def func_transform_levels_wrapped(around: Callable[[], contextlib.AbstractContextManager[Any]]) -> Iterator[None]:
    """Enter ``around()`` around every level a ``torch.func`` transform opens (functorch's
    ``vmap_increment_nesting``, ``grad_increment_nesting``, ``jvp_increment_nesting``, which
    ``vmap``, ``grad``, ``vjp``, ``jvp``, ``jacrev``, ``jacfwd`` and ``hessian`` enter) and
    around the backward a ``vjp`` function runs after its level closed (``_autograd_grad``);
    each is looked up by name in its module when called. While dynamo captures (a HOP's
    body), torch's own are back. And functorch's pre-dispatch wrappers (``torch._functorch.predispatch``)
    run their kernels instead of recording themselves as graph nodes (torch.export's
    non-functional form of vmap, which also asserts on a nested trace's second
    ``PreDispatchTorchFunctionMode``)."""
    import torch._export.utils as export_utils
    import torch._functorch.eager_transforms as eager_transforms
    import torch._functorch.vmap as vmap_module

    def level(original: Callable[..., Any]) -> Callable[..., Any]:
        @contextlib.contextmanager
        def entered(*args: Any, **kwargs: Any) -> Iterator[Any]:
            with around(), original(*args, **kwargs) as opened:
                yield opened

        def opening(*args: Any, **kwargs: Any) -> Any:
            if torch.compiler.is_dynamo_compiling():
                return original(*args, **kwargs)
            return entered(*args, **kwargs)
        return opening

    def call(original: Callable[..., Any]) -> Callable[..., Any]:
        def called(*args: Any, **kwargs: Any) -> Any:
            if torch.compiler.is_dynamo_compiling():
                return original(*args, **kwargs)
            with around():
                return original(*args, **kwargs)
        return called

    places = [(vmap_module, "vmap_increment_nesting", level), (eager_transforms, "grad_increment_nesting", level),
              (eager_transforms, "jvp_increment_nesting", level), (eager_transforms, "_autograd_grad", call),
              (export_utils, "_maybe_find_pre_dispatch_tf_mode_for_export", lambda _: lambda: None)]
    originals = [getattr(module, name) for module, name, _ in places]
    wrapped = [wrap(original) for (_, _, wrap), original in zip(places, originals)]

    def install(values: list[Any]) -> None:
        for (module, name, _), value in zip(places, values):
            setattr(module, name, value)

    # dynamo knows the level context managers by identity (a set built when it is imported, and
    # a check when it meets one): it must see torch's own, so import it first, and capture a
    # HOP's body (cond, map, scan: torch._higher_order_ops.utils) with torch's functions back
    import torch._dynamo.variables.torch  # noqa: F401
    import torch._higher_order_ops.utils as hop_utils

    compilation_env = hop_utils._set_compilation_env

    @contextlib.contextmanager
    def compiling_with_torchs(*args: Any, **kwargs: Any) -> Iterator[None]:
        install(originals)
        try:
            with compilation_env(*args, **kwargs):
                yield
        finally:
            install(wrapped)

    install(wrapped)
    hop_utils._set_compilation_env = compiling_with_torchs
    try:
        yield
    finally:
        install(originals)
        hop_utils._set_compilation_env = compilation_env


@contextlib.contextmanager
def trace_moved_below_autograd(functional_mode: Any) -> Iterator[None]:
    """For the block, trace on the Python key (below autograd and functorch's transforms)
    instead of PreDispatch: the PreDispatch modes step aside, the same tracer records
    through a proxy mode on the Python key under ``functional_mode`` (one made with
    ``pre_dispatch=False``), as ``ExportedProgram.run_decompositions`` traces."""
    from torch._ops import _len_torch_dispatch_stack_pre_dispatch, _pop_mode_from_pre_dispatch
    from torch.fx.experimental.proxy_tensor import ProxyTorchDispatchMode
    from torch.utils._python_dispatch import _push_mode

    stepped_aside = [_pop_mode_from_pre_dispatch() for _ in range(_len_torch_dispatch_stack_pre_dispatch())]
    try:
        proxy = next((m for m in stepped_aside if isinstance(m, ProxyTorchDispatchMode)), None)
        if proxy is None:
            raise RuntimeError("trace_moved_below_autograd: no tracing proxy mode on the PreDispatch key")
        below = ProxyTorchDispatchMode(proxy.tracer, proxy.tracing_mode, pre_dispatch=False,
                                       _allow_fake_constant=proxy._allow_fake_constant,
                                       _error_on_data_dependent_ops=proxy._error_on_data_dependent_ops)
        with below, functional_mode:
            yield
    finally:
        for mode in reversed(stepped_aside):
            _push_mode(mode)


@contextlib.contextmanager
def non_strict_call_rewrites() -> Iterator[None]:
    """What torch.export runs a model under when it traces it non-strict: its TorchFunctionMode
    (indexing with SymInts as ``select``/``slice``, ``torch.tensor`` of SymInts in its traceable
    form, ``torch.distributed`` collectives as functional ones) and its builtins (``max``/``min``
    of SymInts as ``torch.sym_max``/``sym_min``, of tensors as ``maximum``/``minimum``;
    ``math.pow`` as ``**``). Both restore on exit, torch's own context managers. Also as torch.export:
    the mkldnn and nnpack backends off, so a fake kernel that picks one by size (conv's, mkldnn at a
    batch of 16) does not fix a dynamic dim's range. Not cudnn, which torch.export also turns off:
    ``F.layer_norm``/``batch_norm`` pass ``cudnn.enabled`` as an argument, so the program would
    carry ``cudnn_enable=False`` and run those ops without cudnn on a GPU."""
    from torch._export.non_strict_utils import _NonStrictTorchFunctionHandler, _override_builtin_ops

    backends = (torch.backends.mkldnn, torch.backends.nnpack)
    with _NonStrictTorchFunctionHandler(), _override_builtin_ops(), _functional_bool_checks_numel():
        before = [backend.set_flags(False) for backend in backends]
        try:
            yield
        finally:
            for backend, flags in zip(backends, before):
                backend.set_flags(*flags)


@contextlib.contextmanager
def _functional_bool_checks_numel() -> Iterator[None]:
    """``bool()`` of a tensor in forward fails as eager's does: torch's ``FunctionalTensor.__bool__``
    goes straight to ``item()``, so ``max(x, n)`` over a many-element ``x`` (Python comparing a tensor)
    failed with ``item``'s "cannot be converted to Scalar" where eager, and torch.export's trace of
    plain fake tensors, say "Boolean value of Tensor with more than one value is ambiguous". A size
    the trace cannot decide is left to ``item()``, as before."""
    from torch._subclasses.functional_tensor import FunctionalTensor
    from torch.fx.experimental.symbolic_shapes import guard_or_false

    plain = FunctionalTensor.__bool__

    def checked(self: Any) -> bool:
        numel = self.numel()
        if guard_or_false(numel == 0):
            raise RuntimeError("Boolean value of Tensor with no values is ambiguous")
        if guard_or_false(numel > 1):
            raise RuntimeError("Boolean value of Tensor with more than one value is ambiguous")
        return plain(self)

    with _replaced(FunctionalTensor, "__bool__", checked):
        yield


@contextlib.contextmanager
def module_getattr_wrapped(wrap: Callable[[torch.nn.Module, str, Any], Any]) -> Iterator[None]:
    """For the block, ``module.name`` that ``nn.Module.__getattr__`` answers (parameters, buffers,
    submodules) gives ``wrap(module, name, value)``: how torch.export's non-strict trace learns the
    path ``forward`` walked to a submodule (fx's tracer patches the same method)."""
    original = torch.nn.Module.__getattr__

    def wrapped(self: torch.nn.Module, name: str) -> Any:
        return wrap(self, name, original(self, name))

    with _replaced(torch.nn.Module, "__getattr__", wrapped):
        yield


@contextlib.contextmanager
def tensor_metadata_recorded_through(fast: Callable[[torch.Tensor], Any]) -> Iterator[None]:
    """For the block, fx's proxy tracer stamps each node's ``tensor_meta`` with ``fast(result)``
    where that is not None (``reimplemented.static_tensor_metadata``: the same value, sooner),
    with torch's ``_extract_tensor_metadata`` otherwise."""
    import torch.fx.experimental.proxy_tensor as proxy_tensor

    torchs = proxy_tensor._extract_tensor_metadata
    if getattr(torchs, "_recorded_through", False):  # a body traced inside a trace: already so
        yield
        return

    def recorded(result: torch.Tensor, include_contiguity: bool = True) -> Any:
        value = fast(result) if include_contiguity else None
        return value if value is not None else torchs(result, include_contiguity)

    recorded._recorded_through = True  # type: ignore[attr-defined]
    proxy_tensor._extract_tensor_metadata = recorded
    try:
        yield
    finally:
        proxy_tensor._extract_tensor_metadata = torchs


NOT_RECORDED = object()  # what a direct recorder answers for a call it leaves to torch's proxy_call
# a flag, not a mark on the function as for the other recorder patches: node_values_unsnapshotted
# wraps proxy_call again inside this one
_direct_recorder_installed = False


@contextlib.contextmanager
def op_calls_recorded_through(direct: Callable[..., Any]) -> Iterator[None]:
    """For the block, fx's proxy tracer records each op call with ``direct(mode, func,
    pre_dispatch, args, kwargs)`` (``reimplemented.record_op_call``: the common call in
    fewer steps), and with torch's ``proxy_call`` where that answers ``NOT_RECORDED``."""
    import torch.fx.experimental.proxy_tensor as proxy_tensor

    global _direct_recorder_installed
    if _direct_recorder_installed:  # a body traced inside a trace: already so
        yield
        return
    torchs = proxy_tensor.proxy_call

    def proxy_call(mode: Any, func: Any, pre_dispatch: bool, args: tuple, kwargs: dict) -> Any:
        out = direct(mode, func, pre_dispatch, args, kwargs)
        return torchs(mode, func, pre_dispatch, args, kwargs) if out is NOT_RECORDED else out

    proxy_tensor.proxy_call = proxy_call  # type: ignore[assignment]
    _direct_recorder_installed = True
    try:
        yield
    finally:
        proxy_tensor.proxy_call = torchs
        _direct_recorder_installed = False


@contextlib.contextmanager
def node_values_unsnapshotted() -> Iterator[None]:
    """For the block, fx's proxy tracer records an op's fake result itself as its node's
    ``meta["val"]`` where torch's ``snapshot_fake`` would record a detached copy of it.

    torch copies so that a later in-place change of the tensor's metadata (``t_()``,
    ``resize_()``) leaves the value recorded for the node as it was. Below
    functionalization no op writes its inputs, and a copy costs a fake tensor per node
    (a twentieth of an export). So the copy is made only where it would differ: a result
    that requires grad, holds a constant or a real tensor (torch's copy drops them), and,
    before any op that writes a tensor whose node holds it uncopied, of that tensor.

    And the result of a factory (``full``, ``zeros``, ``ones_like``, ``new_empty``...): called
    through Python (``torch.full``), its result passes through torch's C++ factory wrapper,
    which hands back a shallow copy when the tensor has another owner. With the node holding
    the result itself, the caller got a tensor the tracer never saw: a constant with no value,
    inside lowerings reached from an in-place op (``hypot_``, ``lerp_``, ``index_fill_`` under
    ``target=``). Pinned by tests/opsets/test_lowering_refusals.py."""
    import torch.fx.experimental.proxy_tensor as proxy_tensor
    from torch._subclasses.fake_tensor import FakeTensor

    torchs_snapshot, torchs_call = proxy_tensor.snapshot_fake, proxy_tensor.proxy_call
    if getattr(torchs_snapshot, "_unsnapshotted", False):  # a body traced inside a trace: already so
        yield
        return
    in_factory = [False]  # whether the call being recorded makes a fresh tensor

    def snapshot_fake(val: torch.Tensor, include_real: bool = False) -> Any:
        if (in_factory[0] or include_real or type(val) is not FakeTensor or val.requires_grad
                or val.constant is not None or val.real_tensor is not None):
            return torchs_snapshot(val, include_real)
        return val

    def proxy_call(mode: Any, func: Any, pre_dispatch: bool, args: tuple, kwargs: dict) -> Any:
        if written_arguments(func):
            _snapshot_recorded_values(mode.tracer, written_values(func, args, kwargs), torchs_snapshot)
        outer, in_factory[0] = in_factory[0], _is_factory(func)
        try:
            return torchs_call(mode, func, pre_dispatch, args, kwargs)
        finally:
            in_factory[0] = outer

    snapshot_fake._unsnapshotted = True  # type: ignore[attr-defined]
    proxy_tensor.snapshot_fake, proxy_tensor.proxy_call = snapshot_fake, proxy_call  # type: ignore[assignment]
    try:
        yield
    finally:
        proxy_tensor.snapshot_fake, proxy_tensor.proxy_call = torchs_snapshot, torchs_call


_FACTORIES: dict[Any, bool] = {}


def _is_factory(func: Any) -> bool:
    """An op making a fresh tensor: no tensor argument, or one read only for its metadata
    (``*_like``, ``new_*``)."""
    known = _FACTORIES.get(func)
    if known is None:
        schema = getattr(func, "_schema", None)
        base = schema.name.split("::")[-1] if schema is not None else ""
        takes_tensors = schema is not None and any(
            "Tensor" in str(argument.type) for argument in schema.arguments)
        known = _FACTORIES[func] = schema is not None and (
            base.endswith("_like") or base.startswith("new_") or not takes_tensors)
    return known


def _snapshot_recorded_values(tracer: Any, values: list[Any], snapshot: Callable[..., Any]) -> None:
    """Before an op writes ``values``, give each node holding one of their tensors uncopied
    (the node that made it, and a multi-result node's tuple) torch's copy of it."""
    from torch.fx.experimental.proxy_tensor import get_proxy_slot

    for t in [v for value in values for v in (value if isinstance(value, (list, tuple)) else [value])]:
        if not isinstance(t, torch.Tensor):
            continue
        tracked = get_proxy_slot(t, tracer, None)
        node = tracked.proxy.node if tracked is not None else None
        for holder in (node, *(node.args[:1] if node is not None and node.target is operator.getitem else ())):
            if not isinstance(holder, torch.fx.Node):
                continue
            val = holder.meta.get("val")
            if val is t:
                holder.meta["val"] = snapshot(t)
            elif isinstance(val, (list, tuple)) and any(v is t for v in val):
                holder.meta["val"] = type(val)(snapshot(v) if v is t else v for v in val)


@contextlib.contextmanager
def module_methods_wrapped(wrap: Callable[[str, Callable[..., Any]], Callable[..., Any]],
                           names: tuple[str, ...], modules: Iterable[torch.nn.Module]) -> Iterator[None]:
    """Each ``nn.Module`` method of ``names`` is ``wrap(name, original)`` for the calls on
    ``modules`` in the block, and the original after, however the block ends (the state guard
    records attribute writes this way).

    A slot method (``__setattr__``, ``__delattr__``) is replaced on the classes of ``modules``
    where each inherits torch's own: replacing it on ``nn.Module`` makes CPython update that slot
    in every subclass loaded, 0.55 ms a method and direction with transformers, timm and
    torchvision imported (1,459 subclasses), where the model's own classes have few. Where one of
    them overrides the method (``RNNBase.__setattr__``) it is replaced on ``nn.Module``, which the
    override's ``super()`` call reaches, as for the other methods (cheap there: no slot). Each
    wrapper wraps the method its class resolved before any was replaced, so a call meets one."""
    classes = list(dict.fromkeys(type(module) for module in modules))
    replacements = []
    for name in names:
        torchs = getattr(torch.nn.Module, name)
        on_classes = name.startswith("__") and classes and all(getattr(cls, name) is torchs for cls in classes)
        for owner in classes if on_classes else [torch.nn.Module]:
            replacements.append((owner, name, wrap(name, getattr(owner, name))))
    with contextlib.ExitStack() as stack:
        for owner, name, value in replacements:
            stack.enter_context(_replaced(owner, name, value))
        yield


@contextlib.contextmanager
def method_replaced(owner: type, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> Iterator[None]:
    """``owner.name`` is ``make(original)`` for the block, and the original after, however the
    block ends (``TransformerEncoder.forward`` while tracing: trace/fast_paths.py)."""
    with _replaced(owner, name, make(getattr(owner, name))):
        yield


def hop_rule_tables() -> dict[str, dict[Any, Any]]:
    """Each torch HOP's name -> a copy of its table of rules per Python mode type
    (``python_key_table``), to show a trace leaves torch's own entries as they were."""
    return {hop.name(): dict(hop.python_key_table) for hop in all_higher_order_ops()}


@contextlib.contextmanager
def calls_kept_by_dead_code_elimination(keep: Callable[[torch.fx.Node], bool]) -> Iterator[None]:
    """fx's dead-code elimination keeps every call ``keep`` names, for the block. torch 2.11's
    ``Node.is_impure`` answers False for every higher-order op before reading
    ``has_side_effect``, so ``ep.module()`` dropped a region call whose results are unused, with
    the random draws and checks inside it (2.12 on keeps them: this changes nothing there)."""
    original = torch.fx.node.Node.is_impure

    def is_impure(self: torch.fx.Node, *args: Any, **kwargs: Any) -> bool:
        return original(self, *args, **kwargs) or (self.op == "call_function" and keep(self))
    with _replaced(torch.fx.node.Node, "is_impure", is_impure):
        yield


@contextlib.contextmanager
def functional_tensor_attributes(lookup: Callable[[Any, str], Any]) -> Iterator[None]:
    """An attribute a FunctionalTensor lacks is ``lookup(tensor, name)`` for the block (which raises
    AttributeError for what it does not know). FunctionalTensor defines no ``__getattr__``, so only
    names the wrapper has not are asked: a tensor subclass's own API (``t.a``, ``t.get_elem_a()``)
    on the traced value of a subclass (trace/extensions/tensor_subclasses.py)."""
    from torch._subclasses.functional_tensor import FunctionalTensor

    def getattr_(self: Any, name: str) -> Any:
        return lookup(self, name)
    with _replaced(FunctionalTensor, "__getattr__", getattr_):
        yield


@contextlib.contextmanager
def functional_mode_off() -> Iterator[None]:
    """The active FunctionalTensorMode off for the block and back after: code of ours that runs
    between the model's ops (outside the mode's dispatch) and calls ops on values below
    functionalization, as the mode's own dispatch does (a subclass value's ``detach`` reaches the
    subclass, which the mode would answer NotImplemented)."""
    from torch.utils._python_dispatch import _disable_infra_mode

    with contextlib.contextmanager(_disable_infra_mode)(torch._C._TorchDispatchModeKey.FUNCTIONAL):
        yield


@contextlib.contextmanager
def subclass_constructors_unrecorded() -> Iterator[None]:
    """torch's export wrapper of a subclass ``__init__`` (``mark_subclass_constructor_exportable_experimental``,
    TwoTensor's and DTensor's) finds no torch.export tracer for the block, so it records nothing:
    it would track the subclass built over our functional tensors, which fails ("Unable to cast
    NotImplemented to Tensor"). Our trace records the subclass where an op first reads it
    (trace/extensions/tensor_subclasses.py)."""
    import torch._export.wrappers as wrappers

    with _replaced(wrappers, "_maybe_find_pre_dispatch_tf_mode_for_export", lambda: None):  # type: ignore[arg-type]
        yield


@contextlib.contextmanager
def _replaced(owner: type, name: str, value: Any) -> Iterator[None]:
    """``owner.name`` is ``value`` for the block, and what it was after, however the block ends
    (an attribute ``owner`` inherited is inherited again)."""
    owned, original = name in owner.__dict__, owner.__dict__.get(name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        if owned:
            setattr(owner, name, original)
        else:
            delattr(owner, name)


__all__ = [
    "calls_kept_by_dead_code_elimination",
    "hop_rule_tables",
    "method_replaced",
    "module_methods_wrapped",
    "functional_tensor_detach_without_mode",
    "cuda_autocast_kept_without_gpu",
    "cuda_sdpa_choice_without_gpu",
    "fused_attention_switched_off",
    "cuda_batch_norm_reserve_without_gpu",
    "rnn_decompositions_as_eager",
    "cudnn_draws_rnn_dropout",
    "rnn_weights_left_unflattened",
    "cuda_grid_sampler_faked_without_gpu",
    "CUDA_AUTOCAST_KEPT_WARNING",
    "callers_fake_mode_unset",
    "node_values_unsnapshotted",
    "NOT_RECORDED",
    "op_calls_recorded_through",
    "tensor_metadata_recorded_through",
    "module_getattr_wrapped",
    "non_strict_call_rewrites",
    "trace_moved_below_autograd",
    "func_transform_levels_wrapped",
    "below_pre_dispatch",
    "exporting_state",
    "ops_with_cached_pre_dispatch_handler",
    "push_mode_is_torchs",
    "lazy_graph_modules",
    "exported_program_code_on_first_use",
    "pre_dispatch_pushes_without_uncache",
    "autocast_cache_as",
    "grad_mode_untraced",
    "stack_capture_only_under_a_recordable_frame",
    "module_methods_left_unpatched",
    "outside_all_modes",
    "patched_function_apply",
    "non_strict_export_handler", "only_function_modes", "outside_trace",
    "autocast_state_as",
    "autocast_nesting_restored",
    "patched_tensor_methods",
    "rng_reseeds_routed",
    "autograd_engine_runs_routed",
    "inference_mode_as_grad_mode",
    "compiled_modules_run_eagerly",
    "hop_capture_static",
    "dynamo_function_capture_refused",
    "below_autograd",
    "pipeline_traced_by",
    "functional_tensor_attributes",
    "functional_mode_off",
    "subclass_constructors_unrecorded",
    "fsdp_forward_hooks_suspended",
]


@contextlib.contextmanager
def pipeline_traced_by(export: Callable[..., Any]) -> Iterator[None]:
    """``torch.distributed.pipelining.pipeline`` traces the whole model with ``export``
    instead of ``torch.export.export``, then splits that program at its ``pipe_split``
    markers as usual (``Pipe._trace_with_export`` is the one place it calls the exporter)."""
    from torch.distributed.pipelining._IR import Pipe

    original = Pipe.__dict__["_trace_with_export"]

    def traced(mod: torch.nn.Module, example_args: tuple, example_kwargs: dict | None = None) -> Any:
        return export(mod, example_args, example_kwargs)

    Pipe._trace_with_export = staticmethod(traced)  # type: ignore[method-assign, assignment]
    try:
        yield
    finally:
        Pipe._trace_with_export = original  # type: ignore[method-assign]


@contextlib.contextmanager
def fsdp_forward_hooks_suspended(model: torch.nn.Module) -> Iterator[None]:
    """Calls of ``model``'s ``fully_shard``'ed modules skip FSDP2's forward pre- and post-hooks
    (the all-gather into resized storages, the parameter swaps, the reshard): each hook leaves
    its module's hook dicts and comes back in its place on every path."""
    removed = []  # (hook dict, its keys in order, the entries taken out)
    for unit in fsdp_units(model):
        for handle in fsdp_forward_hook_handles(unit.module):
            refs = (handle.hooks_dict_ref, *(getattr(handle, "extra_dict_ref", ()) or ()))
            for ref in refs:
                hooks = ref()
                if hooks is not None and handle.id in hooks:
                    removed.append((hooks, list(hooks), {handle.id: hooks.pop(handle.id)}))
    try:
        yield
    finally:
        for hooks, order, taken in reversed(removed):
            hooks.update(taken)
            if not hasattr(hooks, "move_to_end"):
                continue  # a plain dict: only membership is read
            for key in [k for k in order if k in hooks] + [k for k in list(hooks) if k not in order]:
                hooks.move_to_end(key)
