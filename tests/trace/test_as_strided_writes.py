"""Writes through an ``as_strided`` view, with gradients.

Functionalization writes such a view back into its base with ``as_strided_scatter``,
whose derivative for the base is wrong in torch (2.11 to 2.15): the program's
gradients were silently off. trace/differentiable_scatter.py records an
``index_put`` of the covered positions instead. Each case: a base computed with grad,
a view of it by ``as_strided`` (contiguous or strided, with an offset, 1-D or 2-D),
written in place, and the base read after; replayed against eager with gradients.
"""

import pytest
import torch
from expecttest import TestCase
from torch import nn

import predispatch_func as pf
from tests.support.expect_refusal import at_line, refused
from tests.support.reference import call_targets, export_checked
from tests.support.torch_release import torch_limit

VIEWS = {  # base shape, (size, stride, offset)
    "slice-like": ((6,), ((3,), (1,), 1)),
    "every-other": ((8,), ((4,), (2,), 0)),
    "2d-window": ((4, 5), ((2, 3), (5, 1), 6)),
    "2d-column": ((4, 5), ((4,), (5,), 2)),
    "transposed": ((3, 4), ((4, 3), (1, 4), 0)),
}
WRITES = {
    "mul_": lambda v, w: v.mul_(2),
    "add_grad_value": lambda v, w: v.add_(w[: v.numel()].view(v.shape)),
    "copy_grad_value": lambda v, w: v.copy_(w[: v.numel()].view(v.shape)),
    "zero_": lambda v, w: v.zero_(),
}


class WriteThroughAsStrided(torch.nn.Module):
    def __init__(self, view, write):
        super().__init__()
        self.view, self.write = view, write
        self.w = torch.nn.Parameter(torch.randn(20))

    def forward(self, x):
        y = x * 1.5
        size, stride, offset = self.view
        self.write(y.as_strided(size, stride, offset), self.w)
        return y.sin()


@pytest.mark.parametrize("write", WRITES)
@pytest.mark.parametrize("view", VIEWS)
def test_write_through_as_strided_view_matches_eager_gradients(view, write):
    shape, geometry = VIEWS[view]
    export_checked(WriteThroughAsStrided(geometry, WRITES[write]), (torch.randn(*shape),))


class WriteThroughAsStridedUnderNoGrad(torch.nn.Module):
    def forward(self, x):
        y = x * 1.5
        with torch.no_grad():
            y.as_strided((2,), (2,), 1).mul_(3)
        return y.cos()


def test_write_through_as_strided_view_under_no_grad():
    export_checked(WriteThroughAsStridedUnderNoGrad(), (torch.randn(6),))


class WriteThroughAsStridedOfAView(nn.Module):
    def forward(self, x):
        v = x[1:]
        w = v.as_strided((2, 2), (2, 1), 2)
        w.add_(1)
        return x


class TestWriteThroughAsStridedOfAView(TestCase):
    """torch 2.13's functionalization bans a write through a chain whose second view is
    as_strided (pytorch/pytorch#104505); torch.export fails the same way (found by fuzzing)."""

    def test_is_refused_naming_op_and_line(self):
        with refused(pf.Refusal.WRITE_THROUGH_AS_STRIDED_OF_VIEW, r"as_strided\(\) view taken of another view"
                                    r"[\s\S]*aten\.add_\.Tensor[\s\S]*" + at_line(__file__, r"w\.add_\(1\)")):
            pf.export(WriteThroughAsStridedOfAView(), (torch.randn(6),))

    @torch_limit("torch's functionalization cannot replay a write through as_strided of a view "
                 "(WRITE_THROUGH_AS_STRIDED_OF_VIEW)", raises=pf.UnsupportedError)
    def test_exports_and_replays(self):
        from tests.support.reference import export_checked

        export_checked(WriteThroughAsStridedOfAView(), (torch.randn(6),))

    def test_as_strided_of_the_base_exports(self):
        class OfBase(nn.Module):
            def forward(self, x):
                w = x.as_strided((2, 2), (2, 1), 1)
                w.add_(1)
                return x

        from tests.support.reference import export_checked

        export_checked(OfBase(), (torch.randn(6),))


class CallsAsStridedScatter(torch.nn.Module):
    def forward(self, x, src):
        return torch.as_strided_scatter(x * 2, src, (2,), (2,), 1).sin()


def test_a_users_own_as_strided_scatter_gets_eagers_op_and_gradients():
    """Only functionalization's write-backs take the index_put stand-in: a model that calls the
    op itself gets eager's op and derivative, as torch.export records it (PyTorch's OpInfo
    as_strided_scatter/grad case was 0.66 off eager once the stand-in replaced every call)."""
    x, src = torch.randn(6, requires_grad=True), torch.randn(2, requires_grad=True)
    ep = export_checked(CallsAsStridedScatter(), (x, src))
    assert "aten.as_strided_scatter.default" in call_targets(ep)
