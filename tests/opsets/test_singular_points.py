"""Training under a target at the points where eager's derivative formula is deliberate.

A lowered forward op is differentiated as its decomposition (``export(..., target=)`` and
``export_joint(..., target=)`` lower above autograd). torch's decompositions of
``linalg_vector_norm``, ``_safe_softmax``, ``special_log_ndtr``, ``sinc``, ``xlogy`` and
``xlog1py`` have NaN gradients where eager's formulas give a value: a zero row through
``F.normalize``, attention with a query whose every key is masked (padding), ``log_ndtr`` right
of 1, ``sinc`` at 0, ``xlogy(0, 0)``; our decomposition of ``i1`` differentiated ``|x|`` (0 at 0
where I1' is 1/2). Each model here meets one such point; every path must give eager's gradients
(opsets/decompositions/singular_points.py). Found by probing every unary and binary ufunc OpInfo
at 0, ±1, ±2, ±3, ±6, ±20, 100 (values where eager's own gradient is infinite or NaN, at a
pole, are not compared: ours may be finite there).
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


class LogProductsWithZeros(torch.nn.Module):
    """``xlogy(p, q)`` (a cross term of a KL divergence) where ``p`` and ``q`` are both 0: eager's
    gradient in ``p`` is 0 there; torch's decomposition gave NaN."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor([0.0, 1.0, -900.0, 2.0], dtype=torch.float64))

    def forward(self, x):
        p = torch.softmax(self.w * x, -1)  # underflows to exactly 0 at -900
        q = torch.tensor([0.2, 0.3, 0.0, 0.5], dtype=torch.float64)
        return torch.xlogy(p, q) + torch.special.xlog1py(p, q - 1)


class SincAtZero(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor([0.0, 0.5, -1.5, 2.0], dtype=torch.float64))

    def forward(self, x):
        return torch.sinc(self.w * x)


class BesselI1AtZero(torch.nn.Module):
    """Our decomposition of I1 differentiated |x| (derivative 0 at 0; I1'(0) = 1/2)."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor([0.0, 0.5, -1.5, 45.0, -45.0], dtype=torch.float64))

    def forward(self, x):
        return torch.special.i1(self.w * x) + torch.special.i1e(self.w * x)


_MORE = {
    "log_products_with_zeros": lambda: (LogProductsWithZeros(), (torch.ones(3, 4, dtype=torch.float64),)),
    "sinc_at_zero": lambda: (SincAtZero(), (torch.ones(4, dtype=torch.float64),)),
    "bessel_i1_at_zero": lambda: (BesselI1AtZero(), (torch.ones(5, dtype=torch.float64),)),
}


@pytest.mark.parametrize("name", sorted(_MORE))
def test_more_singular_points_train_as_eager(name):
    model, args = _MORE[name]()
    expected = _eager_grad(model, args)
    program = pf.export(copy.deepcopy(model), args, target=CORE).module()
    _loss(program(*args)).backward()
    torch.testing.assert_close(dict(program.named_parameters())["w"].grad, expected)
    ep = pf.export_joint(model, args, loss_fn=_loss, target=CORE)
    report = pf.verify_joint(ep, model, args, loss_fn=_loss, calls=2, target=CORE)
    assert report.ok, report.problems


@pytest.mark.parametrize("call", [
    lambda t: torch.xlogy(2.0, t), lambda t: torch.xlogy(t, 3.0), lambda t: torch.special.xlogy(t, t.abs() + 0.25),
    lambda t: torch.special.xlogy(0.5, t), lambda t: torch.special.xlogy(t, 0.5),
    lambda t: torch.special.xlog1py(t, t.abs() - 0.75), lambda t: torch.special.xlog1py(1.5, t),
    lambda t: torch.special.xlog1py(t, 2.0), lambda t: torch.special.sinc(t),
], ids=["xlogy_scalar_self", "xlogy_scalar_other", "special_xlogy", "special_xlogy_self_scalar",
        "special_xlogy_other_scalar", "special_xlog1py", "special_xlog1py_self_scalar",
        "special_xlog1py_other_scalar", "special_sinc"])
def test_scalar_and_special_spellings(call):
    """Each spelling the decompositions are registered for: values and gradients equal eager's,
    zeros and a pole included."""
    base = torch.tensor([0.0, 0.5, -1.0, 2.0, 0.0], dtype=torch.float64)

    class Call(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(base.clone())

        def forward(self, x):
            return call(self.w * x)

    model, args = Call(), (torch.ones(5, dtype=torch.float64),)
    expected_grad = copy.deepcopy(model)
    out = expected_grad(*args)
    _loss(out).backward()
    program = pf.export(copy.deepcopy(model), args, target=CORE).module()
    got = program(*args)
    torch.testing.assert_close(got, out.detach(), equal_nan=True)
    _loss(got).backward()
    torch.testing.assert_close(dict(program.named_parameters())["w"].grad, expected_grad.w.grad, equal_nan=True)


class ZeroTensorGradients(torch.nn.Module):
    """``x.zero_()`` and ``copysign(x, y)`` in ``y``: eager's gradient is a zero tensor, which an
    optimizer steps (weight decay, momentum) where it skips a None."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor([0.5, -1.5, 2.0], dtype=torch.float64))
        self.v = torch.nn.Parameter(torch.tensor([1.0, -2.0, 0.0], dtype=torch.float64))

    def forward(self, x):
        return torch.copysign(self.w * x, self.v) + (self.v * 1.0).zero_()


