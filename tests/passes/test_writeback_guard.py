"""The write-back guard (passes/writeback_guard.py): an op that saves a written input for backward
reads a clone, so ``ep.module()``'s write-back after the forward does not change what autograd saved
(eager's backward would otherwise fail with "modified by an inplace operation")."""

import pytest
import torch
import torch.nn.functional as F
from expecttest import TestCase

from tests.support.conformance_judge import assert_ok
from tests.support.reference import export_checked, graph_code


class BufferWrittenThroughViewByGradValue(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("buf", torch.randn(3))

    def forward(self, x):
        v = self.buf[0::1]
        v.mul_(x)  # eager's mul_ saves a copy of the old v; ours reads buf through a view
        return v


class TestWriteBackGuardThroughViews(TestCase):
    def test_op_reading_a_written_buffer_through_a_view_reads_a_clone(self):
        # module() writes buf back after the forward; the mul that saved a view of the old
        # buf for backward then failed with "modified by an inplace operation"
        ep = export_checked(BufferWrittenThroughViewByGradValue(), (torch.randn(3),))
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, b_buf, x):
    slice_1 = torch.ops.aten.slice.Tensor(b_buf, 0, 0, 9223372036854775807)
    clone_default = torch.ops.aten.clone.default(slice_1);  slice_1 = None
    mul = torch.ops.aten.mul.Tensor(clone_default, x);  clone_default = x = None
    slice_scatter = torch.ops.aten.slice_scatter.default(b_buf, mul, 0, 0, 9223372036854775807);  b_buf = mul = None
    slice_2 = torch.ops.aten.slice.Tensor(slice_scatter, 0, 0, 9223372036854775807)
    return (slice_scatter, slice_2)""")


class InPlaceOnInput(torch.nn.Module):
    def __init__(self, op):
        super().__init__()
        self.op = op

    def forward(self, x):
        self.op(x)
        return x * 2


class InPlaceOnViewOfInput(InPlaceOnInput):
    def forward(self, x):
        self.op(x[1])
        return x * 2


_SAVES_SELF = {
    "sin_": torch.Tensor.sin_,
    "abs_": torch.Tensor.abs_,
    "log_": lambda x: x.abs_().add_(1).log_(),
    "silu": lambda x: F.silu(x, inplace=True),
    "elu": lambda x: F.elu(x, inplace=True),
    "leaky_relu": lambda x: F.leaky_relu(x, 0.1, inplace=True),
    "threshold": lambda x: F.threshold(x, 0.1, 2.0, inplace=True),
    "renorm_": lambda x: x.renorm_(2, 0, 1.0),
}


@pytest.mark.parametrize("name", sorted(_SAVES_SELF))
def test_in_place_on_an_input_that_requires_grad_keeps_backward(name):
    """The op's backward reads the input's old value; ``ep.module()``'s write-back
    must not overwrite the tensor autograd saved (``modified by an inplace operation``)."""
    assert_ok(InPlaceOnInput(_SAVES_SELF[name]), (torch.randn(3, 4),))


@pytest.mark.parametrize("name", sorted(_SAVES_SELF))
def test_in_place_on_a_view_of_an_input_that_requires_grad_keeps_backward(name):
    assert_ok(InPlaceOnViewOfInput(_SAVES_SELF[name]), (torch.randn(2, 3, 4),))
