"""A value that requires grad written into an integer tensor (``x[0] = self.w[1]``): refused
naming the op and the line where torch's functional form cannot run it (GRAD_VALUE_INTO_INTEGER),
exported where the value is detached."""

import torch
from expecttest import TestCase
from torch import nn

import predispatch_func as pf
from tests.support.expect_refusal import at_line, refused
from tests.support.torch_release import torch_limit


class GradValueWrittenIntoIntegerTensor(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(3))

    def forward(self, x):
        x[0] = self.w[1]
        return x


class TestGradValueIntoIntegerTensor(TestCase):
    """torch 2.13: fill.Tensor / masked_fill.Tensor (the functional forms every functional
    path needs) raise 'Autograd not support dtype' when they write a value that requires
    grad into an integer tensor; eager's in-place fill_ gives the integer tensor a grad_fn
    when called directly and none through x[i] = v (found by fuzzing, seed 9)."""

    def test_is_refused_naming_op_and_line(self):
        with refused(pf.Refusal.GRAD_VALUE_INTO_INTEGER, r"integer tensor[\s\S]*aten\.fill_\.Tensor[\s\S]*"
                                    + at_line(__file__, r"x\[0\] = self\.w\[1\]")):
            pf.export(GradValueWrittenIntoIntegerTensor(), (torch.zeros(2, 3, dtype=torch.long),))

    @torch_limit("torch's functional fill.Tensor cannot run under autograd with an integer self and a "
                 "value that requires grad (GRAD_VALUE_INTO_INTEGER)", raises=pf.UnsupportedError)
    def test_exports_and_replays(self):
        from tests.support.reference import export_checked

        export_checked(GradValueWrittenIntoIntegerTensor(), (torch.zeros(2, 3, dtype=torch.long),))

    def test_detached_value_exports(self):
        class Detached(GradValueWrittenIntoIntegerTensor):
            def forward(self, x):
                x[0] = self.w[1].detach()
                return x

        from tests.support.reference import export_checked

        export_checked(Detached(), (torch.zeros(2, 3, dtype=torch.long),))
