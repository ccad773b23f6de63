"""Writes through views of inputs and buffers: the write must reach the base. Where torch's
functionalization cannot replay a ``.view()`` after a write through a transpose, a clear refusal."""

import torch
from expecttest import TestCase

import predispatch_func as pf
from tests.support.expect_refusal import refused
from tests.support.reference import export_case, export_checked, graph_code, mutations
from tests.support.torch_release import torch_limit


class TestMutationThroughViews(TestCase):
    def test_mutation_through_index_view(self):
        ep = export_case("mutation_through_index_view")
        self.assertEqual(mutations(ep), [("USER_INPUT_MUTATION", "x")])
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, x):
    select = torch.ops.aten.select.int(x, 0, 0)
    mul = torch.ops.aten.mul.Tensor(select, 2);  select = None
    select_scatter = torch.ops.aten.select_scatter.default(x, mul, 0, 0);  x = mul = None
    add = torch.ops.aten.add.Tensor(select_scatter, 1)
    return (select_scatter, add)""")

    def test_inplace_view_op_then_shape_read(self):
        ep = export_case("inplace_view_op_then_shape_read")
        self.assertEqual(mutations(ep), [("USER_INPUT_MUTATION", "x")])
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, x):
    clone_default = torch.ops.aten.clone.default(x);  x = None
    t = torch.ops.aten.t.default(clone_default);  clone_default = None
    view = torch.ops.aten.view.default(t, [3, 2])
    mul = torch.ops.aten.mul.Tensor(view, 2);  view = None
    return (t, mul)""")

    def test_mutation_through_transpose(self):
        ep = export_case("mutation_through_transpose")
        self.assertEqual(mutations(ep), [("USER_INPUT_MUTATION", "x")])
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, x):
    transpose = torch.ops.aten.transpose.int(x, 0, 1)
    select = torch.ops.aten.select.int(transpose, 0, 1);  transpose = None
    add = torch.ops.aten.add.Tensor(select, 5);  select = None
    transpose_1 = torch.ops.aten.transpose.int(x, 0, 1);  x = None
    select_scatter = torch.ops.aten.select_scatter.default(transpose_1, add, 0, 1);  transpose_1 = add = None
    transpose_2 = torch.ops.aten.transpose.int(select_scatter, 0, 1);  select_scatter = None
    sum_1 = torch.ops.aten.sum.dim_IntList(transpose_2, [0])
    return (transpose_2, sum_1)""")

    def test_mutation_through_strided_slice(self):
        ep = export_case("mutation_through_strided_slice")
        self.assertEqual(mutations(ep), [("USER_INPUT_MUTATION", "x")])
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, x):
    slice_1 = torch.ops.aten.slice.Tensor(x, 1, 0, 9223372036854775807, 2)
    mul = torch.ops.aten.mul.Tensor(slice_1, -1);  slice_1 = None
    slice_scatter = torch.ops.aten.slice_scatter.default(x, mul, 1, 0, 9223372036854775807, 2);  x = mul = None
    clone = torch.ops.aten.clone.default(slice_scatter)
    return (slice_scatter, clone)""")

    def test_mutation_through_diagonal(self):
        ep = export_case("mutation_through_diagonal")
        self.assertEqual(mutations(ep), [("USER_INPUT_MUTATION", "x")])
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, x):
    diagonal = torch.ops.aten.diagonal.default(x)
    fill = torch.ops.aten.fill.Scalar(diagonal, 0);  diagonal = None
    diagonal_scatter = torch.ops.aten.diagonal_scatter.default(x, fill);  x = fill = None
    exp = torch.ops.aten.exp.default(diagonal_scatter)
    return (diagonal_scatter, exp)""")

    def test_mutation_through_view_of_view(self):
        ep = export_case("mutation_through_view_of_view")
        self.assertEqual(mutations(ep), [("USER_INPUT_MUTATION", "x")])
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, x):
    view = torch.ops.aten.view.default(x, [-1])
    slice_1 = torch.ops.aten.slice.Tensor(view, 0, 2, 5);  view = None
    zero = torch.ops.aten.zero.default(slice_1);  slice_1 = None
    view_1 = torch.ops.aten.view.default(x, [-1]);  x = None
    slice_scatter = torch.ops.aten.slice_scatter.default(view_1, zero, 0, 2, 5);  view_1 = zero = None
    view_2 = torch.ops.aten.view.default(slice_scatter, [2, 4]);  slice_scatter = None
    mul = torch.ops.aten.mul.Tensor(view_2, view_2)
    return (view_2, mul)""")

    def test_mutation_through_unsqueeze_and_expand_read(self):
        ep = export_case("mutation_through_unsqueeze_and_expand_read")
        self.assertEqual(mutations(ep), [("USER_INPUT_MUTATION", "x")])
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, x):
    unsqueeze = torch.ops.aten.unsqueeze.default(x, 0)
    select = torch.ops.aten.select.int(unsqueeze, 0, 0);  unsqueeze = None
    select_1 = torch.ops.aten.select.int(select, 0, 1);  select = None
    add = torch.ops.aten.add.Tensor(select_1, 1);  select_1 = None
    unsqueeze_1 = torch.ops.aten.unsqueeze.default(x, 0);  x = None
    select_2 = torch.ops.aten.select.int(unsqueeze_1, 0, 0)
    select_scatter = torch.ops.aten.select_scatter.default(select_2, add, 0, 1);  select_2 = add = None
    select_scatter_1 = torch.ops.aten.select_scatter.default(unsqueeze_1, select_scatter, 0, 0);  unsqueeze_1 = select_scatter = None
    squeeze = torch.ops.aten.squeeze.dim(select_scatter_1, 0);  select_scatter_1 = None
    unsqueeze_3 = torch.ops.aten.unsqueeze.default(squeeze, 0)
    expand_1 = torch.ops.aten.expand.default(unsqueeze_3, [2, 3]);  unsqueeze_3 = None
    sum_1 = torch.ops.aten.sum.dim_IntList(expand_1, [0]);  expand_1 = None
    return (squeeze, sum_1)""")


class ViewOfBufferWrittenThroughTranspose(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("buf", torch.randn(4, 1, 2))

    def forward(self, x):
        v = self.buf.view(2, 4)
        v.t().masked_fill_(x > 0, -2.0)
        return v, self.buf


class TestDetachAndViewReplays(TestCase):
    def test_view_replay_after_write_through_transpose_is_refused(self):
        with refused(pf.Refusal.VIEW_REPLAY_AFTER_STRIDED_WRITE, r"cannot replay a \.view\(\)[\s\S]*masked_fill_"):
            pf.export(ViewOfBufferWrittenThroughTranspose(), (torch.randn(4, 2),))

    @torch_limit("torch's functionalization replays the inverse of .view() with view on the "
                 "non-contiguous value written through the transpose (torch's own export and "
                 "aot_export_module fail the same way; VIEW_REPLAY_AFTER_STRIDED_WRITE)", raises=pf.UnsupportedError)
    def test_view_replay_after_write_through_transpose(self):
        export_checked(ViewOfBufferWrittenThroughTranspose(), (torch.randn(4, 2),))
