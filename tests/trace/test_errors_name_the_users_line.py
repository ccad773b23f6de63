"""What the model itself gets wrong while tracing (a shape error, its own exception, an
in-place op on a broadcast view) is an error that names the op and the line of the user's
model: never a different program."""

import torch
from expecttest import TestCase
from torch import nn

import predispatch_func as pf
from tests.support.expect_refusal import at_line


class TestErrorsInsideTheModel(TestCase):
    def test_shape_error_names_op_and_line(self):
        class M(nn.Module):
            def forward(self, x, y):
                z = x.relu()
                return torch.mm(z, y)

        with self.assertRaisesRegex(pf.ExportError, r"aten\.mm\.default[\s\S]*"
                                    + at_line(__file__, r"return torch\.mm\(z, y\)")):
            pf.export(M(), (torch.randn(2, 3), torch.randn(4, 5)))

    def test_users_own_exception_names_line(self):
        class M(nn.Module):
            def forward(self, x):
                if x.shape[0] != 5:
                    raise ValueError("expected 5 rows")
                return x

        with self.assertRaisesRegex(pf.ExportError, r"ValueError: expected 5 rows[\s\S]*"
                                    + at_line(__file__, r'raise ValueError\("expected 5 rows"\)')):
            pf.export(M(), (torch.randn(2),))

    def test_inplace_on_broadcast_view_names_op_and_line(self):
        class M(nn.Module):
            def forward(self, x, y):
                x.add_(y)
                return x

        with self.assertRaisesRegex(pf.ExportError, r"aten\.add_\.Tensor[\s\S]*" + at_line(__file__, r"x\.add_\(y\)")):
            pf.export(M(), (torch.randn(3), torch.randn(2, 3)))
