"""Which values eager's autograd saved for backward, by storage: an observer of every op.

A program's backward reads the value an op was given; eager's reads the
storage autograd saved, at its state when backward runs. The two differ only
after a write autograd does not see (through ``.data``, or into an operand of
a HOP whose backward skips the version check). :class:`SavedReads` records
what was saved; the refusals that read it live in ``tensor_data.HiddenWrites``.
What an op saves is predicted from ``autograd_facts``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .. import _torch_compat as tc
from ..autograd_facts import Fact, has, may_carry_grad, saved_operands
from ..op_schema import out_argument_names
from .observers import OpCall


class SavedReads:
    """Storages an op recorded with grad saved for backward, and which op.

    A graph input read by an op before anything wrote it is saved as the input
    itself (its write-back keeps autograd's version), so it is kept apart
    (:meth:`saved_as_input_by`, for kept composites only: their autograd may
    save views of it). An op none of whose results can carry a gradient (a
    comparison, ``argmax``) has no backward: its reads save nothing.
    """

    __slots__ = ("_may_need_grad", "_inputs", "_saved", "_pending", "_pending_inputs", "_as_input", "_unchecked",
                 "_saves_result")

    def __init__(self, may_need_grad: Callable[[Any], bool]):
        self._may_need_grad = may_need_grad
        self._inputs: dict[Any, int] = {}  # storage of each graph input -> its position
        self._saved: dict[Any, Any] = {}  # storage -> the op that saved it (a value not a graph input's own)
        self._pending: dict[int, list[Any]] = {}  # by id(call): storages read, kept if the op saved them
        self._pending_inputs: dict[int, list[Any]] = {}  # by id(call): graph inputs read as they are
        self._as_input: dict[Any, Any] = {}  # storage of such an input -> the op whose backward reads it
        self._unchecked: dict[Any, str] = {}  # storage -> the HOP whose backward reads it without a version check
        self._saves_result: dict[Any, bool] = {}  # op -> self._may_save_result(op)

    def add_inputs(self, inputs: list[Any]) -> None:
        for i, t in enumerate(inputs):
            if isinstance(t, tc.FunctionalTensor):
                self._inputs.setdefault(tc.storage_key(t), i)

    @property
    def input_positions(self) -> dict[Any, int]:
        """Storage of each graph input -> its position."""
        return self._inputs

    def saved_by(self, key: Any) -> Any:
        """The op that saved storage ``key`` for backward (not as a graph input's own value), if any."""
        return self._saved.get(key)

    def saved_as_input_by(self, key: Any) -> Any:
        """The kept composite that read graph input ``key`` with grad on, if any."""
        return self._as_input.get(key)

    def read_unchecked_by(self, key: Any) -> str | None:
        """The HOP whose backward reads storage ``key`` without a version check, if any."""
        return self._unchecked.get(key)

    def before(self, call: OpCall) -> None:
        self._pending.pop(id(call), None)  # left by an op whose dispatch raised (and the model caught)
        self._pending_inputs.pop(id(call), None)
        if not call.grad or has(call.func, Fact.SAVES_NO_INPUT) or getattr(call.func, "is_view", False):
            return  # a view's backward reads sizes only
        tensors = [t for t in call.tensors_read() if isinstance(t, tc.FunctionalTensor)]
        if not any(self._may_need_grad(t) for t in tensors):
            return  # no autograd history: nothing saved
        read = [t for t in tensors if all(t is not w for w in call.written)]
        saves_only = saved_operands(call.func)
        if saves_only is not None:
            kept = saves_only(call.args, self._may_need_grad)
            read = [t for t in read if any(t is k for k in kept)]
        # what the op saves if a result can carry a gradient (known in `after`), at the values
        # it reads now: a graph input unwritten so far is saved as the input itself
        keys = [(tc.storage_key(t), t) for t in read]
        self._pending[id(call)] = [key for key, t in keys if key not in self._saved
                                   and (key not in self._inputs or tc.storage_mutation_count(t) != 0)]
        self._pending_inputs[id(call)] = [key for key, t in keys
                                          if key in self._inputs and tc.storage_mutation_count(t) == 0]

    def after(self, call: OpCall, out: Any) -> None:
        saved = self._pending.pop(id(call), None)
        saved_inputs = self._pending_inputs.pop(id(call), ())
        if saved is None or not self._has_backward(call, out):
            return
        for key in saved:
            self._saved.setdefault(key, call.func)  # no source line here: this runs for most ops
        if isinstance(call.func, tc.OpOverload) and tc.has_composite_implicit_kernel(call.func):
            for key in saved_inputs:  # a kept composite: its autograd may save views of the input
                self._as_input.setdefault(key, call.func)
        if self._may_save_result(call.func):  # its backward may read its result: saved too
            for t in call.results(out):
                if isinstance(t, tc.FunctionalTensor) and may_carry_grad(t):
                    self._saved.setdefault(tc.storage_key(t), f"{call.func} (as its result)")

    def note_opaque_read(self, what: str, operands: list[Any], *, keeps_inputs: bool) -> None:
        """A call the mode does not see as one op read ``operands`` with grad on: a torch HOP
        (``scan``, ``cond``, ...), whose rule may hand its body a copy even of a graph input
        (``scan`` clones its ``xs``), or a custom autograd.Function, whose backward reads the
        very input tensors it saved (``keeps_inputs``) but copies of anything else."""
        tensors = [t for t in operands if isinstance(t, tc.FunctionalTensor)]
        if not torch.is_grad_enabled() or not any(self._may_need_grad(t) for t in tensors):
            return
        for t in tensors:
            key = tc.storage_key(t)
            if keeps_inputs and key in self._inputs and tc.storage_mutation_count(t) == 0:
                continue
            self._saved.setdefault(key, what)

    def note_saved_results(self, what: str, results: list[Any]) -> None:
        """Results of such a call that its backward reads (a custom Function that saved its output)."""
        if not torch.is_grad_enabled():
            return
        for t in results:
            if isinstance(t, tc.FunctionalTensor) and may_carry_grad(t):
                self._saved.setdefault(tc.storage_key(t), f"{what} (as its result)")

    def note_unchecked_read(self, what: str, operands: list[Any]) -> None:
        """A HOP whose eager backward reads its operands without autograd's version check
        (``while_loop``, ``scan`` in torch 2.13): after an in-place write to one, eager's
        gradient silently uses the written value, which a program cannot."""
        if torch.is_grad_enabled() and any(self._may_need_grad(t) for t in operands):
            for t in operands:
                if isinstance(t, tc.FunctionalTensor):
                    self._unchecked.setdefault(tc.storage_key(t), what)

    def _may_save_result(self, op: Any) -> bool:
        """Whether ``op``'s backward may read its result: not for the ops known not to
        (``Fact.SAVES_NO_RESULT``), views (a view's backward reads sizes only) or ``out=``
        overloads (no autograd)."""
        known = self._saves_result.get(op)
        if known is None:
            known = self._saves_result[op] = not (
                has(op, Fact.SAVES_NO_RESULT) or getattr(op, "is_view", False) or not isinstance(op, tc.OpOverload)
                or out_argument_names(op))
        return known

    @staticmethod
    def _has_backward(call: OpCall, out: Any) -> bool:
        """Whether autograd recorded ``call`` as one op that may save what it read: not for
        a comparison's bool result, an index or ``.item()`` (no result carries a gradient),
        nor for an op that wrote nothing and returned an input as it is (``sum_to_size`` to
        its own size: no autograd node), nor for a decomposed op (its ops save what they
        read, and each came through here)."""
        results = [*call.results(out), *call.written]
        read = call.tensors_read()
        returned_an_input = not call.written and all(
            any(r is t for t in read) for r in results if isinstance(r, torch.Tensor))
        return not call.decomposed and not returned_an_input and any(may_carry_grad(t) for t in results)


__all__ = ["SavedReads"]
