"""``ep.module()``'s write-backs: every input or buffer the program writes is written back, in an
order and with copies that leave each output and each written input what eager leaves (an input's
new value that is another input's placeholder, two inputs written with one value, a region result
viewing a written input, a write into a leaf that requires grad made under no_grad, the ``input``
argument of every ``inplace=True`` module, whose placeholder fx renames).

Shrunk from programs the differential fuzzer (tests/fuzz) printed; replayed against the reference.
"""

import pytest
import torch
from expecttest import TestCase

from tests.support.conformance_judge import assert_ok
from tests.support.reference import export_checked, graph_code


class WriteThroughDetachOfInput(torch.nn.Module):
    def forward(self, x, y):
        x.detach().clamp_(min=-0.5, max=0.5)
        return x * y


class TestWritesToGradLeafInputs(TestCase):
    def test_write_through_detach_of_plain_input_is_written_back(self):
        # verify must not make a written input require grad: the program's copy_
        # write-back is refused on a leaf that requires grad, eager's detach() write is not
        export_checked(WriteThroughDetachOfInput(), (torch.randn(4), torch.randn(4, requires_grad=True)))

    def test_write_through_detach_of_grad_input(self):
        # torch's module() would refuse the copy_ write-back on this leaf; ours writes under no_grad
        export_checked(WriteThroughDetachOfInput(), (torch.randn(4, requires_grad=True), torch.randn(4)))


class CopyInputIntoInputThenWriteIt(torch.nn.Module):
    def forward(self, x, y):
        y.copy_(x)
        x.sin_()
        return y


class TestWriteBackOrder(TestCase):
    def test_new_value_that_is_an_input_written_later(self):
        # y's new value is x's old value, i.e. the placeholder x; module() writes x back
        # first, so the program must carry a copy of it
        ep = export_checked(CopyInputIntoInputThenWriteIt(), (torch.randn(2), torch.randn(2)))
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, x, y):
    clone = torch.ops.aten.clone.default(x)
    clone_default = torch.ops.aten.clone.default(x);  x = None
    sin = torch.ops.aten.sin.default(clone_default);  clone_default = None
    return (sin, clone, clone)""")


class CopyInputIntoInputUnderNoGrad(torch.nn.Module):
    def forward(self, x, y):
        with torch.no_grad():
            x.copy_(y)
        return y


class CopyIntermediateIntoInputUnderNoGrad(torch.nn.Module):
    def forward(self, x, y):
        w = y * 2
        with torch.no_grad():
            x.copy_(w)
        return w


class TestOutputsSharingAWrite(TestCase):
    def test_returned_input_copied_into_another_input(self):
        # x's new value is the placeholder y: module() must still return y, not x
        export_checked(CopyInputIntoInputUnderNoGrad(), (torch.randn(3), torch.randn(3)))

    def test_returned_intermediate_copied_into_an_input(self):
        # w is x's new value and an output: module() must return w, not the written x
        export_checked(CopyIntermediateIntoInputUnderNoGrad(), (torch.randn(3), torch.randn(3)))


class ViewOfInputThatBecomesAnotherInputsValue(torch.nn.Module):
    def forward(self, x, y):
        v = y.flatten(0)
        y.copy_(x)
        x.add_(0.5)
        return v


class TwoInputsWrittenWithOneValue(torch.nn.Module):
    def forward(self, x, y):
        v = y.expand_as(x)
        v.copy_(x)
        s = y + x
        x.copy_(y)
        return s


class TestWriteBackAliasing(TestCase):
    def test_view_of_an_input_whose_value_is_another_input(self):
        # y's new value is x's placeholder, so v is a view of x, which module() writes back
        # (x + 0.5) before returning v
        export_checked(ViewOfInputThatBecomesAnotherInputsValue(), (torch.randn(1, 4, 3),
                                                                   torch.randn(1, 4, 3)))

    def test_two_inputs_written_with_one_value(self):
        # torch's signature keys mutations by output name: one node for two mutations
        # made ExportedProgram reject the signature (SpecViolationError)
        export_checked(TwoInputsWrittenWithOneValue(), (torch.randn(1), torch.randn(1)))


class TwoInputsWrittenFromOneInput(torch.nn.Module):
    def forward(self, x, y, z):
        y.copy_(z)
        x.copy_(z)
        return y


class TestMoreWriteBacks(TestCase):
    def test_two_inputs_written_from_one_input(self):
        # each mutation needs a node of its own (SpecViolationError when they shared a copy)
        export_checked(TwoInputsWrittenFromOneInput(), (torch.randn(3), torch.randn(3), torch.randn(3)))


class OutputViewsAnInputThroughARegion(torch.nn.Module):
    def forward(self, x, y):
        x.copy_(y)  # x's value is now y's placeholder
        y.sin_()
        with torch.no_grad():
            v = x.unsqueeze(-1)  # a region result that views y's input when the program runs
        return v


class TestWriteBackThroughRegionResults(TestCase):
    def test_region_result_viewing_an_input_written_back_gets_its_own_copy(self):
        # module() writes y back before returning v; v, a region result that views y's
        # input, came back with y's new value
        export_checked(OutputViewsAnInputThroughARegion(), (torch.randn(3), torch.randn(3)))


def _inplace_modules() -> list[type]:
    """Every ``torch.nn`` module built with ``inplace=True`` (activations, dropouts)."""
    import inspect

    return sorted((c for c in vars(torch.nn).values() if isinstance(c, type) and issubclass(c, torch.nn.Module)
                   and "inplace" in inspect.signature(c.__init__).parameters), key=lambda c: c.__name__)


@pytest.mark.parametrize("cls", _inplace_modules(), ids=lambda c: c.__name__)
def test_inplace_module_writes_back_its_input_argument(cls):
    """``forward(self, input)``: fx renames the placeholder (``input`` shadows a
    builtin); the mutation must name the renamed one (was ``KeyError: 'input'``)."""
    kwargs = {"threshold": 0.1, "value": 2.0} if cls is torch.nn.Threshold else {}
    shape = {torch.nn.Dropout1d: (2, 3, 4), torch.nn.Dropout3d: (2, 3, 4, 5, 6)}.get(cls, (2, 3, 4, 5))
    assert_ok(cls(inplace=True, **kwargs).eval(), (torch.randn(shape),))
