"""What the program returns: views of inputs, an input itself, a written input, one tensor
twice, Python scalars from ``.item()`` (symbolic outputs of the signature); each output of
``ep.module()`` is what eager returns (values and aliasing).

Catalogue cases (tests/support/cases_core.py) exported through ``export_checked`` and snapshotted.
"""

import torch
from expecttest import TestCase

from tests.support.conformance_judge import assert_ok
from tests.support.reference import export_case, graph_code, mutations


class TestOutputsAndInputs(TestCase):
    def test_outputs_are_views_of_input(self):
        ep = export_case("outputs_are_views_of_input")
        self.assertEqual(mutations(ep), [])
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, x):
    view = torch.ops.aten.view.default(x, [-1])
    select = torch.ops.aten.select.int(x, 0, 0)
    t = torch.ops.aten.t.default(x);  x = None
    return (view, select, t)""")

    def test_same_tensor_returned_twice(self):
        ep = export_case("same_tensor_returned_twice")
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, x):
    sin = torch.ops.aten.sin.default(x);  x = None
    return (sin, sin)""")

    def test_input_returned_unchanged(self):
        ep = export_case("input_returned_unchanged")
        self.assertEqual(mutations(ep), [])
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, x, y):
    mul = torch.ops.aten.mul.Tensor(y, 2);  y = None
    return (x, mul)""")

    def test_mutated_input_also_returned(self):
        ep = export_case("mutated_input_also_returned")
        self.assertEqual(mutations(ep), [("USER_INPUT_MUTATION", "x")])
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, x):
    add = torch.ops.aten.add.Tensor(x, 1);  x = None
    return (add, add)""")

    def test_mutated_input_returned_as_view(self):
        ep = export_case("mutated_input_returned_as_view")
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, x):
    mul = torch.ops.aten.mul.Tensor(x, 2);  x = None
    view_1 = torch.ops.aten.view.default(mul, [3, 2])
    select_1 = torch.ops.aten.select.int(view_1, 0, 1);  view_1 = None
    return (mul, select_1)""")

    def test_output_view_taken_before_mutation(self):
        ep = export_case("output_view_taken_before_mutation")
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, x):
    mul = torch.ops.aten.mul.Tensor(x, 2);  x = None
    select_1 = torch.ops.aten.select.int(mul, 0, 0)
    return (mul, select_1)""")


class ReturnsItems(torch.nn.Module):
    def forward(self, x):
        return x * 2, x.max().item(), (x > 0).any().item(), x.argmax().item()


def test_item_results_returned_as_outputs():
    """Returned Python scalars from ``.item()`` are SymFloat/SymBool/SymInt outputs
    of the signature (was a raw ``SpecViolationError``)."""
    assert_ok(ReturnsItems(), (torch.randn(3, 4),))
