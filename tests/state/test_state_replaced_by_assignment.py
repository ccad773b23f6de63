"""A parameter replaced by assignment in forward, or a buffer replaced by a value of another
dtype, is refused (STATE_REPLACED) naming the attribute: the signature cannot carry it."""

import torch
from expecttest import TestCase
from torch import nn

import predispatch_func as pf
from tests.support.expect_refusal import refused


class TestStateReplacedByAssignment(TestCase):
    def test_parameter_replaced_by_assignment_is_refused(self):
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.w = nn.Parameter(torch.randn(3))

            def forward(self, x):
                self.w = nn.Parameter(self.w * 2)
                return x * self.w

        with refused(pf.Refusal.STATE_REPLACED, r"replaces parameter 'w' by assignment"):
            pf.export(M(), (torch.randn(3),))

    def test_buffer_replaced_with_other_dtype_is_refused(self):
        """(another shape is carried: tests/state/test_state.py)"""
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.register_buffer("seen", torch.zeros(3))

            def forward(self, x):
                self.seen = self.seen.double() + x
                return x + 1

        with refused(pf.Refusal.STATE_REPLACED, r"replaces buffer 'seen' by assignment with a value of another dtype"):
            pf.export(M(), (torch.randn(3),))
