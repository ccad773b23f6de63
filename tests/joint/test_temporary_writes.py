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


@pytest.mark.parametrize("fake_strides", [None, (1, 4)], ids=["fake_as_run", "fake_other_strides"])
@pytest.mark.parametrize("transposed", [False, True], ids=["contiguous", "transposed"])
def test_a_window_is_written_back_whatever_the_layout(transposed, fake_strides):
    """irfft's backward writes a window of ``_fft_r2c``'s output, whose strides are not contiguous,
    and a fake value may record other strides than the kernel lays out (torch 2.11's ``_fft_r2c``:
    contiguous in the fake, not at run time). The window is written back by logical index
    (``slice_scatter`` for a ``narrow``): with the fake's strides in an ``as_strided_scatter`` the
    gradient of irfft was off by 4.5, silently."""
    def build():
        g = Graph()
        x = g.placeholder("x")
        doubled = g.call_function(aten.mul.Tensor, (x, 2.0))
        if transposed:  # a temporary that keeps a transposed layout
            doubled = g.call_function(aten.mul.Tensor, (g.call_function(aten.permute.default, (doubled, [1, 0])), 1.0))
        g.call_function(aten.mul_.Scalar, (g.call_function(aten.narrow.default, (doubled, 1, 1, 2)), 3.0))
        g.output((doubled,))
        return g
    x = torch.randn(4, 3) if not transposed else torch.randn(3, 4)
    before = _run(build(), x)
    graph = _with_values(build, x)
    fresh = graph.find_nodes(op="call_function", target=aten.mul.Tensor)[-1]
    assert fresh.meta["val"].is_contiguous() != transposed
    if fake_strides is not None:
        fresh.meta["val"] = torch.empty_strided((4, 3), fake_strides)  # what a fake kernel might have said
    functional_writes(graph)
    assert _mutable(graph) == []
    torch.testing.assert_close(_run(graph, x)[0], before[0], rtol=0, atol=0)


def test_a_write_into_a_reshape_stays_for_the_contract_check():
    """``reshape`` of a tensor no view can reshape copies it: a write into the copy leaves the
    temporary as it was, so it is not scattered back (eager's values), but left, and refused."""
    def build():
        g = Graph()
        x = g.placeholder("x")
        fresh = g.call_function(aten.permute.default, (g.call_function(aten.mul.Tensor, (x, 2.0)), [1, 0]))
        copy = g.call_function(aten.reshape.default, (g.call_function(aten.mul.Tensor, (fresh, 1.0)), [-1]))
        g.call_function(aten.mul_.Scalar, (copy, 3.0))
        g.output((fresh,))
        return g
    x = torch.randn(4, 3)
    graph = _with_values(build, x)
    functional_writes(graph)
    assert _mutable(graph) == ["aten.mul_.Scalar"]
