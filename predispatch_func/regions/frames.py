"""Assign each node of the flat graph the stack of mode frames it runs under.

Pre-dispatch tracing leaves grad toggles (``_set_grad_enabled(b)``, flat state
changes) and autocast enter/exit (properly nested) as markers. This pass
replays them as a stack of frames. A marker that does not change the
effective mode opens no frame. A grad toggle that crosses an autocast frame
(``torch.set_grad_enabled(False)`` called inside ``with autocast()`` and
restored outside) closes the frames above it and reopens copies, so every
frame covers one contiguous run of nodes.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import torch

from .. import _torch_compat as tc
from ..errors import Refusal, UnsupportedError
from ..trace.ambient import AMBIENT
from .ops import pf_autocast_region, pf_grad_region


@dataclasses.dataclass(eq=False)
class GradFrame:
    """A stretch run with grad mode set to ``enabled``: a ``pf_grad_region`` call."""

    enabled: bool
    stack_trace: str | None = None
    # the caller's mode around the whole forward (trace/ambient.py): "no_grad" holds
    # the model's own toggles nested inside it; "inference" ignores them (as eager:
    # under inference_mode nothing requires grad, enable_grad or not)
    ambient: str | None = None
    hop: ClassVar[Any] = pf_grad_region
    name: ClassVar[str] = "grad_region"  # the body's attribute: grad_region_<i>
    sets_grad: ClassVar[bool] = True

    def mode_args(self) -> tuple:
        return (self.enabled,)

    def grad_inside(self, outer: bool) -> bool:
        return self.enabled

    def reopened(self) -> GradFrame:
        return dataclasses.replace(self)


@dataclasses.dataclass(eq=False)
class AutocastFrame:
    """A stretch run under one autocast state: a ``pf_autocast_region`` call."""

    device_type: str
    dtype: Any
    enabled: bool
    cache_enabled: Any
    stack_trace: str | None = None
    hop: ClassVar[Any] = pf_autocast_region
    name: ClassVar[str] = "autocast_region"
    sets_grad: ClassVar[bool] = False

    def mode_args(self) -> tuple:
        return (self.device_type, self.dtype, self.enabled, self.cache_enabled)

    def grad_inside(self, outer: bool) -> bool:
        return outer

    def reopened(self) -> AutocastFrame:
        return dataclasses.replace(self)


Frame = GradFrame | AutocastFrame


# node.meta key of the grad markers that open and close the caller's mode (trace/ambient.py)


def is_marker(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and node.target in (
        tc.SET_GRAD_ENABLED, tc.ENTER_AUTOCAST, tc.EXIT_AUTOCAST)


def drop_entry_and_exit_markers(graph: torch.fx.Graph) -> None:
    """Erase the grad-mode markers a trace itself records around a body (it enters
    ``enable_grad``): a body runs under the mode its caller gives it instead."""
    ops = [n for n in graph.nodes if n.op not in ("placeholder", "output") and not is_marker(n)]
    first, last = (ops[0], ops[-1]) if ops else (None, None)
    order = {n: i for i, n in enumerate(graph.nodes)}
    for node in list(graph.nodes):
        if node.target is tc.SET_GRAD_ENABLED and (
                first is None or order[node] < order[first] or order[node] > order[last]):
            graph.erase_node(node)


def assign_frames(graph: torch.fx.Graph, grad_enabled: bool = True
                  ) -> dict[torch.fx.Node, tuple[Frame, ...]]:
    """Frames (outermost first) for every non-marker node; raises if a mode leaks out.
    ``grad_enabled``: the grad mode the graph runs under (off in a Function's forward)."""
    stack: list[Frame] = []
    grad = grad_enabled
    autocast_by_enter: dict[torch.fx.Node, AutocastFrame | None] = {}
    reopened: dict[Frame, Frame] = {}  # a frame closed and reopened -> its copy
    autocast_state: list[tuple[str, bool, Any]] = []
    frames_of: dict[torch.fx.Node, tuple[Frame, ...]] = {}
    last_marker = None
    for node in graph.nodes:
        where = node.meta.get("stack_trace")
        if node.target is tc.SET_GRAD_ENABLED and node.meta.get(AMBIENT):
            grad = _ambient_marker(stack, node, where, reopened)
        elif node.target is tc.SET_GRAD_ENABLED and any(
                isinstance(f, GradFrame) and f.ambient == "inference" for f in stack):
            grad = bool(node.args[0])
        elif node.target is tc.SET_GRAD_ENABLED:
            wanted = bool(node.args[0])
            if wanted != grad:
                _toggle_grad(stack, wanted, where, reopened)
                grad = wanted
                last_marker = node
        elif node.target is tc.ENTER_AUTOCAST:
            device, dtype, enabled, cache = (list(node.args) + [None] * 4)[:4]
            current = next((s for s in reversed(autocast_state) if s[0] == device), (device, False, None))
            changes = bool(enabled) != current[1] or (enabled and dtype != current[2])
            frame = AutocastFrame(device, dtype, bool(enabled), cache, where) if changes else None
            autocast_by_enter[node] = frame
            autocast_state.append((device, bool(enabled), dtype))
            if frame is not None:
                stack.append(frame)
        elif node.target is tc.EXIT_AUTOCAST:
            closed = _current(autocast_by_enter.get(node.args[0]), reopened)
            autocast_state.pop()
            if closed is not None:
                _close(stack, closed, reopened)
        elif node.op not in ("placeholder", "output"):
            frames_of[node] = tuple(stack)
    if stack:
        raise UnsupportedError(
            "the model leaves grad mode or autocast changed when forward returns; a functional "
            "program cannot change the caller's global state", kind=Refusal.MODE_LEFT_CHANGED,
            op=getattr(getattr(last_marker, "target", None), "__name__", None),
            source=(stack[-1].stack_trace or "").strip() or None)
    return frames_of


def _current(frame: Frame | None, reopened: dict[Frame, Frame]) -> Frame | None:
    """The frame now standing for ``frame`` (it may have been reopened, maybe twice)."""
    while frame is not None and frame in reopened:
        frame = reopened[frame]
    return frame


def _ambient_marker(stack: list[Frame], node: torch.fx.Node, where: str | None,
                    reopened: dict[Frame, Frame]) -> bool:
    """Open or close the caller's grad frame; the grad mode after the marker."""
    if not node.args[0]:
        stack.append(GradFrame(False, where, ambient=node.meta[AMBIENT]))
        return False
    ambient = next(f for f in stack if isinstance(f, GradFrame) and f.ambient)
    _close(stack, ambient, reopened)
    return True


def _toggle_grad(stack: list[Frame], wanted: bool, where: str | None,
                 reopened: dict[Frame, Frame]) -> None:
    open_grad = next((f for f in reversed(stack) if f.sets_grad), None)
    if open_grad is None or getattr(open_grad, "ambient", None):
        stack.append(GradFrame(wanted, where))
    else:
        _close(stack, open_grad, reopened)


def _close(stack: list[Frame], frame: Frame, reopened: dict[Frame, Frame]) -> None:
    """Pop ``frame``; frames opened above it are closed and reopened after it."""
    index = next(i for i, f in enumerate(stack) if f is frame)
    above = stack[index + 1:]
    del stack[index:]
    for old in above:
        reopened[old] = old.reopened()
        stack.append(reopened[old])
