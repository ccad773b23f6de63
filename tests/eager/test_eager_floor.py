"""The runtime floor: each op of ``pf.eager.RUNTIME_FLOOR`` is needed, shown by taking it out.

With the op removed from the floor (and the target), a small eager program that
needs it has no way to run: the mode names the op (no path into the set, or a
lowering that leads back to the op itself), never a silently different result.
"""

import pytest
import torch

import predispatch_func as pf
from predispatch_func.eager.floor import WHY

CORE = pf.OpSet.core_aten()

def _write_through_view_as_real():
    c = torch.zeros(2, dtype=torch.complex64)
    torch.view_as_real(c)[:, 1].add_(1)  # eager: the write reaches c's imaginary parts
    return c


def _write_through_view_as_complex():
    pairs = torch.zeros(2, 2)
    torch.view_as_complex(pairs).mul_(1j).add_(1j)  # eager: the writes reach the real pairs
    return pairs


NEEDS = {
    "aten.copy_.default": lambda: torch.zeros(3).add_(1),
    "aten.resize_.default": lambda: torch.mul(torch.ones(2), 2, out=torch.empty(0)),
    "aten.as_strided_.default": lambda: torch.zeros(2, 3).transpose_(0, 1),
    "aten.empty.memory_format": lambda: torch.empty(3),
    "aten.empty_strided.default": lambda: torch.empty_strided((2, 2), (1, 2)),
    "aten.as_strided.default": lambda: torch.zeros(6).as_strided((2,), (2,)),
    "aten.view.default": lambda: torch.zeros(2, 3).view(6),
    "aten.view_as_real.default": _write_through_view_as_real,
    "aten.view_as_complex.default": _write_through_view_as_complex,
    "aten._local_scalar_dense.default": lambda: torch.ones(1).item(),
    "aten.set_.source_Storage": lambda: torch.zeros(0).set_(torch.ones(3).untyped_storage()),
    "aten.set_.source_Storage_storage_offset":
        lambda: torch.zeros(0).set_(torch.arange(6.0).untyped_storage(), 1, (2, 2), (1, 2)),
    "aten.uniform_.default": lambda: torch.zeros(3).uniform_(),
    "aten.normal_.default": lambda: torch.zeros(3).normal_(),
    # 0.3, not 0.5: a p with 1 - (1 - p) == p lowers to native_dropout's mask (Core ATen, the same
    # draws); any other stays a fill only the floor can draw
    "aten.bernoulli_.float": lambda: torch.zeros(3).bernoulli_(0.3),
    "aten.bernoulli_.Tensor": lambda: torch.zeros(3).bernoulli_(torch.full((3,), 0.5)),
    "aten.random_.default": lambda: torch.zeros(3).random_(),
    "aten.random_.from": lambda: torch.zeros(3).random_(1, 5),
    "aten.random_.to": lambda: torch.zeros(3).random_(5),
    "aten.exponential_.default": lambda: torch.zeros(3).exponential_(),
    "aten.geometric_.default": lambda: torch.zeros(3).geometric_(0.5),
    "aten.log_normal_.default": lambda: torch.zeros(3).log_normal_(),
    "aten.cauchy_.default": lambda: torch.zeros(3).cauchy_(),
}


def test_every_floor_op_has_a_reason_and_a_case():
    assert set(NEEDS) == set(WHY) == set(pf.eager.RUNTIME_FLOOR.names())


@pytest.mark.parametrize("name", sorted(NEEDS))
def test_floor_op_runs_with_the_floor(name):
    torch.manual_seed(0)
    expected = NEEDS[name]()
    torch.manual_seed(0)
    with pf.eager.on(CORE, observe=True) as session:  # observed: counts the floor op reaching the backend
        got = NEEDS[name]()
    if name.startswith("aten.empty"):  # uninitialised memory: only the layout is defined
        assert (got.shape, got.stride(), got.dtype) == (expected.shape, expected.stride(), expected.dtype)
    else:
        assert torch.equal(torch.as_tensor(got), torch.as_tensor(expected))
    assert name in session.stats.distinct_reached()


@pytest.mark.parametrize("name", sorted(NEEDS))
def test_floor_op_cannot_be_lowered_away(name):
    without = pf.eager.RUNTIME_FLOOR.difference(name)
    with pytest.raises(pf.eager.EagerUnreachableError) as info:
        with pf.eager.on(CORE.difference(name), floor=without):
            NEEDS[name]()
    assert info.value.kind is pf.Refusal.EAGER_OP_UNREACHABLE
