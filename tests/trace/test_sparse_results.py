"""Sparse results: exported and replayed (the composite guard must not read their storage, the
reference replay compares them as sparse); a write into one, which eager makes through its values
into the dense tensor, is refused (WRITE_TO_SPARSE).

Found by the conformance runner (scripts/conformance.py), judged as it judges (tests/support/conformance_judge.py).
"""

from __future__ import annotations

import os

import pytest
import torch

from tests.support.conformance_judge import assert_ok
from tests.trace.test_out_variants import Calls


class WriteSparseGrad(torch.nn.Module):
    def forward(self, g, index):
        r = torch.ops.aten.gather_backward(g, g, 0, index, True)  # values view g in eager
        r.mul_(3)
        return r.to_dense()


def test_write_to_a_sparse_result_is_refused():
    """Eager's write reaches ``g`` through the sparse result's values; a functional
    program would drop it (torch.export keeps the op and drops it too)."""
    import predispatch_func as pf

    with pytest.raises(pf.UnsupportedError, match="sparse tensor") as info:
        pf.export(WriteSparseGrad(), (torch.randn(2, 3), torch.zeros(2, 3, dtype=torch.long)))
    assert info.value.kind is pf.Refusal.WRITE_TO_SPARSE and os.path.basename(__file__) in str(info.value)


@pytest.mark.parametrize("fn", [lambda x: x.to_sparse(), lambda x: x.to_sparse(1)], ids=["default", "sparse_dim"])
def test_sparse_result_exports_and_replays(fn):
    """The trace-time composite guard read the storage of a sparse result (crashed), and
    the reference replay compared sparse outputs with allclose (raised for both exporters)."""
    assert_ok(Calls(fn), (torch.randn(3, 4),))
