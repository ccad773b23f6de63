"""Random writes through random user inputs that share memory (program/aliased_inputs.py),
exported and replayed against eager: outputs, the shared memory after the call, and the
gradient reaching the leaf it was made from. A bounded deterministic run in the default suite,
a longer one under ``fuzz_long``."""

import pytest
import torch
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st
from torch import nn

import predispatch_func as pf

_SETTINGS = dict(deadline=None, database=None, suppress_health_check=list(HealthCheck),
                 print_blob=True, phases=[Phase.explicit, Phase.generate, Phase.shrink])


@st.composite
def _layouts(draw):
    """A base length and 2-3 members, each a slice of the base (start, stop, step), maybe viewed 2-D."""
    n = draw(st.integers(4, 12))
    members = []
    for _ in range(draw(st.integers(2, 3))):
        start = draw(st.integers(0, n - 1))
        stop = draw(st.integers(start + 1, n))
        step = draw(st.integers(1, 3))
        length = len(range(start, stop, step))
        rows = draw(st.sampled_from([1] + [r for r in (2, 3) if length % r == 0 and length > r]))
        members.append((start, stop, step, rows))
    return n, tuple(members)


def _make(base, members):
    out = []
    for start, stop, step, rows in members:
        m = base[start:stop:step]
        out.append(m.view(rows, -1) if rows > 1 else m)
    return out


_OPS = ("add_", "mul_", "fill_first", "neg_", "read")


class Writes(nn.Module):
    def __init__(self, ops):
        super().__init__()
        self.ops = ops

    def forward(self, *members):
        reads = []
        for k, op, c in self.ops:
            m = members[k % len(members)]
            if op == "add_":
                m.add_(c)
            elif op == "mul_":
                m.mul_(c)
            elif op == "fill_first":
                m.reshape(-1)[:1].fill_(c) if m.is_contiguous() else m[:1].fill_(c)
            elif op == "neg_":
                m.neg_()
            else:
                reads.append(m.sum() * c)
        return tuple(m * (i + 1) for i, m in enumerate(members)) + tuple(reads)


_op = st.tuples(st.integers(0, 2), st.sampled_from(_OPS), st.sampled_from([0.5, 2.0, -1.0]))


def _check(layout, ops):
    n, members = layout
    assume(any(op != "read" for _, op, _ in ops))
    model = Writes(ops)
    seed = torch.randn(n, dtype=torch.float64)
    try:  # eager's own refusals (a write whose source overlaps it) are not ours to judge
        model(*_make(seed.clone(), members))
    except RuntimeError:
        assume(False)
    try:
        ep = pf.export(model, tuple(_make(seed.clone().requires_grad_().clone(), members)))
    except pf.UnsupportedError as e:
        assume(e.kind is not pf.Refusal.WRITE_TO_ALIASED_INPUTS)  # a layout no base can read
        raise
    results = []
    for fn in (model, ep.module()):
        leaf = seed.clone().requires_grad_()
        memory = leaf.clone()
        outs = fn(*_make(memory, members))
        sum((o * (k + 1)).sum() for k, o in enumerate(outs)).backward()
        results.append(([o.detach() for o in outs], memory.detach(), leaf.grad))
    torch.testing.assert_close(results[1], results[0])


@settings(max_examples=25, derandomize=True, **_SETTINGS)
@given(_layouts(), st.lists(_op, min_size=1, max_size=4))
def test_random_writes_through_aliased_inputs_match_eager(layout, ops):
    _check(layout, ops)


@pytest.mark.fuzz_long
@settings(max_examples=400, derandomize=True, **_SETTINGS)
@given(_layouts(), st.lists(_op, min_size=1, max_size=6))
def test_random_writes_through_aliased_inputs_match_eager_long(layout, ops):
    _check(layout, ops)
