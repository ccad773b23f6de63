"""The backward's in-place writes to its own temporaries become functional, and only those.

Graphs written by hand in the shapes the engine and C++ kernels record (the CUDA ones
were met on the H200: xglm's ``masked_fill_``, convnext's ``new_zeros`` + ``as_strided``
+ ``copy_``), run before and after the rewrite on the same tensors.
"""

import operator

import pytest
import torch
from torch.fx import Graph, GraphModule
from torch.fx.passes.shape_prop import ShapeProp

import predispatch_func as pf
from predispatch_func.joint.temporary_writes import functional_writes

aten = torch.ops.aten


def _run(graph: Graph, *inputs):
    return GraphModule(torch.nn.Module(), graph)(*(t.clone() for t in inputs))


def _mutable(graph: Graph) -> list[str]:
    return [str(n.target) for n in graph.nodes
            if n.op == "call_function" and getattr(getattr(n.target, "_schema", None), "is_mutable", False)]


def _rewritten(build, *inputs):
    before = _run(build(), *inputs)
    graph = build()
    functional_writes(graph)
    after = _run(graph, *inputs)
    for b, a in zip(before, after):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    return graph


def test_masked_fill_of_a_fresh_gradient():
    def build():
        g = Graph()
        x, m = g.placeholder("x"), g.placeholder("m")
        fresh = g.call_function(aten.mul.Tensor, (x, x))
        filled = g.call_function(aten.masked_fill_.Scalar, (fresh, m, 0.0))
        read_after = g.call_function(aten.add.Tensor, (fresh, x))
        g.output((filled, read_after))
        return g
    graph = _rewritten(build, torch.randn(4, 4), torch.rand(4, 4) > 0.5)
    assert _mutable(graph) == []


@pytest.mark.parametrize("window", [([2, 3], [3, 1], 2), ([], [], 6)], ids=["2d", "0d"])
@pytest.mark.parametrize("target", [None, "core_aten"])
def test_copy_into_a_strided_window_of_a_fresh_buffer(target, window):
    """Under a target without ``as_strided_scatter`` (Core ATen), an ``index_put`` at the window's
    flat positions. A 0-d window is what ``as_strided`` to one element leaves (fuzz.py)."""
    size, stride, offset = window

    def build():
        g = Graph()
        src = g.placeholder("src")
        buffer = g.call_function(aten.new_zeros.default, (src, [12]))
        window = g.call_function(aten.as_strided.default, (buffer, size, stride, offset))
        g.call_function(aten.copy_.default, (window, src))
        read_back = g.call_function(aten.as_strided.default, (buffer, [2, 6], [6, 1], 0))  # a view, after
        g.output((g.call_function(aten.mul.Tensor, (buffer, 2.0)), read_back))
        return g
    src = torch.randn(size)
    graph = _with_values(build, src)  # the rewrite reads shapes from the values a trace records
    allows = pf.OpSet.core_aten().__contains__ if target else None
    functional_writes(graph, allows=allows)
    assert _mutable(graph) == []
    ops = {n.target for n in graph.nodes if n.op == "call_function"}
    assert (aten.as_strided_scatter.default in ops) == (target is None)
    if target:  # what the rewrite added
        added = ops - {n.target for n in build().nodes}
        assert added <= set(pf.OpSet.core_aten()), added - set(pf.OpSet.core_aten())
    got, read_back = _run(graph, src)
    expected = torch.zeros(12)
    expected.as_strided(size, stride, offset).copy_(src)
    torch.testing.assert_close(got, expected * 2, rtol=0, atol=0)
    torch.testing.assert_close(read_back, expected.view(2, 6), rtol=0, atol=0)


def _with_values(build, *inputs) -> Graph:
    """``build()`` with each node's ``meta["val"]`` filled by running it."""
    graph = build()
    gm = GraphModule(torch.nn.Module(), graph)
    ShapeProp(gm).propagate(*inputs)
    for node in graph.nodes:
        if hasattr(node.meta.get("tensor_meta"), "shape"):
            meta = node.meta["tensor_meta"]
            node.meta["val"] = torch.empty_strided(meta.shape, meta.stride, dtype=meta.dtype)
    return graph


def test_writes_that_reach_more_than_a_temporary_stay_for_the_contract_check():
    def build():
        g = Graph()
        x = g.placeholder("x")
        g.call_function(aten.add_.Scalar, (x, 1.0))  # an input: a mutation of the program's
        fresh = g.call_function(aten.mul.Tensor, (x, 2.0))
        halves = g.call_function(aten.split.Tensor, (fresh, 2))
        first = g.call_function(operator.getitem, (halves, 0))
        g.call_function(aten.mul_.Scalar, (first, 3.0))  # a view of fresh: fresh changes too
        viewed = g.call_function(aten.mul.Tensor, (x, 3.0))
        flat = g.call_function(aten.view.default, (viewed, [-1]))
        g.call_function(aten.sub_.Scalar, (viewed, 1.0))  # viewed is seen through flat
        g.output((fresh, flat))
        return g
    graph = _rewritten(build, torch.randn(4, 2))
    assert _mutable(graph) == ["aten.add_.Scalar", "aten.mul_.Scalar", "aten.sub_.Scalar"]
