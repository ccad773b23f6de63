"""The per-signature kernel cache of ``pf.eager``: traced once, replayed, never the wrong branch."""

import torch

import predispatch_func as pf
from predispatch_func.eager import cache
from predispatch_func.eager.mode import kernels_for

aten = torch.ops.aten
CORE = pf.OpSet.core_aten()


def _graphs_of(op):
    return dict(kernels_for(CORE).graphs.get(id(op), {}))


def test_second_call_replays_the_traced_kernel():
    x = torch.randn(3, 4)
    with pf.eager.on(CORE) as session:
        first = torch.logit(x.sigmoid(), 1e-3)
        second = torch.logit(x.sigmoid(), 1e-3)
    assert torch.equal(first, second)
    assert session.stats.cache_hits[aten.logit.default] >= 1
    graph = next(iter(_graphs_of(aten.logit.default).values()))
    assert all(op in CORE for op in cache.ops_of(graph))


def test_scalar_argument_branch_is_never_replayed_for_another_value():
    # rot90's decomposition branches on k: flip+transpose, two flips, transpose+flip, clone
    x = torch.arange(12.0).reshape(3, 4)
    with pf.eager.on(CORE) as session:
        got = [torch.rot90(x, k) for k in (1, 2, 3, 4, 1, 2)]
    for k, value in zip((1, 2, 3, 4, 1, 2), got):
        assert torch.equal(value, torch.rot90(x, k)), k
    codes = {graph.code for graph in _graphs_of(aten.rot90.default).values()}
    assert len(codes) >= 4  # one kernel per branch, each replayed for its own k only
    assert session.stats.cache_hits[aten.rot90.default] >= 2


def test_size_branch_is_keyed_by_size():
    # roll bakes shift % size into its kernel: a kernel traced for size 5 is wrong for size 3
    with pf.eager.on(CORE):
        a = torch.roll(torch.arange(5.0), 4)
        b = torch.roll(torch.arange(3.0), 4)
    assert torch.equal(a, torch.roll(torch.arange(5.0), 4)) and torch.equal(b, torch.roll(torch.arange(3.0), 4))


def test_stride_and_float_value_are_part_of_the_key():
    x = torch.randn(4, 6)
    with pf.eager.on(CORE):
        for t in (x, x.t(), x[:, ::2]):
            for eps in (0.0, -0.0, 1e-3):
                torch.testing.assert_close(torch.logit(t.sigmoid(), eps), torch.logit(t.sigmoid(), eps))
    keys, _ = cache.signature((x,), {}), None
    assert cache.signature((x, 0.0), {})[0] != cache.signature((x, -0.0), {})[0]
    assert cache.signature((x.t(),), {})[0] != keys[0]


def test_one_tensor_passed_twice_is_its_own_signature():
    # traced with (a, a), the kernel has one input: replaying it for (a, b) would compare b with b
    a, b = torch.ones(3), torch.zeros(3)
    with pf.eager.on(CORE):
        same, different = torch.isclose(a, a), torch.isclose(a, b)
    assert same.all() and not different.any()


def test_data_dependent_decomposition_is_not_cached():
    a, b = torch.ones(3), torch.zeros(3)
    # observed: a keyed session leaves allclose to torch's composite kernel (no Python at all)
    with pf.eager.on(CORE, observe=True) as session:
        first, second = torch.allclose(a, a), torch.allclose(a, b)
    assert (first, second) == (True, False)
    assert session.stats.uncached[aten.allclose.default] == 2
    assert all(graph is cache.UNCACHEABLE for graph in _graphs_of(aten.allclose.default).values())


def test_random_decomposition_replays_draw_like_eager():
    x = torch.rand(32)
    torch.manual_seed(0)
    expected = [torch.bernoulli(x) for _ in range(3)] + [torch.rand_like(x) for _ in range(2)]
    torch.manual_seed(0)
    with pf.eager.on(CORE):
        got = [torch.bernoulli(x) for _ in range(3)] + [torch.rand_like(x) for _ in range(2)]
    for g, e in zip(got, expected):
        assert torch.equal(g, e)
