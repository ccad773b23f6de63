"""A program is never handed a constant the trace made without a value (issue 41's finding)."""

import pytest
import torch

import predispatch_func as pf
from tests.opsets.test_in_place_under_target import WRITES, Writes

# the six in-place ops whose lowering under core_aten makes a tensor through Python (torch.full,
# new_full, scalar_tensor...), each refused as a constant with no value before the factory fix: lerp_,
# index_fill_, hypot_, ldexp_, i0_, nextafter_; exported and replayed in tests/opsets/test_in_place_under_target.py


def test_an_unrecorded_tensor_made_by_a_lowering_is_refused_not_a_fake_constant(monkeypatch):
    """Without the factory results' copies in their nodes (node_values_unsnapshotted), torch's C++
    factory wrapper hands the lowering a shallow copy the tracer never saw: the safety net refuses
    it, naming the user's line. Also pins that torch still copies there (if it stops, this exports)."""
    from predispatch_func._torch_compat import patches

    monkeypatch.setattr(patches, "_is_factory", lambda func: False)
    with pytest.raises(pf.ExportError, match="without a value") as raised:
        pf.export(Writes(WRITES["hypot_"]), (torch.randn(4), torch.randn(4)), target=pf.OpSet.core_aten())
    assert "self.write(x, y)" in str(raised.value)  # the user's line


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
