"""``dst.copy_(src)`` into an unwritten input, ``src`` written later (in place, under no_grad, through
``.data``): the program may use ``src``'s value for ``dst`` but not ``src``'s graph input itself,
whose write-back would change what the backward saved (eager saved a copy).

Shrunk from programs the differential fuzzer (tests/fuzz) printed; replayed against the reference.
"""

import torch
from expecttest import TestCase

from tests.support.reference import export_checked, graph_code


class InputCopiedFromParameterThenParameterDataWritten(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(3))

    def forward(self, x):
        x.copy_(self.w)  # eager: x is a copy, and sin saves that copy
        v = x.sin()
        self.w.data += 0.5  # invisible to autograd: sin's saved copy keeps the old value
        return v


class BufferCopiedFromParameterThenParameterDataWritten(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(3))
        self.register_buffer("b", torch.zeros(3))

    def forward(self, x):
        self.b.copy_(self.w)
        v = self.b.exp() * x
        self.w.data.mul_(2)
        return v


class InputCopiedFromGradInputThenSourceWrittenUnderNoGrad(torch.nn.Module):
    def forward(self, x, y):
        x.copy_(y)
        v = x.sin()
        with torch.no_grad():
            y.add_(1)  # a leaf that requires grad may be written under no_grad
        return v


class InputCopiedFromAViewOfAnInputThenWritten(torch.nn.Module):
    def forward(self, x, y):
        x.copy_(y[0])
        v = x.cos()
        with torch.no_grad():
            y.mul_(3)
        return v


class TestCopySourceWrittenLater(TestCase):
    """``dst.copy_(src)`` into an unwritten input: the program may use ``src``'s value
    for ``dst``, but not ``src``'s graph input itself when that is written later (its
    write-back would change what the backward saved; eager saved a copy)."""

    def test_input_copied_from_parameter_then_parameter_data_written(self):
        export_checked(InputCopiedFromParameterThenParameterDataWritten(), (torch.randn(3),))

    def test_buffer_copied_from_parameter_then_parameter_data_written(self):
        export_checked(BufferCopiedFromParameterThenParameterDataWritten(), (torch.randn(3),))

    def test_input_copied_from_grad_input_then_source_written_under_no_grad(self):
        export_checked(InputCopiedFromGradInputThenSourceWrittenUnderNoGrad(),
                       (torch.randn(3), torch.randn(3, requires_grad=True)))

    def test_input_copied_from_a_view_of_an_input_then_written(self):
        export_checked(InputCopiedFromAViewOfAnInputThenWritten(),
                       (torch.randn(3), torch.randn(2, 3, requires_grad=True)))

    def test_copy_from_an_input_written_later_is_not_the_input_itself(self):
        ep = export_checked(InputCopiedFromParameterThenParameterDataWritten(), (torch.randn(3),))
        sin = next(n for n in ep.graph.nodes if n.target is torch.ops.aten.sin.default)
        self.assertNotEqual(sin.args[0].op, "placeholder", graph_code(ep))


class InputViewCopiedFromGradInputThenSourceWritten(torch.nn.Module):
    def forward(self, x, y):
        v = x.view(2, 2)
        v.copy_(y)  # the view's new value is y's: the program must not read y's input for it
        r = v.sin()
        with torch.no_grad():
            y.mul_(2)
        return r


class TestCopySourceWrittenLaterThroughViews(TestCase):
    def test_input_view_copied_from_grad_input_then_source_written(self):
        export_checked(InputViewCopiedFromGradInputThenSourceWritten(),
                       (torch.randn(4), torch.randn(2, 2, requires_grad=True)))
