"""The backward's in-place writes to its own temporaries become functional, and only those.

Graphs written by hand in the shapes the engine and C++ kernels record (the CUDA ones
were met on the H200: xglm's ``masked_fill_``, convnext's ``new_zeros`` + ``as_strided``
+ ``copy_``), run before and after the rewrite on the same tensors.
"""

import operator

import pytest
import torch
from torch.fx import Graph, GraphModule

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
    """``build()`` with each node's ``meta["val"]`` filled by running it: the tensor each node
    returned, whose sizes, strides and storage offset the rewrite reads, as a trace's fakes."""
    graph = build()

    class Recorder(torch.fx.Interpreter):
        def run_node(self, node):
            result = super().run_node(node)
            if isinstance(result, torch.Tensor):
                node.meta["val"] = result
            return result

    Recorder(GraphModule(torch.nn.Module(), graph)).run(*(t.clone() for t in inputs))
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


def test_writes_through_views_of_a_temporary_are_scattered_into_it():
    """A write through a view (a diagonal, a split's half, a window of a strided temporary, an
    ``out=`` into rows) is scattered into its temporary; views taken before it and read after it
    read the written values; a write to an input stays (the program's own mutation)."""
    def build():
        g = Graph()
        x = g.placeholder("x")
        g.call_function(aten.add_.Scalar, (x, 1.0))  # an input: stays
        square = g.call_function(aten.mul.Tensor, (x, x))
        diagonal = g.call_function(aten.diagonal.default, (square, 0, -2, -1))
        g.call_function(aten.fill_.Scalar, (diagonal, 1.0))  # svd's backward: E.diagonal().fill_(1)
        halves = g.call_function(aten.split.Tensor, (square, 2))
        first = g.call_function(operator.getitem, (halves, 0))  # taken before the next write
        rows = g.call_function(aten.narrow.default, (square, 0, 2, 2))
        g.call_function(aten.mul_.Scalar, (rows, 3.0))  # irfft's backward: a narrow doubled
        buffer = g.call_function(aten.empty.memory_format, ([4, 4],), {"dtype": torch.float32})
        top = g.call_function(aten.narrow.default, (buffer, 0, 0, 2))
        g.call_function(aten.mm.out, (first, square), {"out": top})  # linear_cross_entropy: rows by mm(out=)
        g.call_function(aten.fill_.Scalar, (g.call_function(aten.narrow.default, (buffer, 0, 2, 2)), 0.5))
        g.output((square, first, buffer, diagonal))
        return g
    x = torch.randn(4, 4)
    before = _run(build(), x)
    graph = _with_values(build, x)
    functional_writes(graph)
    after = _run(graph, x)
    for b, a in zip(before, after):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert _mutable(graph) == ["aten.add_.Scalar"]


def test_a_strided_temporary_is_written_in_its_own_layout():
    """irfft's backward writes a window of ``_fft_r2c``'s output, whose strides are not contiguous."""
    def build():
        g = Graph()
        x = g.placeholder("x")
        t = g.call_function(aten.permute.default, (g.call_function(aten.mul.Tensor, (x, 2.0)), [1, 0]))
        fresh = g.call_function(aten.mul.Tensor, (t, 1.0))  # keeps t's (transposed) strides
        g.call_function(aten.mul_.Scalar, (g.call_function(aten.narrow.default, (fresh, 1, 1, 2)), 2.0))
        g.output((fresh,))
        return g
    x = torch.randn(4, 3)
    before = _run(build(), x)
    graph = _with_values(build, x)
    assert not graph.find_nodes(op="call_function", target=aten.mul.Tensor)[1].meta["val"].is_contiguous()
    functional_writes(graph)
    torch.testing.assert_close(_run(graph, x)[0], before[0], rtol=0, atol=0)
    assert _mutable(graph) == []


def test_the_write_back_does_not_read_strides_from_fake_values():
    """A fake value may record other strides than the kernel lays out (torch 2.11's ``_fft_r2c``:
    contiguous in the fake, not at run time): the window is scattered back by logical index
    (``slice_scatter`` for a ``narrow``), so the program is right whatever the layout. With the
    fake's strides in an ``as_strided_scatter`` the gradient of irfft was off by 4.5, silently."""
    def build():
        g = Graph()
        x = g.placeholder("x")
        fresh = g.call_function(aten.mul.Tensor, (x, 2.0))
        g.call_function(aten.mul_.Scalar, (g.call_function(aten.narrow.default, (fresh, 1, 1, 2)), 3.0))
        g.output((fresh,))
        return g
    x = torch.randn(4, 3)
    before = _run(build(), x)
    graph = _with_values(build, x)
    fresh = graph.find_nodes(op="call_function", target=aten.mul.Tensor)[0]
    fresh.meta["val"] = torch.empty_strided((4, 3), (1, 4))  # what a fake kernel might have said
    functional_writes(graph)
    assert _mutable(graph) == []
    torch.testing.assert_close(_run(graph, x)[0], before[0], rtol=0, atol=0)
