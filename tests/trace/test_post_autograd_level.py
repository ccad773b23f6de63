"""The post-autograd level (``pre_dispatch=False``) on a few catalogue cases, so a user can
compare the two levels: composites are gone, mutations still in the signature."""

from expecttest import TestCase

from tests.support.reference import call_targets, export_case, graph_code, mutations


class TestPostAutogradLevel(TestCase):
    """Same contract one level lower: composites are gone, mutations still in the signature."""

    def test_mlp_two_layers_post_autograd(self):
        ep = export_case("mlp_two_layers", pre_dispatch=False)
        self.assertNotIn("aten.linear.default", call_targets(ep))
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, p__0_weight, p__0_bias, p__2_weight, p__2_bias, input_1):
    t = torch.ops.aten.t.default(p__0_weight);  p__0_weight = None
    addmm = torch.ops.aten.addmm.default(p__0_bias, input_1, t);  p__0_bias = input_1 = t = None
    relu = torch.ops.aten.relu.default(addmm);  addmm = None
    t_1 = torch.ops.aten.t.default(p__2_weight);  p__2_weight = None
    addmm_1 = torch.ops.aten.addmm.default(p__2_bias, relu, t_1);  p__2_bias = relu = t_1 = None
    return (addmm_1,)""")

    def test_batchnorm_train_post_autograd(self):
        ep = export_case("batchnorm_train", pre_dispatch=False)
        self.assertEqual([m[0] for m in mutations(ep)], ["BUFFER_MUTATION"] * 3)
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, p_weight, p_bias, b_running_mean, b_running_var, b_num_batches_tracked, input_1):
    add = torch.ops.aten.add.Tensor(b_num_batches_tracked, 1);  b_num_batches_tracked = None
    clone_default = torch.ops.aten.clone.default(b_running_mean);  b_running_mean = None
    clone_default_1 = torch.ops.aten.clone.default(b_running_var);  b_running_var = None
    _native_batch_norm_legit_functional = torch.ops.aten._native_batch_norm_legit_functional.default(input_1, p_weight, p_bias, clone_default, clone_default_1, True, 0.1, 1e-05);  input_1 = p_weight = p_bias = clone_default = clone_default_1 = None
    getitem = _native_batch_norm_legit_functional[0]
    getitem_3 = _native_batch_norm_legit_functional[3]
    getitem_4 = _native_batch_norm_legit_functional[4];  _native_batch_norm_legit_functional = None
    return (getitem_3, getitem_4, add, getitem)""")

    def test_type_as_then_inplace_post_autograd(self):
        ep = export_case("type_as_then_inplace", pre_dispatch=False)
        self.assertEqual(mutations(ep), [("USER_INPUT_MUTATION", "x")])
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, x, z):
    mul = torch.ops.aten.mul.Tensor(x, 3);  x = None
    add = torch.ops.aten.add.Tensor(mul, 1)
    return (mul, add)""")

    def test_mutation_through_diagonal_post_autograd(self):
        ep = export_case("mutation_through_diagonal", pre_dispatch=False)
        self.assertEqual(mutations(ep), [("USER_INPUT_MUTATION", "x")])
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, x):
    diagonal = torch.ops.aten.diagonal.default(x)
    fill = torch.ops.aten.fill.Scalar(diagonal, 0);  diagonal = None
    diagonal_scatter = torch.ops.aten.diagonal_scatter.default(x, fill);  x = fill = None
    exp = torch.ops.aten.exp.default(diagonal_scatter)
    return (diagonal_scatter, exp)""")

    def test_einsum_transpose_then_inplace_post_autograd(self):
        ep = export_case("einsum_transpose_then_inplace", pre_dispatch=False)
        self.assertEqual(mutations(ep), [("USER_INPUT_MUTATION", "x")])
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, x):
    permute = torch.ops.aten.permute.default(x, [1, 0]);  x = None
    add = torch.ops.aten.add.Tensor(permute, 1);  permute = None
    permute_1 = torch.ops.aten.permute.default(add, [1, 0]);  add = None
    permute_2 = torch.ops.aten.permute.default(permute_1, [1, 0])
    mul = torch.ops.aten.mul.Tensor(permute_2, 2);  permute_2 = None
    return (permute_1, mul)""")
