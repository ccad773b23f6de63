"""The write-back guard (passes/writeback_guard.py): an op that saves a written input for backward
reads a clone, so ``ep.module()``'s write-back after the forward does not change what autograd saved
(eager's backward would otherwise fail with "modified by an inplace operation")."""

import torch
from expecttest import TestCase

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
