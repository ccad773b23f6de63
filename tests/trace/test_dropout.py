"""Dropout: train mode draws what eager draws; eval (and ``p=0``) returns the input itself,
so an in-place op after it reaches the input, as in eager."""

from expecttest import TestCase

import predispatch_func as pf
from tests.support.reference import call_targets, export_case, graph_code, mutations


class TestDropout(TestCase):
    def test_dropout_train(self):
        """Values differ from eager (random mask), so the replay checks shapes; the
        program must still be functional: no in-place bernoulli, no mutation."""
        ep = export_case("dropout_train")
        self.assertEqual(mutations(ep), [])
        self.assertTrue(pf.check_contract(ep).ok)
        self.assertEqual([t for t in call_targets(ep) if t.startswith("aten.") and t.split(".")[1].endswith("_")], [])
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, p__0_weight, p__0_bias, input_1):
    linear = torch.ops.aten.linear.default(input_1, p__0_weight, p__0_bias);  input_1 = p__0_weight = p__0_bias = None
    native_dropout = torch.ops.aten.native_dropout.default(linear, 0.5, True);  linear = None
    getitem = native_dropout[0];  native_dropout = None
    return (getitem,)""")

    def test_functional_dropout_eval_then_inplace(self):
        """Eager's dropout returns its input in eval mode; torch's decomposition clones it."""
        ep = export_case("functional_dropout_eval_then_inplace")
        self.assertEqual(mutations(ep), [("USER_INPUT_MUTATION", "x")])
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, x):
    add = torch.ops.aten.add.Tensor(x, 1);  x = None
    mul = torch.ops.aten.mul.Tensor(add, 2)
    return (add, mul)""")

    def test_functional_dropout_p0_train_then_inplace(self):
        ep = export_case("functional_dropout_p0_train_then_inplace")
        self.assertEqual(mutations(ep), [("USER_INPUT_MUTATION", "x")])
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, x):
    mul = torch.ops.aten.mul.Tensor(x, 3);  x = None
    add = torch.ops.aten.add.Tensor(mul, mul)
    return (mul, add)""")

    def test_dropout_eval_is_identity(self):
        ep = export_case("dropout_eval_is_identity")
        self.assertNotIn("aten.dropout.default", call_targets(ep))
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, p__0_weight, p__0_bias, input_1):
    linear = torch.ops.aten.linear.default(input_1, p__0_weight, p__0_bias);  input_1 = p__0_weight = p__0_bias = None
    return (linear,)""")
