"""Catalogue cases exported with symbolic dimensions, then replayed at another size.

The program must hold for every size in range, not only the example's: each
test verifies against the reference at the example size (export_case) and at a
second size the trace never saw.
"""

import torch
from expecttest import TestCase
from torch.export import Dim

import predispatch_func as pf
from tests.support.cases_core import build
from tests.support.reference import export_case, graph_code, mutations
from tests.support.torch_release import torch_release


def _verify_at(ep, name: str, *shapes: tuple[int, ...]) -> None:
    model, _, kwargs = build(name)
    args = tuple(torch.randn(*s) for s in shapes)
    pf.verify(ep, model, args, kwargs, raise_on_failure=True)


class TestDynamicShapes(TestCase):
    def test_inplace_add_on_input_dynamic(self):
        ep = export_case("inplace_add_on_input", dynamic_shapes={"x": {0: Dim("n")}})
        _verify_at(ep, "inplace_add_on_input", (7,))
        self.assertEqual(mutations(ep), [("USER_INPUT_MUTATION", "x")])
        if torch_release() >= (2, 15):
            self.assertExpectedInline(graph_code(ep), """\
def forward(self, x):
    add_2 = torch.ops.aten.add.Tensor(x, 1);  x = None
    mul_1 = torch.ops.aten.mul.Tensor(add_2, 2)
    return (add_2, mul_1)""")
        else:
            self.assertExpectedInline(graph_code(ep), """\
def forward(self, x):
    add_4 = torch.ops.aten.add.Tensor(x, 1);  x = None
    mul_3 = torch.ops.aten.mul.Tensor(add_4, 2)
    return (add_4, mul_3)""")

    def test_mutation_through_index_view_dynamic(self):
        ep = export_case("mutation_through_index_view", dynamic_shapes={"x": {0: Dim("n"), 1: Dim("m")}})
        _verify_at(ep, "mutation_through_index_view", (5, 2))
        if torch_release() >= (2, 15):
            self.assertExpectedInline(graph_code(ep), """\
def forward(self, x):
    select = torch.ops.aten.select.int(x, 0, 0)
    mul_1 = torch.ops.aten.mul.Tensor(select, 2);  select = None
    select_scatter = torch.ops.aten.select_scatter.default(x, mul_1, 0, 0);  x = mul_1 = None
    add_2 = torch.ops.aten.add.Tensor(select_scatter, 1)
    return (select_scatter, add_2)""")
        else:
            self.assertExpectedInline(graph_code(ep), """\
def forward(self, x):
    select = torch.ops.aten.select.int(x, 0, 0)
    mul_4 = torch.ops.aten.mul.Tensor(select, 2);  select = None
    select_scatter = torch.ops.aten.select_scatter.default(x, mul_4, 0, 0);  x = mul_4 = None
    add_9 = torch.ops.aten.add.Tensor(select_scatter, 1)
    return (select_scatter, add_9)""")

    def test_batchnorm_train_dynamic_batch(self):
        ep = export_case("batchnorm_train", dynamic_shapes={"input": {0: Dim("batch")}})
        _verify_at(ep, "batchnorm_train", (9, 3))
        if torch_release() >= (2, 15):
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
        else:
            self.assertExpectedInline(graph_code(ep), """\
def forward(self, p_weight, p_bias, b_running_mean, b_running_var, b_num_batches_tracked, input_1):
    add_3 = torch.ops.aten.add.Tensor(b_num_batches_tracked, 1);  b_num_batches_tracked = None
    clone_default = torch.ops.aten.clone.default(b_running_mean);  b_running_mean = None
    clone_default_1 = torch.ops.aten.clone.default(b_running_var);  b_running_var = None
    _native_batch_norm_legit_functional = torch.ops.aten._native_batch_norm_legit_functional.default(input_1, p_weight, p_bias, clone_default, clone_default_1, True, 0.1, 1e-05);  input_1 = p_weight = p_bias = clone_default = clone_default_1 = None
    getitem = _native_batch_norm_legit_functional[0]
    getitem_3 = _native_batch_norm_legit_functional[3]
    getitem_4 = _native_batch_norm_legit_functional[4];  _native_batch_norm_legit_functional = None
    return (getitem_3, getitem_4, add_3, getitem)""")

    def test_tiny_transformer_block_dynamic_sequence(self):
        ep = export_case("tiny_transformer_block", dynamic_shapes={"x": {1: Dim("seq", max=64)}})
        _verify_at(ep, "tiny_transformer_block", (2, 11, 8))
        # as torch.export reports Dim("seq", max=64)
        self.assertEqual([(r.lower, r.upper) for r in ep.range_constraints.values()], [(0, 64)])
        if torch_release() >= (2, 15):
            self.assertExpectedInline(graph_code(ep), """\
def forward(self, p_norm1_weight, p_norm1_bias, p_qkv_weight, p_qkv_bias, p_proj_weight, p_proj_bias, p_norm2_weight, p_norm2_bias, p_mlp_0_weight, p_mlp_0_bias, p_mlp_2_weight, p_mlp_2_bias, x):
    sym_size_int_2 = torch.ops.aten.sym_size.int(x, 1)
    layer_norm = torch.ops.aten.layer_norm.default(x, [8], p_norm1_weight, p_norm1_bias);  p_norm1_weight = p_norm1_bias = None
    linear = torch.ops.aten.linear.default(layer_norm, p_qkv_weight, p_qkv_bias);  layer_norm = p_qkv_weight = p_qkv_bias = None
    split = torch.ops.aten.split.Tensor(linear, 8, -1);  linear = None
    getitem = split[0]
    getitem_1 = split[1]
    getitem_2 = split[2];  split = None
    view = torch.ops.aten.view.default(getitem, [2, sym_size_int_2, 2, 4]);  getitem = None
    transpose = torch.ops.aten.transpose.int(view, 1, 2);  view = None
    view_1 = torch.ops.aten.view.default(getitem_1, [2, sym_size_int_2, 2, 4]);  getitem_1 = None
    transpose_1 = torch.ops.aten.transpose.int(view_1, 1, 2);  view_1 = None
    view_2 = torch.ops.aten.view.default(getitem_2, [2, sym_size_int_2, 2, 4]);  getitem_2 = None
    transpose_2 = torch.ops.aten.transpose.int(view_2, 1, 2);  view_2 = None
    scaled_dot_product_attention = torch.ops.aten.scaled_dot_product_attention.default(transpose, transpose_1, transpose_2, None, 0.0, True);  transpose = transpose_1 = transpose_2 = None
    transpose_3 = torch.ops.aten.transpose.int(scaled_dot_product_attention, 1, 2);  scaled_dot_product_attention = None
    view_3 = torch.ops.aten.view.default(transpose_3, [2, sym_size_int_2, 8]);  transpose_3 = sym_size_int_2 = None
    linear_1 = torch.ops.aten.linear.default(view_3, p_proj_weight, p_proj_bias);  view_3 = p_proj_weight = p_proj_bias = None
    add = torch.ops.aten.add.Tensor(x, linear_1);  x = linear_1 = None
    layer_norm_1 = torch.ops.aten.layer_norm.default(add, [8], p_norm2_weight, p_norm2_bias);  p_norm2_weight = p_norm2_bias = None
    linear_2 = torch.ops.aten.linear.default(layer_norm_1, p_mlp_0_weight, p_mlp_0_bias);  layer_norm_1 = p_mlp_0_weight = p_mlp_0_bias = None
    gelu = torch.ops.aten.gelu.default(linear_2);  linear_2 = None
    linear_3 = torch.ops.aten.linear.default(gelu, p_mlp_2_weight, p_mlp_2_bias);  gelu = p_mlp_2_weight = p_mlp_2_bias = None
    add_1 = torch.ops.aten.add.Tensor(add, linear_3);  add = linear_3 = None
    return (add_1,)""")
        else:
            self.assertExpectedInline(graph_code(ep), """\
def forward(self, p_norm1_weight, p_norm1_bias, p_qkv_weight, p_qkv_bias, p_proj_weight, p_proj_bias, p_norm2_weight, p_norm2_bias, p_mlp_0_weight, p_mlp_0_bias, p_mlp_2_weight, p_mlp_2_bias, x):
    sym_size_int_5 = torch.ops.aten.sym_size.int(x, 1)
    layer_norm = torch.ops.aten.layer_norm.default(x, [8], p_norm1_weight, p_norm1_bias);  p_norm1_weight = p_norm1_bias = None
    linear = torch.ops.aten.linear.default(layer_norm, p_qkv_weight, p_qkv_bias);  layer_norm = p_qkv_weight = p_qkv_bias = None
    split = torch.ops.aten.split.Tensor(linear, 8, -1);  linear = None
    getitem = split[0]
    getitem_1 = split[1]
    getitem_2 = split[2];  split = None
    view = torch.ops.aten.view.default(getitem, [2, sym_size_int_5, 2, 4]);  getitem = None
    transpose = torch.ops.aten.transpose.int(view, 1, 2);  view = None
    view_1 = torch.ops.aten.view.default(getitem_1, [2, sym_size_int_5, 2, 4]);  getitem_1 = None
    transpose_1 = torch.ops.aten.transpose.int(view_1, 1, 2);  view_1 = None
    view_2 = torch.ops.aten.view.default(getitem_2, [2, sym_size_int_5, 2, 4]);  getitem_2 = None
    transpose_2 = torch.ops.aten.transpose.int(view_2, 1, 2);  view_2 = None
    scaled_dot_product_attention = torch.ops.aten.scaled_dot_product_attention.default(transpose, transpose_1, transpose_2, None, 0.0, True);  transpose = transpose_1 = transpose_2 = None
    transpose_3 = torch.ops.aten.transpose.int(scaled_dot_product_attention, 1, 2);  scaled_dot_product_attention = None
    view_3 = torch.ops.aten.view.default(transpose_3, [2, sym_size_int_5, 8]);  transpose_3 = sym_size_int_5 = None
    linear_1 = torch.ops.aten.linear.default(view_3, p_proj_weight, p_proj_bias);  view_3 = p_proj_weight = p_proj_bias = None
    add_72 = torch.ops.aten.add.Tensor(x, linear_1);  x = linear_1 = None
    layer_norm_1 = torch.ops.aten.layer_norm.default(add_72, [8], p_norm2_weight, p_norm2_bias);  p_norm2_weight = p_norm2_bias = None
    linear_2 = torch.ops.aten.linear.default(layer_norm_1, p_mlp_0_weight, p_mlp_0_bias);  layer_norm_1 = p_mlp_0_weight = p_mlp_0_bias = None
    gelu = torch.ops.aten.gelu.default(linear_2);  linear_2 = None
    linear_3 = torch.ops.aten.linear.default(gelu, p_mlp_2_weight, p_mlp_2_bias);  gelu = p_mlp_2_weight = p_mlp_2_bias = None
    add_93 = torch.ops.aten.add.Tensor(add_72, linear_3);  add_72 = linear_3 = None
    return (add_93,)""")
