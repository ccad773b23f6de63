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


class GrowsABufferItSlices(nn.Module):
    """Reads half of its buffer, then doubles it: the program bakes the first call's slice
    bound (2) where eager's second call takes 4 elements."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(1))
        self.register_buffer("buf", torch.arange(4.0))

    def forward(self, x):
        half = self.buf[: self.buf.shape[0] // 2].sum()
        self.buf = torch.cat([self.buf, self.buf + 1])
        return ((x + half) * self.w).sum()


class TestBufferOfANewShapeMetAgain(TestCase):
    def test_the_second_call_on_the_new_shape_is_refused_not_silently_wrong(self):
        """Was silently wrong: the second call of ep.module() gave 1.0 where eager gives 6.0
        (torch.export's module raises a size mismatch). The first call is eager's."""
        model, x = GrowsABufferItSlices(), torch.zeros(1)
        program = pf.export(GrowsABufferItSlices(), (x,)).module()
        torch.testing.assert_close(program(x), model(x))
        torch.testing.assert_close(program.buf, model.buf)
        with refused(pf.Refusal.STATE_REPLACED, r"exported with buf of shape \(4,\)[\s\S]*called with buf of "
                     r"shape \(8,\)"):
            program(x)

    def test_the_training_step_refuses_the_same(self):
        model, x = GrowsABufferItSlices(), torch.zeros(1)
        step = pf.export_joint(GrowsABufferItSlices(), (x,)).module()
        loss, = step(x)
        eager_loss = model(x)
        eager_loss.backward()
        torch.testing.assert_close(loss, eager_loss.detach())
        torch.testing.assert_close(step.w.grad, model.w.grad)
        with refused(pf.Refusal.STATE_REPLACED, r"exported with buf of shape \(4,\)"):
            step(x)
