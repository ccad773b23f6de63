"""Edge cases about CompositeImplicitAutograd ops.

Honest composites stay single nodes. Composites that return (an alias of)
their input while the schema says ``-> Tensor`` are decomposed, so the
in-place op after them reaches the input as it does in eager.
"""

from expecttest import TestCase

from tests.support.reference import call_targets, export_case, graph_code, mutations


class TestHonestCompositesKept(TestCase):
    def test_linear_kept(self):
        ep = export_case("linear_kept")
        self.assertIn("aten.linear.default", call_targets(ep))
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, p_weight, p_bias, input_1):
    linear = torch.ops.aten.linear.default(input_1, p_weight, p_bias);  input_1 = p_weight = p_bias = None
    return (linear,)""")

    def test_layer_norm_kept(self):
        ep = export_case("layer_norm_kept")
        self.assertIn("aten.layer_norm.default", call_targets(ep))
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, p_weight, p_bias, input_1):
    layer_norm = torch.ops.aten.layer_norm.default(input_1, [4], p_weight, p_bias);  input_1 = p_weight = p_bias = None
    return (layer_norm,)""")

    def test_softmax_kept(self):
        ep = export_case("softmax_kept")
        self.assertIn("aten.softmax.int", call_targets(ep))
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, x):
    softmax = torch.ops.aten.softmax.int(x, -1);  x = None
    return (softmax,)""")

    def test_scaled_dot_product_attention_kept(self):
        ep = export_case("scaled_dot_product_attention_kept")
        self.assertIn("aten.scaled_dot_product_attention.default", call_targets(ep))
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, q, k, v):
    scaled_dot_product_attention = torch.ops.aten.scaled_dot_product_attention.default(q, k, v, None, 0.0, True);  q = k = v = None
    return (scaled_dot_product_attention,)""")


