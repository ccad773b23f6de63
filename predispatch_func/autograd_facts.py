"""What eager's autograd does per op, written down once.

Autograd does not run while we trace (it runs when the program does), yet
several stages must predict it: the ``.data`` watch (a write after an op saved
what it wrote), the write-back guard (an op that saved an input the program
writes back), the observers (which results require grad, which writes autograd
never records). Each prediction rests on a fact about an op, kept here as data::

    has(aten.mul.Tensor, Fact.OWN_GRAD_IGNORES_SELF)   # True: d(a*b)/da reads b only

An op has the facts registered for it by :func:`_facts` below; an op without
an entry has none (the safe default: it may save anything, its results may
require grad). tests/trace/test_autograd_facts.py provokes every (op, fact) in
eager and fails when torch changes one. :func:`may_carry_grad` and
:func:`nodes_that_may_carry_grad` say which values can hold a gradient at all.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from typing import Any

import torch


class Fact(enum.Enum):
    """One thing eager's autograd does for an op; the value says what it means."""

    SAVES_NO_INPUT = "its backward reads no input's value, only sizes and dtypes: autograd saves no input"
    SAVES_NO_RESULT = "its backward does not read its result"
    SELF_NOT_SAVED = "its backward never reads its first input (self)"
    OWN_GRAD_IGNORES_SELF = "its gradient for self does not read self (self is saved only for other inputs' gradients)"
    WRITE_NOT_RECORDED = "an in-place write autograd does not record: the data changes, the history does not"
    NEVER_DIFFERENTIABLE = "its results never require grad, whatever its inputs"
    UNSEEN_ALIAS = "its result aliases its input without autograd seeing the alias (no history)"
    BACKWARD_READS_UNCHECKED = "(a HOP) its backward reads its operands without autograd's version check"


_aten = torch.ops.aten
_FACTS: dict[Any, frozenset[Fact]] = {}
_NONE: frozenset[Fact] = frozenset()


def _facts(fact: Fact, ops: Iterable[Any]) -> None:
    for op in ops:
        _FACTS[op] = _FACTS.get(op, _NONE) | {fact}


def has(op: Any, fact: Fact) -> bool:
    """Whether eager's autograd does ``fact`` for ``op``."""
    return fact in _FACTS.get(op, _NONE)


def ops_with(fact: Fact) -> frozenset[Any]:
    """Every op registered with ``fact``."""
    return frozenset(op for op, facts in _FACTS.items() if fact in facts)


def may_carry_grad(t: Any) -> bool:
    """A floating or complex tensor: the dtypes autograd gives gradients."""
    return isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex())


def nodes_that_may_carry_grad(graph: torch.fx.Graph, sources: set[torch.fx.Node]) -> set[torch.fx.Node]:
    """The nodes of ``graph`` whose value may carry autograd history from ``sources``
    (a parameter, a float user input): every node fed by one, but through ``detach``."""
    reached = set(sources)
    for node in graph.nodes:
        if node.target is not _aten.detach.default and any(i in reached for i in node.all_input_nodes):
            reached.add(node)
    return reached


_facts(Fact.SAVES_NO_INPUT, (  # adding, copying, viewing, joining, sums and means (derivatives.yaml)
    _aten.add.Tensor, _aten.sub.Tensor, _aten.add.Scalar, _aten.sub.Scalar, _aten.neg.default,
    _aten.clone.default, _aten.detach.default, _aten._to_copy.default, _aten.expand.default,
    _aten.view.default, _aten.reshape.default, _aten.slice.Tensor, _aten.select.int, _aten.t.default,
    _aten.permute.default, _aten.unsqueeze.default, _aten.squeeze.dim, _aten.alias.default,
    _aten.copy_.default, _aten.cat.default, _aten.stack.default, _aten.sum.default, _aten.sum.dim_IntList,
    _aten.mean.default, _aten.mean.dim,
    _aten.view.dtype,  # not differentiable: no autograd node at all
))

