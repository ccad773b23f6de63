"""In-place writes into intermediates (through views, next to parameters) and tensor constants
made in forward: functionalized into the values eager computes, constants lifted to inputs.

Catalogue cases (tests/support/cases_core.py) exported through ``export_checked`` and snapshotted.
"""

from expecttest import TestCase

from tests.support.reference import export_case, graph_code, mutations


class TestIntermediates(TestCase):
    def test_intermediate_mutated_through_view(self):
        ep = export_case("intermediate_mutated_through_view")
        self.assertEqual(mutations(ep), [])
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, x):
    mul = torch.ops.aten.mul.Tensor(x, 2);  x = None
    slice_1 = torch.ops.aten.slice.Tensor(mul, 0, 1, 9223372036854775807)
    add = torch.ops.aten.add.Tensor(slice_1, 10);  slice_1 = None
    slice_scatter = torch.ops.aten.slice_scatter.default(mul, add, 0, 1, 9223372036854775807);  mul = add = None
    return (slice_scatter,)""")

    def test_intermediate_mutated_through_transpose_with_param(self):
        ep = export_case("intermediate_mutated_through_transpose_with_param")
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, p_w, x):
    clone = torch.ops.aten.clone.default(x);  x = None
    t = torch.ops.aten.t.default(clone)
    select = torch.ops.aten.select.int(t, 0, 0);  t = None
    mul = torch.ops.aten.mul.Tensor(select, p_w);  select = p_w = None
    t_1 = torch.ops.aten.t.default(clone);  clone = None
    select_scatter = torch.ops.aten.select_scatter.default(t_1, mul, 0, 0);  t_1 = mul = None
    t_2 = torch.ops.aten.t.default(select_scatter);  select_scatter = None
    return (t_2,)""")

    def test_tensor_constant_created_in_forward(self):
        ep = export_case("tensor_constant_created_in_forward")
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, c_lifted_tensor_0, x):
    lift_fresh_copy = torch.ops.aten.lift_fresh_copy.default(c_lifted_tensor_0);  c_lifted_tensor_0 = None
    detach = torch.ops.aten.detach.default(lift_fresh_copy);  lift_fresh_copy = None
    mul = torch.ops.aten.mul.Tensor(x, detach);  x = detach = None
    return (mul,)""")

    def test_intermediate_view_taken_before_mutation(self):
        ep = export_case("intermediate_view_taken_before_mutation")
        self.assertEqual(mutations(ep), [])
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, x):
    mul = torch.ops.aten.mul.Tensor(x, 1);  x = None
    add = torch.ops.aten.add.Tensor(mul, 1);  mul = None
    t_1 = torch.ops.aten.t.default(add);  add = None
    return (t_1,)""")
