"""``dst.copy_(src)`` lowered to a functional copy that keeps eager's autograd: differentiable
into buffers, transposed and strided views, ``dst`` still requiring grad after a source that
does not (its gradient zero), its own link kept when the source has the same layout.

Shrunk from programs the differential fuzzer (tests/fuzz) printed; each exported, contract-checked
and replayed against the reference with gradients.
"""

import torch
from expecttest import TestCase

from tests.support.reference import export_checked, graph_code


class CopyIntoBufferFromGradInput(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("buf", torch.zeros(2, 4))

    def forward(self, x):
        self.buf.copy_(x)
        return self.buf * 2


class CopyIntoTransposedView(torch.nn.Module):
    def forward(self, x, y):
        a = x * 1.0
        a.t().copy_(y)
        return a.view(-1)


class CopyIntoStridedView(torch.nn.Module):
    def forward(self, x, y):
        a = x * 1.0
        v = a[:, ::2]
        v.copy_(y)
        return a, v


class CopyFromNonGradSourceOverGradIntermediate(torch.nn.Module):
    def forward(self, x):
        y = x * 2
        y.copy_(x > 0)
        return y, x


class TestFuzzRegressions(TestCase):
    def test_copy_into_buffer_from_grad_input_is_differentiable(self):
        # aten.copy (functional copy_) has no derivative: the program could not be trained
        export_checked(CopyIntoBufferFromGradInput(), (torch.randn(2, 4, requires_grad=True),))

    def test_copy_from_non_grad_source_keeps_requires_grad(self):
        # eager's copy_ result still requires grad (zero gradient to the overwritten tensor)
        export_checked(CopyFromNonGradSourceOverGradIntermediate(), (torch.randn(2, 3, requires_grad=True),))

    def test_copy_into_transposed_view_keeps_layout(self):
        export_checked(CopyIntoTransposedView(), (torch.randn(3, 4, requires_grad=True),
                                                  torch.randn(4, 3, requires_grad=True)))

    def test_copy_into_strided_view_is_differentiable(self):
        export_checked(CopyIntoStridedView(), (torch.randn(3, 4, requires_grad=True),
                                               torch.randn(3, 1, requires_grad=True)))


class CopyDetachedValueOverGradIntermediate(torch.nn.Module):
    def forward(self, x):
        v = x - x
        v.copy_(x.detach())
        return v.to(torch.float64)


class TestCopySameLayout(TestCase):
    def test_copy_of_same_layout_value_keeps_dst_autograd_link(self):
        # copy_'s same-layout shortcut made v's new value the detached tensor itself
        export_checked(CopyDetachedValueOverGradIntermediate(),
                       (torch.randn(2, 4, dtype=torch.float64, requires_grad=True),))


class BufferCopiedFromParameterThenOverwritten(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("buf", torch.zeros(3))
        self.w = torch.nn.Parameter(torch.randn(3))

    def forward(self, x):
        self.buf.copy_(self.w)  # buf now requires grad (a copy of w)
        v = self.buf.view_as(self.buf)
        v.copy_(torch.ones_like(v))  # eager: still requires grad (dst did)
        return v * x


class TestWritesFoundByExtendedGenerator(TestCase):
    def test_copy_over_a_buffer_holding_a_parameter_keeps_requires_grad(self):
        ep = export_checked(BufferCopiedFromParameterThenOverwritten(), (torch.randn(3),))
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, p_w, b_buf, x):
    clone = torch.ops.aten.clone.default(p_w);  p_w = None
    view_1 = torch.ops.aten.view.default(clone, [3]);  clone = None
    ones_like = torch.ops.aten.ones_like.default(view_1, pin_memory = False)
    slice_scatter = torch.ops.aten.slice_scatter.default(view_1, ones_like);  view_1 = ones_like = None
    view_2 = torch.ops.aten.view.default(slice_scatter, [3]);  slice_scatter = None
    view_3 = torch.ops.aten.view.default(view_2, [3])
    mul = torch.ops.aten.mul.Tensor(view_3, x);  view_3 = x = None
    return (view_2, mul)""")
