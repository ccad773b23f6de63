"""In-place ops whose autograd link eager makes otherwise than their functional form: comparisons
(``eq_`` ...) recording a zero-gradient node, ``logical_*_`` recording none (the history is kept),
``resize_as_`` reading only its template's shape.

Found by the conformance runner (scripts/conformance.py), judged as it judges (tests/support/conformance_judge.py).
"""

from __future__ import annotations

import pytest
import torch

from tests.support.conformance_judge import assert_ok


class CompareIntoBuffer(torch.nn.Module):
    def __init__(self, op):
        super().__init__()
        self.op = op
        self.register_buffer("buf", torch.randn(2, 3).round())

    def forward(self, other, x):
        self.op(self.buf, other)
        y = x * 1
        self.op(y[1], other[0])  # into a view of an intermediate
        return self.buf.clone(), y


@pytest.mark.parametrize("name", ["eq_", "ne_", "lt_", "le_", "gt_", "ge_"])
def test_in_place_comparison_with_an_operand_that_requires_grad(name):
    """Eager's ``buf.eq_(other)`` records a node with zero gradients, so ``buf``
    requires grad when ``other`` does; the functional ``eq`` gave a bool value
    without autograd link (the program's result did not require grad)."""
    other = torch.randn(2, 3).round()
    other[0, 0] = 0.0
    assert_ok(CompareIntoBuffer(getattr(torch.Tensor, name)), (other, torch.randn(2, 3).round()))


class LogicalInPlace(torch.nn.Module):
    def __init__(self, op):
        super().__init__()
        self.op = op

    def forward(self, x, other):
        self.op(x[1], other)  # a view of an input
        y = x * 2
        self.op(y, other)  # an intermediate
        return y * x


_LOGICAL = {
    "logical_not_": lambda t, other: t.logical_not_(),
    "logical_and_": torch.Tensor.logical_and_,
    "logical_or_": torch.Tensor.logical_or_,
    "logical_xor_": torch.Tensor.logical_xor_,
}


@pytest.mark.parametrize("name", sorted(_LOGICAL))
def test_logical_in_place_ops_keep_autograd_history(name):
    """Eager's autograd does not record ``logical_*_`` (like a write under no_grad: the
    data changes, the history and its gradient of 1 stay); ours gave 0."""
    x = torch.randn(2, 3)
    x[0, 1] = 0.0
    assert_ok(LogicalInPlace(_LOGICAL[name]), (x, (torch.randn(3) > 0).float()))


class ResizeAsBuffer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("buf", torch.randn(2, 3))

    def forward(self, template):
        self.buf.resize_as_(template)
        return self.buf * 2


def test_resize_as_of_a_buffer_to_a_template_that_requires_grad():
    """Only the template's shape is read: eager's buffer does not require grad;
    torch's functional ``resize_as`` made it (the program's output required grad)."""
    assert_ok(ResizeAsBuffer(), (torch.randn(2, 3),))
