"""The forms of input ``forward`` takes: keyword arguments with defaults, nested tuples and
dicts, non-tensor arguments, nested outputs, a write into a tensor held in a dict, ``*args`` and
``**kwargs`` (the program's module takes them as ``forward`` does).

Catalogue cases (tests/support/cases_core.py) exported through ``export_checked`` and snapshotted.
"""

import torch
from expecttest import TestCase

from tests.support.conformance_judge import assert_ok
from tests.support.reference import export_case, graph_code, mutations


class TestPytreeInputsAndOutputs(TestCase):
    def test_kwargs_with_default(self):
        ep = export_case("kwargs_with_default")
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, x, scale, shift):
    mul = torch.ops.aten.mul.Tensor(x, scale);  x = scale = None
    add = torch.ops.aten.add.Tensor(mul, shift);  mul = shift = None
    return (add,)""")

    def test_nested_tuple_and_dict_inputs(self):
        ep = export_case("nested_tuple_and_dict_inputs")
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, pair_0, pair_1_0, pair_1_1, table_w, table_inner_v):
    mul = torch.ops.aten.mul.Tensor(pair_0, table_w);  pair_0 = table_w = None
    add = torch.ops.aten.add.Tensor(mul, pair_1_0);  mul = pair_1_0 = None
    mul_1 = torch.ops.aten.mul.Tensor(pair_1_1, table_inner_v);  pair_1_1 = table_inner_v = None
    sub = torch.ops.aten.sub.Tensor(add, mul_1);  add = mul_1 = None
    return (sub,)""")

    def test_non_tensor_inputs(self):
        ep = export_case("non_tensor_inputs")
        self.assertEqual([s.kind.name for s in ep.graph_signature.input_specs], ["USER_INPUT"] * 5)
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, x, k, scale, flag, nothing):
    mul = torch.ops.aten.mul.Tensor(x, 2);  x = None
    mul_1 = torch.ops.aten.mul.Tensor(mul, 0.5);  mul = None
    return (mul_1,)""")

    def test_nested_outputs(self):
        ep = export_case("nested_outputs")
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, x):
    add = torch.ops.aten.add.Tensor(x, 1)
    mul = torch.ops.aten.mul.Tensor(x, 2)
    sum_1 = torch.ops.aten.sum.default(x);  x = None
    return (add, mul, sum_1, 3)""")

    def test_mutation_of_input_inside_dict(self):
        ep = export_case("mutation_of_input_inside_dict")
        self.assertEqual(mutations(ep), [("USER_INPUT_MUTATION", "table_state")])
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, table_state, table_delta):
    add = torch.ops.aten.add.Tensor(table_state, table_delta);  table_state = table_delta = None
    mul = torch.ops.aten.mul.Tensor(add, 2)
    return (add, mul)""")


class VarArgs(torch.nn.Module):
    def forward(self, *args):
        return args[0] * 2 + args[1]


class MixedArgs(torch.nn.Module):
    def forward(self, a, *args, kw, **kwargs):
        return a + args[0] * kw + kwargs["z"]


def test_forward_with_var_positional_args_runs_as_a_module():
    assert_ok(VarArgs(), (torch.randn(3), torch.randn(3)))


def test_forward_with_var_positional_and_var_keyword_args_runs_as_a_module():
    x, y = torch.randn(3), torch.randn(3)
    assert_ok(MixedArgs(), (x, y), {"kw": y.clone(), "z": x.clone()})
