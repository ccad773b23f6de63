"""The trace-time keep-or-decompose guard runs a composite on fresh fakes: composites that read
data (``item``, a tensor of indices) must neither crash it nor leave an unbacked symbol pending,
also with its process-wide and disk caches cold.

Found by the conformance runner (scripts/conformance.py), judged as it judges (tests/support/conformance_judge.py).
"""

from __future__ import annotations

import torch

from tests.conformance.case import Call
from tests.support.conformance_judge import assert_ok


class ScaleByMax(torch.nn.Module):
    def forward(self, x):
        return x * x.max().item()


def test_item_exports_with_a_cold_composite_guard_cache(monkeypatch):
    """The trace-time composite guard ran ``item`` on fresh fakes and left an
    unbacked symbol pending (``PendingUnbackedSymbolNotFound``); its process-wide
    cache (and the disk cache behind it) hid that after the first export, so start cold."""
    from predispatch_func.trace import composite_policy

    monkeypatch.setenv("PREDISPATCH_FUNC_CACHE", "")
    composite_policy._STATIC_GUARDS.forget()
    try:
        assert_ok(ScaleByMax(), (torch.randn(3, 4),))
    finally:
        composite_policy._STATIC_GUARDS.forget()


def test_tensor_split_with_a_tensor_of_indices():
    """Eager's C++ composite reads the indices' data, so the keep-or-decompose
    guard crashed running it on fakes; torch's Python composite traces."""
    model = Call(torch.tensor_split, (torch.randn(6, 2), torch.tensor([1, 4])), {})
    assert_ok(model, (torch.randn(6, 2), torch.tensor([1, 4])))