# Any op recorded with grad and not listed here may save its result (exp, sigmoid, tanh, relu,
# softmax, CPU scaled_dot_product_attention, linalg ops): a `.data` write to the result then
# changes eager's gradient, silently.
_facts(Fact.SAVES_NO_RESULT, (
    _aten.add.Tensor, _aten.add.Scalar, _aten.sub.Tensor, _aten.sub.Scalar, _aten.mul.Tensor, _aten.mul.Scalar,
    _aten.div.Tensor, _aten.div.Scalar, _aten.neg.default, _aten.abs.default,
    _aten.mm.default, _aten.bmm.default, _aten.addmm.default, _aten.linear.default, _aten.matmul.default,
    _aten.conv1d.default, _aten.conv2d.default, _aten.layer_norm.default, _aten.group_norm.default,
    _aten.batch_norm.default, _aten.rms_norm.default, _aten.embedding.default, _aten.dropout.default,
    _aten.where.self, _aten.index.Tensor, _aten.masked_fill.Scalar, _aten.clamp.default,
    _aten.hardtanh.default, _aten.leaky_relu.default, _aten.elu.default, _aten.gelu.default, _aten.silu.default,
    _aten.hardsigmoid.default, _aten.softplus.default, _aten.mish.default, _aten.log.default,
    _aten.log1p.default, _aten.sin.default, _aten.cos.default, _aten.asin.default, _aten.atan.default,
    _aten.sinh.default, _aten.cosh.default, _aten.erf.default, _aten.erfinv.default, _aten.lgamma.default,
    _aten.digamma.default, _aten.logit.default, _aten.pow.Tensor_Scalar, _aten.var.correction,
    _aten.max.dim, _aten.sort.default, _aten.topk.default, _aten.cummax.default, _aten.maximum.default,
    _aten.minimum.default,
    _aten.add_.Tensor, _aten.add_.Scalar, _aten.sub_.Tensor, _aten.mul_.Tensor, _aten.mul_.Scalar,
    _aten.div_.Tensor, _aten.div_.Scalar, _aten.neg_.default, _aten.clamp_.default, _aten.masked_fill_.Scalar,
    _aten.index_put_.default, _aten.fill_.Scalar, _aten.fill_.Tensor, _aten.zero_.default,
    _aten.zeros_like.default, _aten.ones_like.default, _aten.empty_like.default, _aten.full_like.default,
    _aten.rand_like.default, _aten.randn_like.default,  # no backward: the input gives only the shape
))

_facts(Fact.SELF_NOT_SAVED, (
    _aten.add.Tensor, _aten.sub.Tensor, _aten.add.Scalar, _aten.sub.Scalar, _aten._to_copy.default,
    _aten.clone.default, _aten.expand.default, _aten.slice_scatter.default,
    _aten.select_scatter.default, _aten.diagonal_scatter.default, _aten.as_strided_scatter.default,
    _aten.index_put.default, _aten.masked_fill.Scalar, _aten.masked_fill.Tensor, _aten.fill.Scalar,
    _aten.zeros_like.default, _aten.detach.default,
))

_facts(Fact.OWN_GRAD_IGNORES_SELF, (  # they read the other operand, the result, or nothing
    _aten.mul.Tensor, _aten.mul.Scalar, _aten.div.Tensor, _aten.div.Scalar, _aten.relu.default,
    _aten.fill.Tensor, _aten.zero.default, _aten.neg.default, _aten.sigmoid.default, _aten.tanh.default,
    _aten.exp.default,
))

_facts(Fact.WRITE_NOT_RECORDED, (  # their functional forms are not differentiable
    _aten.logical_not_.default, _aten.logical_and_.default, _aten.logical_or_.default, _aten.logical_xor_.default,
))

_facts(Fact.NEVER_DIFFERENTIABLE, (  # a *_like factory reads only its input's metadata
    _aten.detach.default, _aten.zeros_like.default, _aten.ones_like.default,
    _aten.empty_like.default, _aten.full_like.default, _aten.rand_like.default,
    _aten.randn_like.default, _aten.randint_like.default,
))

_facts(Fact.UNSEEN_ALIAS, (_aten.detach.default, _aten.view.dtype))

_facts(Fact.BACKWARD_READS_UNCHECKED, (  # cond and map raise on a written operand, as ops do
    torch.ops.higher_order.while_loop, torch.ops.higher_order.scan,
))


def _mul_saves(args: tuple, may_need_grad: Callable[[Any], bool]) -> list[Any]:
    """``a * b``: autograd saves each factor only for the other's gradient (``x * 3`` saves nothing)."""
    a, b = args[0], args[1]
    return [t for t, other in ((a, b), (b, a))
            if isinstance(t, torch.Tensor) and isinstance(other, torch.Tensor) and may_need_grad(other)]


def _div_saves(args: tuple, may_need_grad: Callable[[Any], bool]) -> list[Any]:
    """``a / b``: the divisor for both gradients, the dividend only for the divisor's (``x / 4`` saves nothing)."""
    a, b = args[0], args[1]
    if not isinstance(b, torch.Tensor):
        return []
    return [b, a] if isinstance(a, torch.Tensor) and may_need_grad(b) else [b]


# ops that save only some of the tensors they read: op -> (args, may_need_grad) -> those saved
SavedOperands = Callable[[tuple, Callable[[Any], bool]], list[Any]]
_SAVED_OPERANDS: dict[Any, SavedOperands] = {_aten.mul.Tensor: _mul_saves, _aten.div.Tensor: _div_saves}


def saved_operands(op: Any) -> SavedOperands | None:
    """For an op that saves only some of the tensors it reads, which (given which may need grad)."""
    return _SAVED_OPERANDS.get(op)


__all__ = ["Fact", "has", "may_carry_grad", "nodes_that_may_carry_grad", "ops_with", "saved_operands"]
