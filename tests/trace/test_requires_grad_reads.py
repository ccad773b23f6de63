"""``requires_grad`` read by the model's Python code while tracing is what eager reads: autograd
does not run during the trace, so traced intermediates would say ``False`` and code branching on
it would take the branch eager does not (silently wrong gradients).

Found by the conformance runner (scripts/conformance.py), judged as it judges (tests/support/conformance_judge.py).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.conformance.case import Call
from tests.support.conformance_judge import assert_ok


class BranchesOnRequiresGrad(torch.nn.Module):
    def forward(self, x, w):
        y = x.unsqueeze(0) * 2
        z = y.sin() if y.requires_grad else y.cos()  # eager: sin when x requires grad
        with torch.no_grad():
            n = (x * 2).requires_grad  # False in eager
        d = w.detach().requires_grad  # False in eager
        return z * (3.0 if n or d else 1.0) + (w @ x if (w @ x).requires_grad else 0.0)


def test_python_reads_requires_grad_of_intermediates_as_eager():
    """Autograd does not run while tracing; traced intermediates reported
    ``requires_grad=False``, so code branching on it took the branch eager does
    not (``linear_cross_entropy`` baked ``compute_input_grad=False``: silently
    wrong input gradients)."""
    assert_ok(BranchesOnRequiresGrad(), (torch.randn(3, requires_grad=True), torch.randn(3, 3, requires_grad=True)))


@pytest.mark.skipif(not hasattr(F, "linear_cross_entropy"), reason="F.linear_cross_entropy is new in torch 2.13")
def test_linear_cross_entropy_on_an_intermediate_trains():
    x, w, t = torch.randn(3, requires_grad=True), torch.randn(4, 3, requires_grad=True), torch.tensor(1)
    model = Call(lambda x, w, t: F.linear_cross_entropy(x.unsqueeze(0), w, t.unsqueeze(0)), (x, w, t), {})
    assert_ok(model, (x, w, t))
