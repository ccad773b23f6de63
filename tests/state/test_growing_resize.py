"""``resize_()`` growing a tensor past its memory: torch's functionalization refuses it under
FunctionalTensorMode (even for a fresh ``torch.empty(0)``); ours carries a contiguous one
(trace/stack.py ``PolicyFunctionalMode._grow``), each program replayed against eager."""

import os

import pytest
import torch
from torch import nn

import predispatch_func as pf
from tests.support.expect_refusal import refused
from tests.support.reference import export_checked, mutations


class GrowInputThenFill(nn.Module):
    def forward(self, x):
        x.resize_(5, 3)
        return x.fill_(1.5)


class GrowInputKeepingItsElements(nn.Module):
    def forward(self, x):
        x.resize_(3, 3)  # the old six elements stay first, in memory order
        x[2].fill_(7.0)
        return x * 2


class GrowFlatInput(nn.Module):
    def forward(self, x):
        x.resize_(8)
        x[4:].copy_(x[:4] * 10)
        return x.sum()


class GrowEmptyIntermediate(nn.Module):
    """The out= idiom: an empty result grown to its size, then written."""
    def forward(self, x):
        out = x.new_empty(0)
        out.resize_(x.shape[0] * 2, x.shape[1])
        out.copy_(torch.cat([x, x.sin()]))
        return out + 1


class GrowClone(nn.Module):
    def forward(self, x):
        y = x.clone()
        y.resize_(3, 3)
        y[2:].copy_(x[:1] * 2)
        return y


class GrowBuffer(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("seen", torch.zeros(2))

    def forward(self, x):
        self.seen.resize_(4)
        self.seen[2:].copy_(x.sum(0))
        return x * 2


@pytest.mark.parametrize("model_cls", [GrowInputThenFill, GrowInputKeepingItsElements, GrowFlatInput,
                                       GrowEmptyIntermediate, GrowClone])
def test_growing_resize_exports_and_equals_eager(model_cls):
    x = torch.randn(2, 3) if model_cls is not GrowFlatInput else torch.randn(4)
    ep = export_checked(model_cls(), (x,))
    assert "resize" not in ep.graph_module.code
    eager_x, program_x = x.clone(), x.clone()
    torch.testing.assert_close(ep.module()(program_x), model_cls()(eager_x))
    assert program_x.shape == eager_x.shape and program_x.stride() == eager_x.stride()
    torch.testing.assert_close(program_x, eager_x)


def test_growing_a_buffer_is_a_buffer_mutation_of_the_new_size():
    model = GrowBuffer()
    ep = export_checked(model, (torch.randn(3, 2),))
    assert mutations(ep) == [("BUFFER_MUTATION", "seen")]
    m, pm = GrowBuffer(), ep.module()
    x = torch.randn(3, 2)
    torch.testing.assert_close(pm(x), m(x))
    torch.testing.assert_close(pm.seen, m.seen)


def test_a_grown_input_is_relaid_by_the_program_and_checked_on_the_next_call():
    x = torch.randn(2, 3)
    ep = pf.export(GrowInputThenFill(), (x,))
    y = torch.randn(2, 3)
    ep.module()(y)
    assert y.shape == (5, 3)
    with pytest.raises(RuntimeError, match="exported for"):
        ep.module()(y)  # a second call meets the grown tensor: another layout


def test_growing_a_tensor_that_requires_grad_is_refused():
    """Eager refuses it too ("cannot resize variables that require grad")."""
    class M(nn.Module):
        def forward(self, x):
            y = x * 2
            y.resize_(5, 3)
            return y

    with refused(pf.Refusal.INPUT_METADATA_MUTATION, r"resize_[\s\S]*requires grad[\s\S]*test_growing_resize"):
        pf.export(M(), (torch.randn(2, 3, requires_grad=True),))


class GrowInput(torch.nn.Module):
    def forward(self, x):
        x.resize_(5, 3)
        return x.fill_(1.5)


class GrowTransposedView(torch.nn.Module):
    def forward(self, x):
        y = x.t()
        y.resize_(5, 3)
        return y.fill_(1.5)


def test_growing_an_input_with_resize_is_carried():
    """torch's functionalization cannot grow a tensor under FunctionalTensorMode; ours carries a
    contiguous one (the tests above)."""
    from tests.support.reference import export_checked

    export_checked(GrowInput(), (torch.randn(2, 3),))


def test_growing_a_transposed_view_with_resize_is_refused():
    """Eager's grown tensor reads memory order, not the view's: torch's refusal, made clear."""
    import predispatch_func as pf

    with pytest.raises(pf.UnsupportedError, match="cannot grow") as info:
        pf.export(GrowTransposedView(), (torch.randn(2, 3),))
    assert "resize_" in str(info.value) and os.path.basename(__file__) in str(info.value)
