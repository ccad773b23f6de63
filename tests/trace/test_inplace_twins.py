"""In-place ops that run as their functional twin plus a write: one without a functionalization
kernel (``polygamma_``, whose functional form orders its arguments otherwise) and one whose
decomposition's gradient is wrong (``rrelu_``).

Found by the conformance runner (scripts/conformance.py), judged as it judges (tests/support/conformance_judge.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tests.support.conformance_judge import assert_ok


class Polygamma(torch.nn.Module):
    def forward(self, x):
        x[0].polygamma_(1)
        return x.polygamma_(0) * 2


def test_inplace_op_without_a_functionalization_kernel():
    """``polygamma_(self, n)`` has no functionalization kernel (its functional form
    orders the arguments ``(n, self)``); it runs as ``polygamma`` plus a write."""
    assert_ok(Polygamma(), (torch.rand(3, 4) + 0.5,))


class RReLUInPlace(torch.nn.Module):
    def forward(self, x):
        return F.rrelu(x, 0.0, 1.0, training=True, inplace=True) * 2


def test_inplace_composite_runs_as_its_functional_twin():
    """``rrelu_`` decomposed to ``rrelu_with_noise_functional``, whose gradient read the
    noise before it was filled (silently wrong gradients); ``rrelu`` is right."""
    assert_ok(RReLUInPlace(), (torch.randn(3, 4),))
