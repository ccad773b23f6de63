"""One op writing two of its arguments: one tensor passed as both is refused (OVERLAPPING_WRITES:
eager's second write lands on the first), disjoint views of one tensor export.

Found by the conformance runner (scripts/conformance.py), judged as it judges (tests/support/conformance_judge.py).
"""

from __future__ import annotations

import os

import pytest
import torch

from tests.support.conformance_judge import assert_ok


class StatsTwice(torch.nn.Module):
    def forward(self, x, stats):
        return torch.batch_norm(x, None, None, stats, stats, True, 0.1, 1e-5, False)


class StatsRows(torch.nn.Module):
    def forward(self, x, stats):
        return torch.batch_norm(x, None, None, stats[0], stats[1], True, 0.1, 1e-5, False)


def test_one_tensor_as_two_written_arguments_is_refused():
    """Eager updates ``stats`` as the mean, then as the variance on top; a functional
    program would compute both from the old value (was silently wrong)."""
    import predispatch_func as pf

    with pytest.raises(pf.UnsupportedError, match="two arguments the op writes") as info:
        pf.export(StatsTwice(), (torch.randn(4, 3), torch.ones(3)))
    assert "batch_norm" in str(info.value) and os.path.basename(__file__) in str(info.value)
    assert info.value.kind is pf.Refusal.OVERLAPPING_WRITES


def test_disjoint_views_as_two_written_arguments_export():
    assert_ok(StatsRows(), (torch.randn(4, 3), torch.ones(2, 3)))
