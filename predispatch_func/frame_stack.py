"""Entry points run on one large chunk of CPython's frame stack, not on many small ones.

CPython 3.11 on keeps Python frames in per-thread chunks it maps with ``mmap`` (16 KiB,
more for a frame that needs it) and unmaps as soon as the last frame in a chunk returns.
A trace runs its hot loop (fake dispatch, the proxy recorder, our modes) a hundred or two
frames below the user's call, so the depth crosses chunk boundaries back and forth on every
op: each crossing maps a chunk, faults its pages in and unmaps it. Measured on a
transformers Mamba export: 8,000 page faults and 50-70 ms of system time an export, a third
of its time; which models pay, and how much, depends on where the boundaries fall, so
moving a frame anywhere changed the times of unrelated models.

:func:`on_a_reserved_frame_stack` calls the entry point through a frame whose code claims
a large operand stack. CPython gives that frame a chunk of its own, sized to the next power
of two, and every deeper frame fits in what the claim leaves free: one mapping for the
whole export. The claimed slots are never written (CPython clears only a frame's locals),
so the pages behind them are never touched. ``tests/test_frame_stack.py`` pins the
behaviour: without the frame a recursion that crosses chunk boundaries faults pages in on
every pass, with it almost none.
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Callable
from typing import Any, TypeVar

# 66,000 slots (516 KiB) take a 1 MiB chunk and leave about 500 KiB, thousands of frames,
# to the frames below: deeper than any trace goes
_CLAIMED_SLOTS = 66_000

_RESERVED: contextvars.ContextVar[bool] = contextvars.ContextVar("frame_stack_reserved", default=False)

F = TypeVar("F", bound=Callable[..., Any])


def _through_a_large_frame(fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    token = _RESERVED.set(True)
    try:
        return fn(*args, **kwargs)
    finally:
        _RESERVED.reset(token)


_through_a_large_frame.__code__ = _through_a_large_frame.__code__.replace(
    co_stacksize=max(_through_a_large_frame.__code__.co_stacksize, _CLAIMED_SLOTS))


def on_a_reserved_frame_stack(fn: F) -> F:
    """``fn`` called through the large frame (module docstring), unless a caller already is."""

    @functools.wraps(fn)
    def entry(*args: Any, **kwargs: Any) -> Any:
        if _RESERVED.get():
            return fn(*args, **kwargs)
        return _through_a_large_frame(fn, args, kwargs)

    return entry  # type: ignore[return-value]


__all__ = ["on_a_reserved_frame_stack"]