def test_zero_gradients_stay_tensors():
    model, args = ZeroTensorGradients(), (torch.ones(3, dtype=torch.float64),)
    eager = copy.deepcopy(model)
    _loss(eager(*args)).backward()
    assert eager.v.grad is not None and not eager.v.grad.any()
    program = pf.export(copy.deepcopy(model), args, target=CORE).module()
    _loss(program(*args)).backward()
    grads = {n: p.grad for n, p in program.named_parameters()}
    assert grads["v"] is not None
    torch.testing.assert_close(grads["v"], eager.v.grad)
    torch.testing.assert_close(grads["w"], eager.w.grad)
    ep = pf.export_joint(model, args, loss_fn=_loss, target=CORE)
    report = pf.verify_joint(ep, model, args, loss_fn=_loss, calls=2, target=CORE)
    assert report.ok, report.problems


def _safe_softmax_inputs():
    inf, nan = float("inf"), float("nan")
    rows = torch.tensor([[0.5, -1.0, 2.0, 0.0], [-inf, -inf, -inf, -inf], [nan, -inf, -inf, -inf],
                         [inf, -inf, 1.0, 0.0], [-inf, 3.0, -inf, -inf]], dtype=torch.float64)
    return [
        (rows, -1, None), (rows.t().contiguous(), 0, None), (rows.reshape(1, 5, 4), 2, None),
        (rows.to(torch.float16), -1, torch.float32), (rows.to(torch.float32), 1, torch.float64),
        (torch.randn(3, 0, 2, dtype=torch.float64), 1, None), (torch.randn(3, 0, dtype=torch.float64), 0, None),
        (torch.tensor(-inf, dtype=torch.float64), 0, None), (torch.tensor(0.25, dtype=torch.float64), -1, None),
    ]


@pytest.mark.parametrize("case", range(len(_safe_softmax_inputs())))
def test_safe_softmax_decomposition_gives_eagers_values_and_gradients(case):
    """Our ``_safe_softmax`` finds a fully masked row by its maximum (``-inf``) where torch's
    compares every element: the same rows, NaN rows included (their maximum is NaN, as their
    ``all(x == -inf)`` is false), an empty row, a 0-dim input, another result dtype."""
    from predispatch_func.opsets.decompositions.singular_points import safe_softmax

    x, dim, dtype = _safe_softmax_inputs()[case]
    expected = torch.ops.aten._safe_softmax.default(x, dim, dtype)
    got = safe_softmax(x, dim, dtype)
    torch.testing.assert_close(got, expected, equal_nan=True)
    if x.dtype == torch.float64 and x.numel():
        weights = torch.linspace(0.5, 1.5, expected.numel(), dtype=expected.dtype).reshape(expected.shape)
        grads = []
        for fn in (lambda t: torch.ops.aten._safe_softmax.default(t, dim, dtype), lambda t: safe_softmax(t, dim, dtype)):
            leaf = x.clone().requires_grad_()
            (fn(leaf).nan_to_num(0.0) * weights).sum().backward()
            grads.append(leaf.grad)
        torch.testing.assert_close(grads[1], grads[0], equal_nan=True)
