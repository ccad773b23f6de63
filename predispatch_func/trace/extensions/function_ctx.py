"""The ``ctx`` a custom Function sees while our trace runs, and what crosses from forward to backward.

Forward and backward are traced into two separate subgraphs, so nothing the
forward leaves on ``ctx`` can reach the backward as a Python object:
:class:`SavedContext` records it as data. Its tensors (``save_for_backward``
and tensors stashed as attributes) become extra results of the forward
subgraph and inputs of the backward subgraph; everything else is kept as a
value and handed back as is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import torch

from ... import _torch_compat as tc
from ...errors import Refusal, UnsupportedError


class TracingCtx:
    """Stands for ``ctx`` while forward and backward are traced.

    Holds what the user records (saved tensors, dirty and non-differentiable
    outputs, any attribute) so the backward trace can be handed the same.
    """

    _OWN = ("needs_input_grad", "to_save", "dirty_tensors", "non_differentiable",
            "materialize_grads", "_pf_saved")

    def __init__(self, needs_input_grad: tuple[bool, ...]):
        self.needs_input_grad = needs_input_grad
        self.to_save: tuple = ()
        self.dirty_tensors: tuple = ()
        self.non_differentiable: tuple = ()
        self.materialize_grads = True
        self._pf_saved: tuple = ()

    def save_for_backward(self, *tensors: Any) -> None:
        self.to_save = tensors

    def save_for_forward(self, *tensors: Any) -> None:
        pass  # forward-mode AD is not part of the program

    def mark_dirty(self, *tensors: Any) -> None:
        self.dirty_tensors = tensors

    def mark_non_differentiable(self, *tensors: Any) -> None:
        self.non_differentiable = tensors

    def set_materialize_grads(self, value: bool) -> None:
        self.materialize_grads = value

    @property
    def saved_tensors(self) -> tuple:
        return self._pf_saved

    saved_variables = saved_tensors

    def user_attributes(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if k not in self._OWN}


class _Tensor:
    """Stands, in a recorded structure, where a traced tensor was (it crosses as a graph value)."""

    def __repr__(self) -> str:
        return "<tensor>"


TENSOR = _Tensor()


def without_tensors(leaves: Any) -> tuple:
    """``leaves`` with each tensor replaced by :data:`TENSOR`."""
    return tuple(TENSOR if isinstance(v, torch.Tensor) else v for v in leaves)


def with_tensors(leaves: tuple, tensors: Iterator[Any]) -> list[Any]:
    """The inverse of :func:`without_tensors`: the next of ``tensors`` at each :data:`TENSOR`."""
    return [next(tensors) if v is TENSOR else v for v in leaves]


@dataclasses.dataclass(frozen=True)
class SavedContext:
    """What forward left on ``ctx`` for backward; recorded by the forward trace, replayed
    onto a fresh ``ctx`` by the backward trace."""

    to_save: tuple  # save_for_backward's arguments, tensors as TENSOR
    attributes: tuple  # the leaves of the user's ctx attributes, tensors as TENSOR
    attribute_spec: Any  # their pytree spec
    materialize_grads: bool

    @classmethod
    def of(cls, ctx: TracingCtx, name: str, source: str | None) -> tuple[SavedContext, list[Any]]:
        """The record of ``ctx`` and the tensors it holds (in the order the backward reads them)."""
        attr_flat, attr_spec = tc.pytree.tree_flatten(ctx.user_attributes())
        _refuse_symbolic_state(name, attr_flat, source)
        tensors = [s for s in ctx.to_save if isinstance(s, torch.Tensor)]
        tensors += [v for v in attr_flat if isinstance(v, torch.Tensor)]
        return cls(without_tensors(ctx.to_save), without_tensors(attr_flat), attr_spec, ctx.materialize_grads), tensors

    def replayed(self, needs_input_grad: tuple[bool, ...], saved: list[Any]) -> TracingCtx:
        """A ``ctx`` for backward holding what forward left, its tensors taken from ``saved``."""
        ctx = TracingCtx(needs_input_grad)
        tensors = iter(saved)
        ctx._pf_saved = tuple(with_tensors(self.to_save, tensors))  # noqa: SLF001 (our own tracing ctx)
        attributes = with_tensors(self.attributes, tensors)
        for key, value in tc.pytree.tree_unflatten(attributes, self.attribute_spec).items():
            setattr(ctx, key, value)
        ctx.set_materialize_grads(self.materialize_grads)
        return ctx


def _refuse_symbolic_state(name: str, leaves: list[Any], source: str | None) -> None:
    for v in leaves:
        if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            raise UnsupportedError(
                f"autograd.Function {name} stores a symbolic value ({v}) on ctx; its backward "
                "would read a value the program does not carry: save it as a tensor with "
                "ctx.save_for_backward", kind=Refusal.AUTOGRAD_FUNCTION_NOT_TRACEABLE,
                op=f"{name}.forward", source=source)


__all__ = ["SavedContext", "TENSOR", "TracingCtx", "with_tensors", "without_tensors"]