class TestLyingCompositesDecomposed(TestCase):
    def test_type_as_then_inplace(self):
        ep = export_case("type_as_then_inplace")
        self.assertNotIn("aten.type_as.default", call_targets(ep))
        self.assertEqual(mutations(ep), [("USER_INPUT_MUTATION", "x")])
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, x, z):
    mul = torch.ops.aten.mul.Tensor(x, 3);  x = None
    add = torch.ops.aten.add.Tensor(mul, 1)
    return (mul, add)""")

    def test_type_as_other_dtype_then_inplace_leaves_input(self):
        ep = export_case("type_as_other_dtype_then_inplace_leaves_input")
        self.assertEqual(mutations(ep), [])
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, x, z):
    _to_copy = torch.ops.aten._to_copy.default(x, dtype = torch.float64, layout = torch.strided, device = device(type='cpu'));  x = None
    mul = torch.ops.aten.mul.Tensor(_to_copy, 3);  _to_copy = None
    return (mul,)""")

    def test_einsum_transpose_then_inplace(self):
        ep = export_case("einsum_transpose_then_inplace")
        self.assertNotIn("aten.einsum.default", call_targets(ep))
        self.assertEqual(mutations(ep), [("USER_INPUT_MUTATION", "x")])
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, x):
    permute = torch.ops.aten.permute.default(x, [1, 0]);  x = None
    add = torch.ops.aten.add.Tensor(permute, 1);  permute = None
    permute_1 = torch.ops.aten.permute.default(add, [1, 0]);  add = None
    permute_2 = torch.ops.aten.permute.default(permute_1, [1, 0])
    mul = torch.ops.aten.mul.Tensor(permute_2, 2);  permute_2 = None
    return (permute_1, mul)""")

    def test_einsum_contraction_kept_next_to_a_transpose(self):
        ep = export_case("einsum_contraction_kept_next_to_a_transpose")
        self.assertIn("aten.einsum.default", call_targets(ep))
        self.assertEqual(mutations(ep), [("USER_INPUT_MUTATION", "x")])
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, x, w):
    einsum = torch.ops.aten.einsum.default('bij,bjk->bik', [x, w]);  w = None
    add = torch.ops.aten.add.Tensor(einsum, 1);  einsum = None
    permute = torch.ops.aten.permute.default(x, [0, 2, 1]);  x = None
    mul = torch.ops.aten.mul.Tensor(permute, 2);  permute = None
    permute_1 = torch.ops.aten.permute.default(mul, [0, 2, 1]);  mul = None
    mul_1 = torch.ops.aten.mul.Tensor(permute_1, 1)
    return (permute_1, add, mul_1)""")

    def test_inplace_activations_with_python_meta_kernels(self):
        """Functionalized as their functional op plus replace (no Python meta re-run): the
        writes through a view and into the inputs reach eager's tensors (replayed)."""
        ep = export_case("inplace_activations_with_python_meta_kernels")
        self.assertEqual(mutations(ep), [("USER_INPUT_MUTATION", "y"), ("USER_INPUT_MUTATION", "w")])
        for op in ("aten.hardswish.default", "aten.hardsigmoid.default", "aten.leaky_relu.default"):
            self.assertIn(op, call_targets(ep))

    def test_einsum_identity_then_inplace(self):
        ep = export_case("einsum_identity_then_inplace")
        self.assertEqual(mutations(ep), [("USER_INPUT_MUTATION", "x")])
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, x):
    permute = torch.ops.aten.permute.default(x, [0]);  x = None
    add = torch.ops.aten.add.Tensor(permute, 1);  permute = None
    permute_1 = torch.ops.aten.permute.default(add, [0]);  add = None
    mul = torch.ops.aten.mul.Tensor(permute_1, 2)
    return (permute_1, mul)""")

    def test_einsum_diagonal_then_inplace(self):
        ep = export_case("einsum_diagonal_then_inplace")
        self.assertEqual(mutations(ep), [("USER_INPUT_MUTATION", "x")])
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, x):
    diagonal = torch.ops.aten.diagonal.default(x)
    permute = torch.ops.aten.permute.default(diagonal, [0]);  diagonal = None
    permute_1 = torch.ops.aten.permute.default(permute, [0]);  permute = None
    add = torch.ops.aten.add.Tensor(permute_1, 1);  permute_1 = None
    permute_3 = torch.ops.aten.permute.default(add, [0]);  add = None
    permute_4 = torch.ops.aten.permute.default(permute_3, [0]);  permute_3 = None
    diagonal_scatter = torch.ops.aten.diagonal_scatter.default(x, permute_4);  x = permute_4 = None
    mul = torch.ops.aten.mul.Tensor(diagonal_scatter, 2)
    return (diagonal_scatter, mul)""")

    def test_sum_to_size_then_inplace(self):
        ep = export_case("sum_to_size_then_inplace")
        self.assertNotIn("aten.sum_to_size.default", call_targets(ep))
        self.assertEqual(mutations(ep), [("USER_INPUT_MUTATION", "x")])
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, x):
    sub = torch.ops.aten.sub.Tensor(x, 1);  x = None
    sum_1 = torch.ops.aten.sum.default(sub)
    return (sub, sum_1)""")

    def test_reshape_then_inplace(self):
        ep = export_case("reshape_then_inplace")
        self.assertEqual(mutations(ep), [("USER_INPUT_MUTATION", "x")])
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, x):
    view = torch.ops.aten.view.default(x, [-1])
    select = torch.ops.aten.select.int(view, 0, 0);  view = None
    fill = torch.ops.aten.fill.Scalar(select, 7);  select = None
    view_1 = torch.ops.aten.view.default(x, [-1]);  x = None
    select_scatter = torch.ops.aten.select_scatter.default(view_1, fill, 0, 0);  view_1 = fill = None
    view_2 = torch.ops.aten.view.default(select_scatter, [2, 3]);  select_scatter = None
    add = torch.ops.aten.add.Tensor(view_2, 0)
    return (view_2, add)""")

    def test_to_same_dtype_then_inplace(self):
        ep = export_case("to_same_dtype_then_inplace")
        self.assertEqual(mutations(ep), [("USER_INPUT_MUTATION", "x")])
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, x):
    _assert_tensor_metadata = torch.ops.aten._assert_tensor_metadata.default(x, None, None, torch.float32, device = device(type='cpu'), layout = torch.strided);  _assert_tensor_metadata = None
    mul = torch.ops.aten.mul.Tensor(x, 2);  x = None
    cos = torch.ops.aten.cos.default(mul)
    return (mul, cos)""")

    def test_contiguous_then_inplace(self):
        ep = export_case("contiguous_then_inplace")
        self.assertEqual(mutations(ep), [("USER_INPUT_MUTATION", "x")])
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, x):
    add = torch.ops.aten.add.Tensor(x, 4);  x = None
    neg = torch.ops.aten.neg.default(add)
    return (add, neg)""")

    def test_flatten_1d_then_inplace(self):
        ep = export_case("flatten_1d_then_inplace")
        self.assertEqual(mutations(ep), [("USER_INPUT_MUTATION", "x")])
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, x):
    mul = torch.ops.aten.mul.Tensor(x, 5);  x = None
    tanh = torch.ops.aten.tanh.default(mul)
    return (mul, tanh)""")
