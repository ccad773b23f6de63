"""Small models (an MLP, a transformer block) whose programs keep the composites and whose
gradients must match eager's."""

from expecttest import TestCase

import predispatch_func as pf
from tests.support.cases_core import build
from tests.support.reference import call_targets, export_case, graph_code


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
