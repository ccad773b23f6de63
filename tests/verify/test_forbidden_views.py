# ruff: noqa: F841 (the fuzz run's program as generated, unused values included)
"""An output eager forbids autograd through: a view made under no_grad whose base was then
written in place. Eager's ``requires_grad`` says True, reading its ``grad_fn`` raises, and
any backward through it raises; ``pf.verify`` does not compare its flag (found by the
5,000-program fuzz run), and still compares every other output's."""

import torch

import predispatch_func as pf


class ViewThenBaseWritten(torch.nn.Module):
    """The fuzz run's program, as it was generated."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.w = torch.nn.Parameter(torch.randn(1, generator=g))

    def forward(self, x0):
        v0 = self.w * 1.5
        v0.mul_(1.5)
        with torch.no_grad():
            v1 = v0[..., :1]
        v2 = v1 * 2.0
        x0.zero_()
        v3 = x0.sin()
        v4 = x0.sin()
        v5 = x0.sin()
        with torch.no_grad():
            v6 = x0.sin()
            x0.zero_()
            v7 = x0.sin()
            v8 = x0.sin()
            v0.masked_fill_(x0 > 0, 0.5)
            self.w += 0.5
            v9 = v1.sin()
            v10 = x0.sin()
            v11 = x0.data
        return (v1, v2,)


def test_the_forbidden_view_is_not_compared_and_the_rest_is():
    model, x = ViewThenBaseWritten(), torch.randn(1, generator=torch.Generator().manual_seed(0))
    eager = ViewThenBaseWritten()(x.clone())
    try:
        eager[0].grad_fn  # noqa: B018
        raise AssertionError("eager let autograd through the view: the premise of this test changed")
    except RuntimeError as exc:
        assert "no_grad mode" in str(exc)
    ep = pf.export(model, (x,))
    report = pf.verify(ep, model, (x,))
    assert report.ok, report.problems
    assert any("requires_grad not compared" in c for c in report.checked), report.checked
