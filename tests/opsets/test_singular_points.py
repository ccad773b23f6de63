"""Training under a target at the points where eager's derivative formula is deliberate.

A lowered forward op is differentiated as its decomposition (``export(..., target=)`` and
``export_joint(..., target=)`` lower above autograd). torch's decompositions of
``linalg_vector_norm``, ``_safe_softmax`` and ``special_log_ndtr`` have NaN gradients where
eager's formulas give a value: a zero row through ``F.normalize``, attention with a query whose
every key is masked (padding), ``log_ndtr`` right of 1. Each model here meets one such point;
every path must give eager's gradients (opsets/decompositions/singular_points.py).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import predispatch_func as pf

CORE = pf.OpSet.core_aten()


class NormalizedWithZeroRow(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 6, dtype=torch.float64))

    def forward(self, x):
        h = (x @ self.w) * (torch.arange(x.shape[0]) > 0).unsqueeze(-1)  # row 0 is all zeros
        return F.normalize(h, dim=-1) + torch.linalg.vector_norm(h, dim=-1, keepdim=True)


class AttentionWithMaskedQuery(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 8, dtype=torch.float64))

    def forward(self, x, mask):
        h = x @ self.w
        return F.scaled_dot_product_attention(h, h, h, attn_mask=mask)


class LogNdtrRightOfOne(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.linspace(-40.0, 40.0, 12, dtype=torch.float64))

    def forward(self, x):
        return torch.special.log_ndtr(self.w * x)


def _cases():
    torch.manual_seed(0)
    mask = torch.ones(5, 5, dtype=torch.bool).tril()
    mask[0] = False  # the first query sees no key
    return {
        "normalize_zero_row": (NormalizedWithZeroRow(), (torch.randn(5, 4, dtype=torch.float64),)),
        "sdpa_fully_masked_query": (AttentionWithMaskedQuery(), (torch.randn(1, 2, 5, 4, dtype=torch.float64), mask)),
        "log_ndtr_right_of_one": (LogNdtrRightOfOne(), (torch.ones(12, dtype=torch.float64),)),
    }


def _loss(out):
    return (out * torch.linspace(0.5, 1.5, out.numel(), dtype=out.dtype).reshape(out.shape)).sum()


def _eager_grad(model, args):
    model = copy.deepcopy(model)
    _loss(model(*args)).backward()
    assert model.w.grad.isfinite().all()  # the point is singular for the decomposition, not for eager
    return model.w.grad


@pytest.mark.parametrize("name", sorted(_cases()))
def test_exported_program_trains_as_eager(name):
    model, args = _cases()[name]
    expected = _eager_grad(model, args)
    program = pf.export(copy.deepcopy(model), args, target=CORE).module()
    _loss(program(*args)).backward()
    torch.testing.assert_close(dict(program.named_parameters())["w"].grad, expected)


@pytest.mark.parametrize("name", sorted(_cases()))
def test_joint_program_equals_eager(name):
    model, args = _cases()[name]
    ep = pf.export_joint(model, args, loss_fn=_loss, target=CORE)
    report = pf.verify_joint(ep, model, args, loss_fn=_loss, calls=2, target=CORE)
    assert report.ok, report.problems


@pytest.mark.parametrize("name", sorted(_cases()))
def test_eager_session_equals_eager(name):
    model, args = _cases()[name]
    expected = _eager_grad(model, args)
    model = copy.deepcopy(model)
    with pf.eager.on(CORE):
        _loss(model(*args)).backward()
    torch.testing.assert_close(model.w.grad, expected)
