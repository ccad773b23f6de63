"""Traced tensors the model keeps past export, reported as torch.export reports them.

A model that stores a tensor of the trace outside its outputs (a global list,
a closure, an object export does not see) keeps a tracing tensor alive after
export; whoever uses it later fails far from the cause. torch.export reports
such tensors when ``torch._export.config.detect_non_strict_fake_tensor_leaks``
is set; ours honours the same switch with the same warning, naming the user's
line that made each tensor.

Our trace keeps no tracing tensor once :func:`predispatch_func.export` returns
(the program's metadata holds plain fake tensors), so every functional tensor
of this export's fake mode still alive then is held by the model's code. The
search walks the garbage collector's objects once, and only when asked.
"""

from __future__ import annotations

import contextlib
import contextvars
import gc
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from .. import _torch_compat as tc

_WATCH: contextvars.ContextVar[LeakWatch | None] = contextvars.ContextVar("pf_leak_watch", default=None)


class LeakWatch:
    """Holds the trace's tracer (which maps tensors to the nodes that made them) until the report."""

    __slots__ = ("tracer",)

    def __init__(self) -> None:
        self.tracer: Any = None

    def report(self, fake_mode: Any) -> None:
        """Warn about every tracing tensor of ``fake_mode`` still alive, as torch.export does."""
        if fake_mode is None:  # a program without tensor inputs: its trace made no fake mode of its own
            return
        gc.collect()
        # type(), not isinstance: some module-level objects warn when asked for their __class__
        leaked = [t for t in gc.get_objects() if type(t) is tc.FunctionalTensor and _of_mode(t, fake_mode)]
        if not leaked:
            return
        details = "\n  ".join(self._describe(t) for t in leaked)
        warnings.warn(
            f"Detected {len(leaked)} fake tensors that are still alive after export.\n"
            "This is likely result of torch.export.export not being able to track side effects "
            "that is happening outside of model scope.\n\n"
            f"Leaked tensors:\n  {details}\n\n"
            "Keep tensors made in forward out of state that outlives the call (globals, closures, "
            "objects other than the model's buffers), or return them.", stacklevel=3)

    def _describe(self, t: torch.Tensor) -> str:
        what = f"FakeTensor(shape={t.shape}, dtype={t.dtype})"
        node = tc.proxy_node_in(self.tracer, t) if self.tracer is not None else None
        if node is None:
            return f"{what}: <no stack trace available>"
        stack = node.meta.get("stack_trace")
        if stack is None:
            stack = next((f"Used by '{u.name}':\n{u.meta['stack_trace']}" for u in node.users
                          if u.meta.get("stack_trace")), "<no stack trace available>")
        return f"{what} from node '{node.name}':\n{stack}"


def _of_mode(t: torch.Tensor, fake_mode: Any) -> bool:
    inner = tc.value_behind_functional(t)
    return getattr(inner, "fake_mode", None) is fake_mode


@contextlib.contextmanager
def watching() -> Iterator[LeakWatch | None]:
    """A :class:`LeakWatch` for the export inside, or None when torch's switch is off."""
    if not tc.fake_tensor_leak_check_requested():
        yield None
        return
    watch = LeakWatch()
    token = _WATCH.set(watch)
    try:
        yield watch
    finally:
        _WATCH.reset(token)


def note_tracer() -> None:
    """Called inside the trace: keep its tracer for the report (nothing when not watching)."""
    watch = _WATCH.get()
    if watch is not None:
        watch.tracer = tc.current_proxy_tracer()
