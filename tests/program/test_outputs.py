"""What the program returns: views of inputs, an input itself, a written input, one tensor
twice, Python scalars from ``.item()`` (symbolic outputs of the signature); each output of
``ep.module()`` is what eager returns (values and aliasing).

Catalogue cases (tests/support/cases_core.py) exported through ``export_checked`` and snapshotted.
"""

import copy

import torch
from expecttest import TestCase

import predispatch_func as pf
from tests.support.cases_core import build
from tests.support.conformance_judge import assert_ok
from tests.support.reference import export_case, export_checked, graph_code, mutations


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


class TestViewsOfWrittenState(TestCase):
    """A returned view of a written buffer, parameter or input is a view of it, as in eager:
    ``pf.verify`` (in ``export_checked``) compares which inputs and state each output shares
    memory with; the tests below also show what a caller sees."""

    def test_written_buffer_returned_as_view(self):
        ep = export_case("written_buffer_returned_as_view")
        self.assertEqual(mutations(ep), [("BUFFER_MUTATION", "b")])
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, b_b, x):
    add = torch.ops.aten.add.Tensor(b_b, x);  b_b = x = None
    select_1 = torch.ops.aten.select.int(add, 0, 1)
    t_1 = torch.ops.aten.t.default(add)
    return (add, select_1, t_1)""")

    def test_parameter_written_under_no_grad_returned_as_view(self):
        ep = export_case("parameter_written_under_no_grad_returned_as_view")
        self.assertEqual(mutations(ep), [("PARAMETER_MUTATION", "w")])

    def test_intermediate_copied_into_buffer_returned_as_view(self):
        # v[1:] and b[:1] are both slices of one node; only b[:1] is the buffer's memory
        ep = export_case("intermediate_copied_into_buffer_returned_as_view")
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, b_b, x):
    mul = torch.ops.aten.mul.Tensor(x, 2);  x = None
    slice_1 = torch.ops.aten.slice.Tensor(mul, 0, 1, 9223372036854775807)
    slice_3 = torch.ops.aten.slice.Tensor(mul, 0, 0, 1)
    return (mul, slice_1, slice_3)""")

    def test_relaid_input_returned_as_view(self):
        # x.t_() relays the input: the graph's select of the new value, applied to x itself
        class Relaid(torch.nn.Module):
            def forward(self, x):
                x.t_()
                x.mul_(2)
                return x[0], x

        export_checked(Relaid(), (torch.randn(2, 3),))

    def test_inputs_sharing_memory_written_and_returned_as_views(self):
        # traced over a synthetic base: both outputs are views of the caller's memory, as in eager
        class Aliased(torch.nn.Module):
            def forward(self, a, b):
                a.add_(1)
                return b[0], a[1:]

        base = torch.randn(4)
        export_checked(Aliased(), (base, base[1:]))

    def test_value_a_data_assignment_gave_an_input_returned(self):
        # x1.data = v makes v x1's memory in eager (found by fuzz.py --joint on torch 2.11)
        class DataAssigned(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.register_buffer("b", torch.zeros(4))

            def forward(self, x0, x1):
                v1 = x1 * 3
                x1.data = v1
                v2 = x0 * 2
                self.b.data = v2
                return v1, v2[1:], x0 + 1

        export_checked(DataAssigned(), (torch.randn(4), torch.randn(4)))

    def test_region_result_laid_out_otherwise_returned_as_view(self):
        # the region returns the input's new value with other strides (a size-1 dimension's):
        # the output is found in it element by element (found by fuzz.py on torch 2.13)
        class TransposedInRegion(torch.nn.Module):
            def forward(self, x):
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    torch.set_grad_enabled(False)
                    v = x.transpose(-2, -1)
                    torch.set_grad_enabled(True)
                    v.sin_()
                return v, x * 2

        export_checked(TransposedInRegion(), (torch.randn(4, 1),))

    def test_a_kept_view_shows_the_next_calls_write_and_writes_reach_the_buffer(self):
        model, args, _ = build("written_buffer_returned_as_view")
        program = export_case("written_buffer_returned_as_view").module()
        for run in (copy.deepcopy(model), program):
            row, transposed = run(*args)
            run(*args)  # the second call's write shows through the first call's outputs
            self.assertTrue(torch.equal(row, 2 * args[0][1]) and torch.equal(transposed, 2 * args[0].t()))
            row.fill_(7)
            self.assertTrue(torch.equal(run.b[1], torch.full((3,), 7.0)))

    def test_verify_reports_an_output_that_lost_the_buffers_memory(self):
        model, args, _ = build("written_buffer_returned_as_view")

        class ReturnsCopies(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.register_buffer("b", model.b.clone())

            def forward(self, x):
                self.b.add_(x)
                return self.b[1].clone(), self.b.t()

        report = pf.replay_against_reference(ReturnsCopies(), model, args)
        self.assertEqual(report.problems, ["output[0] shares memory with b in eager, with nothing in the program "
                                           "(a later write to one shows through the other)"])


class ReturnsItems(torch.nn.Module):
    def forward(self, x):
        return x * 2, x.max().item(), (x > 0).any().item(), x.argmax().item()


def test_item_results_returned_as_outputs():
    """Returned Python scalars from ``.item()`` are SymFloat/SymBool/SymInt outputs
    of the signature (was a raw ``SpecViolationError``)."""
    assert_ok(ReturnsItems(), (torch.randn(3, 4),))
