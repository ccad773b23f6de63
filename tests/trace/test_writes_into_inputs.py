"""In-place writes into user inputs, directly, through aliases made in forward, and by index:
each write reaches the input, is a ``USER_INPUT_MUTATION`` in the signature and is written back.

Each test exports one catalogue case (tests/support/cases_core.py) through
``export_checked`` (contract + replay against the reference + caller untouched) and
snapshots the graph.
"""

from expecttest import TestCase

from tests.support.reference import export_case, graph_code, mutations
from tests.support.torch_release import torch_release


class TestInplaceOnInputs(TestCase):
    def test_inplace_add_on_input(self):
        ep = export_case("inplace_add_on_input")
        self.assertEqual(mutations(ep), [("USER_INPUT_MUTATION", "x")])
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, x):
    add = torch.ops.aten.add.Tensor(x, 1);  x = None
    mul = torch.ops.aten.mul.Tensor(add, 2)
    return (add, mul)""")

    def test_inplace_on_two_inputs_in_order(self):
        ep = export_case("inplace_on_two_inputs_in_order")
        self.assertEqual(mutations(ep), [("USER_INPUT_MUTATION", "x"), ("USER_INPUT_MUTATION", "y")])
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, x, y):
    mul = torch.ops.aten.mul.Tensor(x, 2);  x = None
    sub = torch.ops.aten.sub.Tensor(y, mul);  y = None
    add = torch.ops.aten.add.Tensor(mul, sub)
    return (mul, sub, add)""")

    def test_inplace_on_integer_input(self):
        ep = export_case("inplace_on_integer_input")
        self.assertEqual(mutations(ep), [("USER_INPUT_MUTATION", "steps")])
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, x, steps):
    add = torch.ops.aten.add.Tensor(steps, 1);  steps = None
    mul = torch.ops.aten.mul.Tensor(x, add);  x = None
    return (add, mul)""")

    def test_input_read_before_mutation(self):
        ep = export_case("input_read_before_mutation")
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, p_w, x):
    add = torch.ops.aten.add.Tensor(x, p_w)
    mul = torch.ops.aten.mul.Tensor(x, 3);  x = None
    mul_1 = torch.ops.aten.mul.Tensor(mul, p_w);  p_w = None
    return (mul, add, mul_1)""")

    def test_relu_inplace_on_input(self):
        ep = export_case("relu_inplace_on_input")
        self.assertEqual(mutations(ep), [("USER_INPUT_MUTATION", "x")])
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, x):
    relu = torch.ops.aten.relu.default(x);  x = None
    sum_1 = torch.ops.aten.sum.default(relu)
    return (relu, sum_1)""")

    def test_out_argument_into_input(self):
        ep = export_case("out_argument_into_input")
        self.assertEqual(mutations(ep), [("USER_INPUT_MUTATION", "y")])
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, x, y):
    mul = torch.ops.aten.mul.Tensor(x, 3)
    add = torch.ops.aten.add.Tensor(mul, x);  x = None
    return (mul, add)""")


class TestAliasesOfInputs(TestCase):
    def test_two_aliases_of_one_input_both_mutated(self):
        ep = export_case("two_aliases_of_one_input_both_mutated")
        self.assertEqual(mutations(ep), [("USER_INPUT_MUTATION", "x")])
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, x):
    view = torch.ops.aten.view.default(x, [2, 3]);  x = None
    add = torch.ops.aten.add.Tensor(view, 1);  view = None
    view_1 = torch.ops.aten.view.default(add, [6]);  add = None
    slice_2 = torch.ops.aten.slice.Tensor(view_1, 0, 1, 9223372036854775807)
    mul = torch.ops.aten.mul.Tensor(slice_2, 2);  slice_2 = None
    slice_scatter = torch.ops.aten.slice_scatter.default(view_1, mul, 0, 1, 9223372036854775807);  view_1 = mul = None
    slice_3 = torch.ops.aten.slice.Tensor(slice_scatter, 0, 1, 9223372036854775807)
    view_3 = torch.ops.aten.view.default(slice_scatter, [2, 3])
    sum_1 = torch.ops.aten.sum.default(view_3);  view_3 = None
    sum_2 = torch.ops.aten.sum.default(slice_3);  slice_3 = None
    add_1 = torch.ops.aten.add.Tensor(sum_1, sum_2);  sum_1 = sum_2 = None
    return (slice_scatter, add_1)""")

    def test_alias_mutated_other_alias_read_after(self):
        ep = export_case("alias_mutated_other_alias_read_after")
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, x):
    t = torch.ops.aten.t.default(x);  x = None
    mul = torch.ops.aten.mul.Tensor(t, 2);  t = None
    t_1 = torch.ops.aten.t.default(mul);  mul = None
    select_1 = torch.ops.aten.select.int(t_1, 0, 0)
    mul_1 = torch.ops.aten.mul.Tensor(select_1, 1);  select_1 = None
    return (t_1, mul_1)""")

    def test_overlapping_inputs_read_only(self):
        ep = export_case("overlapping_inputs_read_only")
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, x, y, z):
    slice_1 = torch.ops.aten.slice.Tensor(x, 0, 1, 9223372036854775807);  x = None
    mul = torch.ops.aten.mul.Tensor(slice_1, y);  slice_1 = y = None
    add = torch.ops.aten.add.Tensor(mul, z);  mul = z = None
    return (add,)""")


class TestIndexedWritesIntoInputs(TestCase):
    def test_index_put_into_input(self):
        ep = export_case("index_put_into_input")
        self.assertEqual(mutations(ep), [("USER_INPUT_MUTATION", "x")])
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, x, idx, v):
    index_put = torch.ops.aten.index_put.default(x, [idx], v, True);  x = idx = v = None
    mul = torch.ops.aten.mul.Tensor(index_put, 1)
    return (index_put, mul)""")

    def test_setitem_with_index_tensor_into_input(self):
        ep = export_case("setitem_with_index_tensor_into_input")
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, x, idx, v):
    index_put = torch.ops.aten.index_put.default(x, [idx], v);  x = idx = v = None
    sum_1 = torch.ops.aten.sum.dim_IntList(index_put, [-1])
    return (index_put, sum_1)""")

    def test_setitem_scalar_into_input_column(self):
        ep = export_case("setitem_scalar_into_input_column")
        self.assertEqual(mutations(ep), [("USER_INPUT_MUTATION", "x")])
        if torch_release() >= (2, 15):
            self.assertExpectedInline(graph_code(ep), """\
