"""``normal`` with tensor arguments under ``pf.eager.on(core_aten)``: drawn as eager draws, with
eager's (zero) gradient; eager only (``eager/random_decompositions.py`` says why)."""

import pytest
import torch

import predispatch_func as pf

CORE = pf.OpSet.core_aten()
aten = torch.ops.aten


def _draw(call, mean, std):
    mean, std = (t.clone().requires_grad_() if isinstance(t, torch.Tensor) else t for t in (mean, std))
    torch.manual_seed(7)
    out = call(mean, std)
    (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape)).sum().backward()
    return out.detach(), [t.grad for t in (mean, std) if isinstance(t, torch.Tensor)]


@pytest.mark.parametrize(("op", "mean", "std"), [
    (aten.normal.Tensor_Tensor, torch.randn(3, 4, dtype=torch.float64), torch.rand(4, dtype=torch.float64) + 0.5),
    (aten.normal.Tensor_float, torch.randn(3, 4, dtype=torch.float64), 0.7),
    (aten.normal.float_Tensor, 1.5, torch.rand(3, 4) + 0.5),
], ids=["Tensor_Tensor", "Tensor_float", "float_Tensor"])
def test_normal_draws_and_differentiates_as_eager(op, mean, std):
    expected = _draw(torch.normal, mean, std)
    with pf.eager.on(CORE) as session:
        got = _draw(torch.normal, mean, std)
    torch.testing.assert_close(got, expected)
    assert op in session.stats.decomposed
    assert all(not g.any() for g in expected[1])  # torch's gradient of a draw is zero


def test_export_still_names_normal_as_unreachable():
    class Draw(torch.nn.Module):
        def forward(self, mean, std):
            return torch.normal(mean, std)

    with pytest.raises(pf.UnsupportedError, match="aten.normal.Tensor_Tensor"):
        pf.export(Draw(), (torch.zeros(3), torch.ones(3)), target=CORE)
