"""A program is never handed a constant the trace made without a value (issue 41's finding)."""

import pytest
import torch

import predispatch_func as pf


class LerpInPlace(torch.nn.Module):
    def forward(self, x, y):
        x = x * 1
        x.lerp_(y, 0.1)  # an EMA update: torch's lerp decomposition made its weight a tensor (new_full)
        return x


class IndexFillInPlace(torch.nn.Module):
    def forward(self, x):
        x = x * 1
        x.index_fill_(0, torch.tensor([1]), 1.0)  # torch's index_fill decomposition makes its value a tensor
        return x


def test_an_unrecorded_tensor_made_by_a_lowering_is_refused_not_a_fake_constant():
    """A tensor made by an op that decomposes again, inside a lowering reached from an in-place op's
    functionalization kernel, is not recorded by the trace: refused, naming the user's line."""
    with pytest.raises(pf.ExportError, match="without a value") as raised:
        pf.export(IndexFillInPlace(), (torch.randn(4),), target=pf.OpSet.core_aten())
    assert "x.index_fill_(0, torch.tensor([1]), 1.0)" in str(raised.value)  # the user's line


def test_lerp_in_place_under_core_aten_exports_and_equals_eager():
    """Ours lowers lerp with a number weight keeping the weight a number (it was refused above)."""
    model, args = LerpInPlace(), (torch.randn(4), torch.randn(4))
    ep = pf.export(model, args, target=pf.OpSet.core_aten())
    assert pf.verify(ep, model, args).ok


def test_torch_lerp_out_of_place_under_core_aten_is_right():
    class Lerp(torch.nn.Module):
        def forward(self, x, y):
            return torch.lerp(x, y, 0.1)

    model, args = Lerp(), (torch.randn(4), torch.randn(4))
    ep = pf.export(model, args, target=pf.OpSet.core_aten())
    assert pf.verify(ep, model, args).ok


def test_a_mask_the_lowering_cannot_draw_as_eager_is_refused_with_the_reason():
    """``bernoulli_(0.1)``: 1 - (1 - 0.1) != 0.1, so native_dropout would draw against another
    threshold; the refusal says why and names the line."""
    class Mask(torch.nn.Module):
        def forward(self, x):
            return torch.empty_like(x).bernoulli_(0.1) * x

    with pytest.raises(pf.ExportError, match="declines where it cannot draw eager's mask") as raised:
        pf.export(Mask(), (torch.randn(3),), target=pf.OpSet.core_aten())
    assert "bernoulli_(0.1)" in str(raised.value)
