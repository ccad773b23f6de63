"""``pf.eager.on(target)``: the session a user enters, on the fast path when it can be.

By default a session runs keyed (``session_key``): the ops outside the target
have kernels on a dispatch key the session adds to its thread, and ops in
the target never enter Python. ``observe=True`` runs it as a Python dispatch
mode instead (``mode.EagerMode``), which sees every op and so counts every
call that reached the backend (``stats.reached``): what the CLI's survey and
the tests of "nothing else reached the backend" need. Both run the same plans
and the same cached kernels, so values are the same either way.
"""

from __future__ import annotations

import contextlib

from .. import _torch_compat as tc
from ..opsets import OpSet
from . import above_autograd, attention_path
from .floor import RUNTIME_FLOOR
from .mode import EagerMode
from .session_key import KeyedSession
from .stats import EagerStats


class on(contextlib.ContextDecorator):  # noqa: N801  (reads as pf.eager.on(target))
    """Context manager and decorator: run eagerly on ``target`` (see ``mode``'s docstring).

    ``session.stats`` (:class:`EagerStats`) accumulates over every entry. On the
    fast path its ``reached`` holds only the calls the lowering itself made (in-target
    ops the model calls pass by in C++); pass ``observe=True`` to count them all.
    ``session.keyed`` says how the last entry ran.
    """

    def __init__(self, target: OpSet, *, use_cache: bool = True, on_unreachable: str = "raise",
                 floor: OpSet = RUNTIME_FLOOR, observe: bool = False):
        self.target = target
        self.stats = EagerStats()
        options = dict(use_cache=use_cache, on_unreachable=on_unreachable, stats=self.stats, floor=floor)
        self._mode = EagerMode(target, **options)  # type: ignore[arg-type]
        self._keyed_mode = None if observe else EagerMode(target, keyed=True, **options)  # type: ignore[arg-type]
        self.keyed = False
        self._math_attention = attention_path.math_path_kernels(
            attention_path.devices_taking_math(frozenset(op.name() for op in self._mode.kernels.direct)),
            on_call=self.stats.above_autograd.add)
        self._stack: list[contextlib.ExitStack] = []

    def __enter__(self) -> on:
        stack = contextlib.ExitStack()
        kernels = self._mode.kernels
        stack.enter_context(above_autograd.AutogradKernels(
            kernels.lifted, on_call=self._count_lifted, traces_of=kernels.lifted_kernels_of,
            kernels=self._math_attention))
        self.keyed = self._keyed_mode is not None and KeyedSession.available(self._keyed_mode)
        stack.enter_context(KeyedSession(self._keyed_mode) if self.keyed else self._mode)  # type: ignore[arg-type]
        self._stack.append(stack)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.pop().close()

    def _count_lifted(self, op: tc.OpOverload) -> None:
        self.stats.above_autograd.add(op)
        self.stats.decomposed.add(op)