def forward(self, x):
    select = torch.ops.aten.select.int(x, 1, 1)
    fill = torch.ops.aten.fill.Scalar(select, 0.0);  select = None
    select_scatter = torch.ops.aten.select_scatter.default(x, fill, 1, 1);  x = fill = None
    sum_1 = torch.ops.aten.sum.dim_IntList(select_scatter, [0])
    return (select_scatter, sum_1)""")
        else:
            self.assertExpectedInline(graph_code(ep), """\
def forward(self, c_lifted_tensor_0, x):
    lift_fresh_copy = torch.ops.aten.lift_fresh_copy.default(c_lifted_tensor_0);  c_lifted_tensor_0 = None
    select = torch.ops.aten.select.int(x, 1, 1)
    fill = torch.ops.aten.fill.Tensor(select, lift_fresh_copy);  select = lift_fresh_copy = None
    select_scatter = torch.ops.aten.select_scatter.default(x, fill, 1, 1);  x = fill = None
    sum_1 = torch.ops.aten.sum.dim_IntList(select_scatter, [0])
    return (select_scatter, sum_1)""")

    def test_index_add_into_input(self):
        ep = export_case("index_add_into_input")
        self.assertEqual(mutations(ep), [("USER_INPUT_MUTATION", "x")])
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, x, idx, src):
    clone_default = torch.ops.aten.clone.default(x);  x = None
    index_add = torch.ops.aten.index_add.default(clone_default, 0, idx, src, alpha = 2);  clone_default = idx = src = None
    mean = torch.ops.aten.mean.default(index_add)
    return (index_add, mean)""")

    def test_scatter_into_input(self):
        ep = export_case("scatter_into_input")
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, x, idx, src):
    clone_default = torch.ops.aten.clone.default(x);  x = None
    scatter = torch.ops.aten.scatter.src(clone_default, 1, idx, src);  clone_default = idx = src = None
    relu = torch.ops.aten.relu.default(scatter)
    return (scatter, relu)""")

    def test_masked_assignment_into_input(self):
        ep = export_case("masked_assignment_into_input")
        if torch_release() >= (2, 15):
            self.assertExpectedInline(graph_code(ep), """\
def forward(self, x):
    lt = torch.ops.aten.lt.Scalar(x, 0)
    masked_fill = torch.ops.aten.masked_fill.Scalar(x, lt, 0.5);  x = lt = None
    gt = torch.ops.aten.gt.Scalar(masked_fill, 1)
    masked_fill_1 = torch.ops.aten.masked_fill.Scalar(masked_fill, gt, 1.0);  masked_fill = gt = None
    mul = torch.ops.aten.mul.Tensor(masked_fill_1, 3)
    return (masked_fill_1, mul)""")
        else:
            self.assertExpectedInline(graph_code(ep), """\
def forward(self, c_lifted_tensor_0, x):
    lt = torch.ops.aten.lt.Scalar(x, 0)
    lift_fresh_copy = torch.ops.aten.lift_fresh_copy.default(c_lifted_tensor_0);  c_lifted_tensor_0 = None
    index_put = torch.ops.aten.index_put.default(x, [lt], lift_fresh_copy);  x = lt = lift_fresh_copy = None
    gt = torch.ops.aten.gt.Scalar(index_put, 1)
    masked_fill = torch.ops.aten.masked_fill.Scalar(index_put, gt, 1.0);  index_put = gt = None
    mul = torch.ops.aten.mul.Tensor(masked_fill, 3)
    return (masked_fill, mul)""")

    def test_copy_into_input_slice(self):
        ep = export_case("copy_into_input_slice")
        self.assertEqual(mutations(ep), [("USER_INPUT_MUTATION", "x")])
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, x, y):
    clone = torch.ops.aten.clone.default(y);  y = None
    slice_scatter = torch.ops.aten.slice_scatter.default(x, clone, 0, 1, 3);  x = clone = None
    add = torch.ops.aten.add.Tensor(slice_scatter, 1)
    return (slice_scatter, add)""")
