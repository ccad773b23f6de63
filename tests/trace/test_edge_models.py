"""Small models whose gradients must match eager, and the post-autograd level
(``pre_dispatch=False``) on a few cases, so a user can compare the two levels."""

from pathlib import Path

from expecttest import TestCase

import predispatch_func as pf
from tests.support.cases_core import CASES, build
from tests.support.reference import call_targets, export_case, graph_code, mutations


def _checked_gradients(name: str, ep) -> bool:
    """True when the replay of ``ep`` compared gradients (not only outputs)."""
    model, args, kwargs = build(name)
    report = pf.verify(ep, model, args, kwargs, raise_on_failure=True)
    return "gradients" in report.checked


class TestSmallModels(TestCase):
    def test_mlp_two_layers(self):
        ep = export_case("mlp_two_layers")
        self.assertTrue(_checked_gradients("mlp_two_layers", ep))
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, p__0_weight, p__0_bias, p__2_weight, p__2_bias, input_1):
    linear = torch.ops.aten.linear.default(input_1, p__0_weight, p__0_bias);  input_1 = p__0_weight = p__0_bias = None
    relu = torch.ops.aten.relu.default(linear);  linear = None
    linear_1 = torch.ops.aten.linear.default(relu, p__2_weight, p__2_bias);  relu = p__2_weight = p__2_bias = None
    return (linear_1,)""")

    def test_tiny_transformer_block(self):
        ep = export_case("tiny_transformer_block")
        self.assertTrue(_checked_gradients("tiny_transformer_block", ep))
        self.assertTrue({"aten.linear.default", "aten.layer_norm.default",
                         "aten.scaled_dot_product_attention.default"} <= call_targets(ep))
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, p_norm1_weight, p_norm1_bias, p_qkv_weight, p_qkv_bias, p_proj_weight, p_proj_bias, p_norm2_weight, p_norm2_bias, p_mlp_0_weight, p_mlp_0_bias, p_mlp_2_weight, p_mlp_2_bias, x):
    layer_norm = torch.ops.aten.layer_norm.default(x, [8], p_norm1_weight, p_norm1_bias);  p_norm1_weight = p_norm1_bias = None
    linear = torch.ops.aten.linear.default(layer_norm, p_qkv_weight, p_qkv_bias);  layer_norm = p_qkv_weight = p_qkv_bias = None
    split = torch.ops.aten.split.Tensor(linear, 8, -1);  linear = None
    getitem = split[0]
    getitem_1 = split[1]
    getitem_2 = split[2];  split = None
    view = torch.ops.aten.view.default(getitem, [2, 5, 2, 4]);  getitem = None
    transpose = torch.ops.aten.transpose.int(view, 1, 2);  view = None
    view_1 = torch.ops.aten.view.default(getitem_1, [2, 5, 2, 4]);  getitem_1 = None
    transpose_1 = torch.ops.aten.transpose.int(view_1, 1, 2);  view_1 = None
    view_2 = torch.ops.aten.view.default(getitem_2, [2, 5, 2, 4]);  getitem_2 = None
    transpose_2 = torch.ops.aten.transpose.int(view_2, 1, 2);  view_2 = None
    scaled_dot_product_attention = torch.ops.aten.scaled_dot_product_attention.default(transpose, transpose_1, transpose_2, None, 0.0, True);  transpose = transpose_1 = transpose_2 = None
    transpose_3 = torch.ops.aten.transpose.int(scaled_dot_product_attention, 1, 2);  scaled_dot_product_attention = None
    view_3 = torch.ops.aten.view.default(transpose_3, [2, 5, 8]);  transpose_3 = None
    linear_1 = torch.ops.aten.linear.default(view_3, p_proj_weight, p_proj_bias);  view_3 = p_proj_weight = p_proj_bias = None
    add = torch.ops.aten.add.Tensor(x, linear_1);  x = linear_1 = None
    layer_norm_1 = torch.ops.aten.layer_norm.default(add, [8], p_norm2_weight, p_norm2_bias);  p_norm2_weight = p_norm2_bias = None
    linear_2 = torch.ops.aten.linear.default(layer_norm_1, p_mlp_0_weight, p_mlp_0_bias);  layer_norm_1 = p_mlp_0_weight = p_mlp_0_bias = None
    gelu = torch.ops.aten.gelu.default(linear_2);  linear_2 = None
    linear_3 = torch.ops.aten.linear.default(gelu, p_mlp_2_weight, p_mlp_2_bias);  gelu = p_mlp_2_weight = p_mlp_2_bias = None
    add_1 = torch.ops.aten.add.Tensor(add, linear_3);  add = linear_3 = None
    return (add_1,)""")


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


class TestCatalogue(TestCase):
    def test_every_catalogue_case_is_exported_by_a_test(self):
        """scripts/compare_torch_paths.py reports on CASES; each must be pinned by a test."""
        text = "".join(p.read_text() for p in Path(__file__).parents[1].rglob("test_edge_*.py"))
        self.assertEqual([n for n in CASES if f'export_case("{n}"' not in text], [])
        self.assertGreaterEqual(len(CASES), 45)
