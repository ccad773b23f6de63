"""Node metadata as torch.export writes it: ``nn_module_stack`` and ``torch_fn``.

Backends, quantizers (``set_module_name``), partitioners and
``torch.export.unflatten`` key on the module a node came from. While the
model runs under the tracer, two observers keep fx's *current meta* (copied
into every node fx creates, ``torch.fx.traceback.preserve_node_meta``):

* :class:`_ModuleCalls`: global forward pre/post hooks keep the stack of
  submodules being called, as ``{key: (fqn, "pkg.Class")}`` with torch's keys
  (``L__self__`` for the root, ``L__self__<fqn>``, ``@n`` for the n-th repeat call);
* :class:`_TorchFnMode`: a torch-function mode names the user-level torch call
  being traced (``("linear_1", "builtin_function_or_method.linear")``) and
  writes its ``stack_trace`` once (:class:`_UserStack`), where fx would capture
  and symbolize the whole Python stack again for every node the call makes (a
  tenth of the export time of a transformer).

Nodes made after the model returns (region HOP calls, their results, clones
made by later passes) get their stack from :func:`fill_missing`. Inside a
torch HOP's branch (``torch.cond``), which dynamo traces, the observers stand
aside (dynamo refuses side effects there); its nodes take the stack of the
module that called the HOP.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import linecache
import operator
import os
import re
import sys
import traceback
import types
from collections.abc import Iterator
from typing import Any

import torch
import torch.fx.traceback as fx_traceback
from torch.overrides import TorchFunctionMode

from .. import _torch_compat as tc
from ..errors import PACKAGE_DIR
from ..graphs import all_graph_modules
from ..state import module_access
from .stack_trace_files import dropped_files

NN_MODULE_STACK = "nn_module_stack"
TORCH_FN = "torch_fn"
STACK_TRACE = "stack_trace"
ROOT_KEY = "L__self__"
# a node made by no line of the user's (an optimizer's update in a joint program): fill_missing
# gives it no stack trace from its neighbours (and drops this mark)
NO_USER_LINE = "pf_no_user_line"

Stack = dict[str, tuple[str, str]]


def _type_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def root_stack(root_cls: type) -> Stack:
    return {ROOT_KEY: ("", _type_name(root_cls))}


class _ModuleCalls:
    """Pushes ``(fqn, type)`` when a submodule of ``root`` starts ``forward``, pops when it ends.
    The fqn is the module's path; where the model holds a module twice, the path ``forward``
    walked to it (``access``, module_access.py)."""

    def __init__(self, root: torch.nn.Module, access: module_access.Paths | None = None):
        self.paths = {id(m): name for name, m in root.named_modules() if name}
        self.access = access
        self.stack: Stack = root_stack(type(root))
        self.calls: dict[str, int] = {}
        self.keys: list[str | None] = []

    def pre(self, module: torch.nn.Module, args: Any) -> None:
        if torch.compiler.is_dynamo_compiling():  # a torch HOP's body under dynamo: no side effects
            return
        fqn = self.access.path_of(module) if self.access is not None else None
        if not fqn:
            fqn = self.paths.get(id(module))
        # not a submodule of the model (made in forward), or a graph body a HOP calls
        # (re-exporting ep.module()): torch records none
        if fqn is None or isinstance(module, torch.fx.GraphModule):
            self.keys.append(None)
            return
        n = self.calls.get(fqn, 0)
        self.calls[fqn] = n + 1
        key = f"{ROOT_KEY}{fqn}" + (f"@{n}" if n else "")
        self.stack[key] = (fqn, _type_name(type(module)))
        self.keys.append(key)
        _current()[NN_MODULE_STACK] = dict(self.stack)

    def post(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if torch.compiler.is_dynamo_compiling():
            return
        key = self.keys.pop() if self.keys else None
        if key is not None:
            self.stack.pop(key, None)
            _current()[NN_MODULE_STACK] = dict(self.stack)


class _UserStack:
    """The ``stack_trace`` fx's tracer would write for a node made now, read from
    the live frames: the ``forward`` frames (and torch's anchors), outermost
    first, without torch's uninteresting files, formatted as fx formats them.
    Formatting is cached per chain of frames: a model repeats its few lines. The callers
    of the frame that runs the trace (``bottom``) wait at the same lines for the whole
    trace, so they are walked once and each walk stops at them. A transformer's stack is
    fifty frames deep and a layer makes dozens of torch calls from the same callers, so
    each caller's part of the walk is kept too (:meth:`_walk`)."""

    def __init__(self, bottom: types.FrameType | None = None) -> None:
        self.anchors, self.dropped = tc.stack_trace_anchors(), dropped_files()
        self.also = _ALSO_RECORDED.get()
        self.formatted: dict[tuple, str] = {}
        self.kept: dict[types.CodeType, bool] = {}  # per code object: is its frame recorded?
        # per caller frame: (its line, the recorded frames from it down, whether that walk met the stop)
        self.from_caller: dict[types.FrameType, tuple[int, tuple, bool]] = {}
        self.stop = bottom.f_back if bottom is not None else None
        self.below = list(self._walk(self.stop, None)[0]) if self.stop is not None else []

    def _walk(self, frame: types.FrameType | None, stop: types.FrameType | None) -> tuple[tuple, bool]:
        """The recorded frames from ``frame`` down to ``stop`` (excluded), innermost first;
        and whether the walk met ``stop``. A frame waiting in a call keeps its callers
        (and so what the walk finds below it) for as long as it waits at that line, so
        the walk from a caller met before at the same line is reused. A generator's
        frame is not: each resumption may come from other callers."""
        chain: list[tuple[str, int, str]] = []
        walked: list[tuple[types.FrameType, int, int]] = []  # (caller frame, its line, chain length there)
        kept, from_caller = self.kept, self.from_caller
        first = frame
        rest: tuple = ()
        while True:
            if frame is None or frame is stop:
                met = frame is not None
                break
            code = frame.f_code
            lineno = frame.f_lineno
            if frame is not first:
                cached = from_caller.get(frame)
                if cached is not None and cached[0] == lineno:
                    rest, met = cached[1], cached[2]
                    break
                if not code.co_flags & _RESUMABLE:
                    walked.append((frame, lineno, len(chain)))
            keep = kept.get(code)
            if keep is None:
                keep = kept[code] = (code.co_name == "forward" or code in self.also
                                     or (code.co_filename, code.co_name) in self.anchors) \
                    and code.co_filename not in self.dropped
            if keep:
                chain.append((code.co_filename, lineno, code.co_name))
            frame = frame.f_back
        full = (*chain, *rest)
        for caller, lineno, at in walked:
            from_caller[caller] = (lineno, full[at:], met)
        return full, met

    def __call__(self) -> str:
        chain, met_stop = self._walk(sys._getframe(2), self.stop)  # noqa: SLF001  (CPython's frame walk)
        key = (*chain, *self.below) if met_stop else tuple(chain)
        text = self.formatted.get(key)
        if text is None:
            frames = [traceback.FrameSummary(f, n, name, line=linecache.getline(f, n))
                      for f, n, name in reversed(key)]
            text = self.formatted[key] = "".join(traceback.StackSummary.from_list(frames).format()).strip()
        return text


# code objects whose frames a stack trace records besides ``forward`` frames (frames_recorded_of)
_ALSO_RECORDED: contextvars.ContextVar[frozenset[types.CodeType]] = contextvars.ContextVar(
    "pf_also_recorded", default=frozenset())


@contextlib.contextmanager
def frames_recorded_of(fn: Any) -> Iterator[None]:
    """Stack traces record the frames of ``fn`` too, as they record ``forward`` frames: a loss
    function of ``export_joint`` is the user's code, and without its frame the loss's nodes
    would name only the call that wraps it. A module (its ``forward`` is recorded anyway) or a
    callable without Python code adds nothing."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    fn = getattr(fn, "__func__", fn)  # a bound method
    code = getattr(fn, "__code__", None) if isinstance(fn, types.FunctionType) else None
    token = _ALSO_RECORDED.set(_ALSO_RECORDED.get() | {code}) if code is not None else None
    try:
        yield
    finally:
        if token is not None:
            _ALSO_RECORDED.reset(token)


class _TorchFnMode(TorchFunctionMode):
    """Names the outermost torch call (nested ones run with this mode popped, as in torch).
    A body traced inside the trace keeps it (``CarriedIntoBodies``, trace/environment.py):
    the body's nodes take their names and stack traces from it."""

    def carried_into_bodies(self) -> bool:
        return True

    def __init__(self, bottom: types.FrameType | None = None) -> None:
        super().__init__()
        self.counts: dict[Any, int] = {}
        self.user_stack = _UserStack(bottom)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", None)
        if name is None or torch.compiler.is_dynamo_compiling():
            return func(*args, **kwargs)
        self.counts[func] = self.counts.get(func, 0) + 1
        meta = _current()
        before = meta.get(TORCH_FN), meta.get(STACK_TRACE)
        meta[TORCH_FN] = (f"{name}_{self.counts[func]}", f"{type(func).__name__}.{name}")
        meta[STACK_TRACE] = _CARRIED_STACK.get() or self.user_stack() or None
        try:
            return func(*args, **kwargs)
        finally:
            for key, value in zip((TORCH_FN, STACK_TRACE), before):
                if value is None:
                    meta.pop(key, None)
                else:
                    meta[key] = value


_RESUMABLE = 0x20 | 0x80 | 0x200  # CO_GENERATOR, CO_COROUTINE, CO_ASYNC_GENERATOR: callers change per resumption


def _current() -> dict[str, Any]:
    return fx_traceback.get_current_meta()


@contextlib.contextmanager
def recording(root: torch.nn.Module) -> Iterator[None]:
    """Around the model's call inside the trace: stamp every node with module and torch call."""
    with module_access.access_paths(root) as access, fx_traceback.preserve_node_meta():  # restores the meta
        calls = _ModuleCalls(root, access)
        _current()[NN_MODULE_STACK] = dict(calls.stack)
        pre = torch.nn.modules.module.register_module_forward_pre_hook(calls.pre)
        post = torch.nn.modules.module.register_module_forward_hook(calls.post, always_call=True)
        # this generator's caller's caller runs the body of ``with recording(...)``
        torch_fn_mode = _TorchFnMode(bottom=sys._getframe(2))  # noqa: SLF001  (CPython's frame walk)
        try:
            with torch_fn_mode:
                yield
        finally:
            pre.remove()
            post.remove()
            torch_fn_mode.user_stack.from_caller.clear()  # the frames it holds hold the trace's tensors


def fill_missing(gm: torch.fx.GraphModule, root_cls: type) -> None:
    """Give every node torch.export would stamp an ``nn_module_stack`` (HOPs a ``torch_fn``).

    A region or torch HOP call takes the longest stack its body's nodes share;
    its results (getitem) and the ``get_attr`` of its body take the call's;
    anything else made after tracing takes the root's. A call made without a
    user frame on the stack (a clone functionalization adds) takes the
    ``stack_trace`` of the node it feeds or reads, unless marked ``NO_USER_LINE``.
    """
    for _, sub in reversed(list(all_graph_modules(gm))):  # bodies first: a HOP reads them
        hop_counts: dict[str, int] = {}
        for node in sub.graph.nodes:
            if node.op not in ("call_function", "get_attr") or NN_MODULE_STACK in node.meta:
                continue
            if isinstance(node.target, tc.HigherOrderOperator):
                node.meta[NN_MODULE_STACK] = _shared_stack(sub, node) or root_stack(root_cls)
                name = node.target.name()
                hop_counts[name] = hop_counts.get(name, 0) + 1
                node.meta.setdefault(TORCH_FN, (f"{name}_{hop_counts[name]}",
                                                f"{type(node.target).__name__}.{name}"))
        for node in sub.graph.nodes:
            if node.op not in ("call_function", "get_attr"):
                continue
            if node.meta.pop(NO_USER_LINE, False):
                node.meta.setdefault(NN_MODULE_STACK, root_stack(root_cls))
                continue
            if NN_MODULE_STACK not in node.meta:
                source = _neighbour_with(node, NN_MODULE_STACK)
                node.meta[NN_MODULE_STACK] = (dict(source.meta[NN_MODULE_STACK]) if source is not None
                                              else root_stack(root_cls))
                if source is not None and TORCH_FN in source.meta and node.op == "call_function":
                    node.meta.setdefault(TORCH_FN, source.meta[TORCH_FN])
            if node.op == "call_function" and not node.meta.get(STACK_TRACE):
                source = _neighbour_with(node, STACK_TRACE)
                if source is not None:
                    node.meta[STACK_TRACE] = source.meta[STACK_TRACE]
    _bodies_inherit_from_their_call(gm)
    for _, sub in all_graph_modules(gm):
        for node in sub.graph.nodes:
            if node.meta.get(STACK_TRACE):
                node.meta[STACK_TRACE] = without_generated_frames(node.meta[STACK_TRACE])


def placeholders_require_grad_as_inputs(pairs: Any) -> None:
    """Each placeholder's ``val`` requires grad as the parameter, buffer or input it stands for does
    (fakes are made without it), as in torch.export's programs: a consumer that trains the program
    or re-traces it reads which inputs need gradients there. ``pairs``: (placeholder, input slot)."""
    for node, slot in pairs:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and isinstance(slot.value, torch.Tensor) and val.is_leaf:
            val.requires_grad = slot.value.requires_grad


def resolve_captured_module_stacks(gm: torch.fx.GraphModule, root: torch.nn.Module) -> None:
    """Give the nodes of torch HOP bodies (``cond``/``map``/``scan`` branches, which dynamo
    captures) ``nn_module_stack`` entries in torch.export's form.

    dynamo keys each entry by the module's ``id`` and names it by the capture's access path
    (``L['args'][1].__closure__[0].cell_contents.lin1``) with the class itself as the type:
    torch.export's serializer refuses such entries, and ``unflatten`` cannot place them.
    Each module the body called is found in ``root`` by identity and entered with its
    parents (``L__self__<fqn>``, ``(fqn, "pkg.Class")``); one that is not a submodule of
    ``root`` (made in forward) is dropped, as the observers record none for it.
    """
    paths = {id(m): name for name, m in root.named_modules() if name}
    for where, sub in all_graph_modules(gm):
        if where == "<top>":
            continue
        for node in sub.graph.nodes:
            stack = node.meta.get(NN_MODULE_STACK)
            if stack and not all(key.startswith(ROOT_KEY) for key in stack):
                node.meta[NN_MODULE_STACK] = _stack_in_torch_form(stack, paths, root)


def _stack_in_torch_form(stack: Stack, paths: dict[int, str], root: torch.nn.Module) -> Stack:
    out = root_stack(type(root))
    for key, value in stack.items():
        if key.startswith(ROOT_KEY):
            out[key] = value
            continue
        fqn = paths.get(int(key)) if key.isdigit() else None
        if fqn is None:
            continue
        parts = fqn.split(".")
        for depth in range(1, len(parts) + 1):
            prefix = ".".join(parts[:depth])
            out.setdefault(f"{ROOT_KEY}{prefix}", (prefix, _type_name(type(root.get_submodule(prefix)))))
    return out


CUSTOM = "custom"


def without_torch_annotations(gm: torch.fx.GraphModule) -> None:
    """Keep in ``node.meta["custom"]`` only what the user annotated (``fx.traceback.annotate``).

    torch's ``@disable`` wrappers annotate every node traced under them while exporting
    (``_torchdynamo_disable*``, make_fx's ``dispatch_trace``); torch.export's nodes carry no
    such entry, and compilers read ``custom`` as the user's marks (partitioning, regional
    compilation).
    """
    for _, sub in all_graph_modules(gm):
        for node in sub.graph.nodes:
            custom = node.meta.get(CUSTOM)
            if not custom or not any(key in tc.TORCH_INTERNAL_ANNOTATIONS for key in custom):
                continue
            users = {k: v for k, v in custom.items() if k not in tc.TORCH_INTERNAL_ANNOTATIONS}
            if users:
                node.meta[CUSTOM] = users
            else:
                del node.meta[CUSTOM]


_FRAME = re.compile(r'^ *File "(?P<file>[^"]*)", line \d+, in ', re.MULTILINE)


def without_generated_frames(stack_trace: str) -> str:
    """``stack_trace`` with only the model's frames: a torch HOP (``torch.cond``) is called by
    the graph dynamo generated for it (``<eval_with_key>.N``), whose frame fx records as the
    innermost one; and a HOP body's trace (fx's) or a wrapper of ours around the model (the joint
    program's loss, the fast paths) records frames of this package, which a user reading the
    program's lines never wrote (the demo's model aside). Drop such frames, keep the rest as
    written; a trace of nothing else is kept whole."""
    starts = [(m.start(), m.group("file")) for m in _FRAME.finditer(stack_trace)]
    if not any(_not_the_models(f) for _, f in starts):
        return stack_trace
    ends = [s for s, _ in starts[1:]] + [len(stack_trace)]
    kept = [stack_trace[s:e] for (s, f), e in zip(starts, ends) if not _not_the_models(f)]
    return "".join(kept) if kept else stack_trace


_DEMO_MODEL = os.path.join(PACKAGE_DIR, "commands", "demo_model.py")


def _not_the_models(filename: str) -> bool:
    return filename.startswith("<eval_with_key>") or (filename.startswith(PACKAGE_DIR) and filename != _DEMO_MODEL)


def _bodies_inherit_from_their_call(gm: torch.fx.GraphModule) -> None:
    """The calls of a HOP body (a ``torch.cond`` branch dynamo captured, traced with our
    observers popped) take the torch call dynamo recorded for them (``source_fn_stack``),
    counted afresh in each body, as torch.export's tracer of that body names them; a call
    dynamo recorded none for is part of the HOP call's torch_fn. A call with no stack trace
    (a body torch's own autograd of the HOP traced: a joint program's cond branches, forward
    and backward) takes the HOP call's, the nearest line of the user's."""
    for _, sub in all_graph_modules(gm):  # parents first
        for node in sub.graph.nodes:
            if not isinstance(node.target, tc.HigherOrderOperator):
                continue
            for arg in node.args:
                body = getattr(sub, str(arg.target), None) if isinstance(arg, torch.fx.Node) \
                    and arg.op == "get_attr" else None
                if isinstance(body, torch.fx.GraphModule):
                    named = _CapturedTorchCalls()
                    for inner in body.graph.nodes:
                        if inner.op != "call_function":
                            continue
                        if TORCH_FN not in inner.meta and TORCH_FN in node.meta:
                            inner.meta[TORCH_FN] = named.of(inner) or node.meta[TORCH_FN]
                        if not inner.meta.get(STACK_TRACE) and node.meta.get(STACK_TRACE):
                            inner.meta[STACK_TRACE] = node.meta[STACK_TRACE]


_OPERATORS = frozenset(getattr(operator, name) for name in dir(operator) if not name.startswith("_"))


class _CapturedTorchCalls:
    """``torch_fn`` of a body's nodes from the call dynamo captured each from: the last entry of
    ``source_fn_stack``, ``(dynamo's node name, the function or the Tensor method's name)``.
    The nodes one call made share its count."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.seen: dict[str, tuple[str, str]] = {}

    def of(self, node: torch.fx.Node) -> tuple[str, str] | None:
        stack = node.meta.get("source_fn_stack")
        if not stack:
            return None
        call, fn = stack[-1]
        if isinstance(fn, str):  # a Tensor method, as dynamo records call_method
            fn = getattr(torch.Tensor, fn, None)
        elif isinstance(fn, types.BuiltinFunctionType) and fn in _OPERATORS:  # `x + y`: the Tensor method eager's operator calls
            fn = getattr(torch.Tensor, fn.__name__, None) or getattr(torch.Tensor, f"__{fn.__name__}__", None)
        name = getattr(fn, "__name__", None)
        if name is None or isinstance(fn, (type, tc.HigherOrderOperator)):  # a module's call, a HOP
            return None
        if call not in self.seen:
            self.counts[name] = self.counts.get(name, 0) + 1
            self.seen[call] = (f"{name}_{self.counts[name]}", f"{type(fn).__name__}.{name}")
        return self.seen[call]


def _neighbour_with(node: torch.fx.Node, key: str) -> torch.fx.Node | None:
    """The producer a getitem/clone reads, else the first user (a get_attr's HOP call)."""
    for other in (*node.all_input_nodes, *node.users):
        if other.op not in ("placeholder", "output") and other.meta.get(key):
            return other
    return None


def _shared_stack(gm: torch.fx.GraphModule, hop: torch.fx.Node) -> Stack | None:
    stacks = []
    for arg in hop.args:
        if isinstance(arg, torch.fx.Node) and arg.op == "get_attr":
            body = getattr(gm, str(arg.target), None)
            if isinstance(body, torch.fx.GraphModule):
                stacks += [n.meta[NN_MODULE_STACK] for n in body.graph.nodes
                           if n.op == "call_function" and NN_MODULE_STACK in n.meta]
    if not stacks:
        return None
    shared = list(stacks[0].items())
    for stack in stacks[1:]:
        items = list(stack.items())
        n = 0
        while n < min(len(shared), len(items)) and shared[n] == items[n]:
            n += 1
        shared = shared[:n]
    return dict(shared)


def keep_graph_annotations(gm: torch.fx.GraphModule, root: torch.nn.Module) -> None:
    """A graph module exported again (``ep.module()`` of an edited program) keeps the user's
    graph-level ``meta["custom"]``, as torch.export keeps it."""
    if isinstance(root, torch.fx.GraphModule) and CUSTOM in root.meta:
        gm.meta[CUSTOM] = root.meta[CUSTOM]


def call_carrying_annotations(mod: torch.nn.Module, args: tuple, kwargs: dict) -> Any:
    """``mod(*args, **kwargs)``; a graph module whose nodes hold the user's ``meta["custom"]``
    (an annotated program exported again, as PT2E quantization does) or a ``stack_trace`` (a graph
    ``make_fx`` or an export made) runs node by node instead, so the nodes traced from each one
    keep its annotation and its stack, as torch.export keeps them (it runs every graph module so)."""
    if not (isinstance(mod, torch.fx.GraphModule)
            and any(n.meta.get(CUSTOM) or n.meta.get(STACK_TRACE) for n in mod.graph.nodes)):
        return mod(*args, **kwargs)
    return _AnnotationCarrier(mod).run(*args, *kwargs.values())


# the stack_trace of the graph node being run node by node, for the calls it makes
_CARRIED_STACK: contextvars.ContextVar[str | None] = contextvars.ContextVar("pf_carried_stack", default=None)


class _AnnotationCarrier(torch.fx.Interpreter):
    """Runs each node with its ``meta["custom"]`` as the current one (copied into every node
    traced meanwhile, ``fx.traceback.preserve_node_meta``), and without it otherwise; its
    ``stack_trace`` is the one :class:`_TorchFnMode` gives the calls it makes."""

    def run_node(self, n: torch.fx.Node) -> Any:
        current = _current()
        before = current.pop(CUSTOM, None)
        if n.meta.get(CUSTOM):
            current[CUSTOM] = dict(n.meta[CUSTOM])
        carried = _CARRIED_STACK.set(n.meta.get(STACK_TRACE))
        try:
            return super().run_node(n)
        finally:
            _CARRIED_STACK.reset(carried)
            current.pop(CUSTOM, None)
            if before is not None:
                current[CUSTOM] = before
