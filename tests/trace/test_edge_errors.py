"""What the exporter cannot honour, or what the model itself gets wrong, is an
error that names the op and the line of the user's model: never a different program."""

import torch
from expecttest import TestCase
from torch import nn

import predispatch_func as pf
from tests.support.cases_core import REFUSED
from tests.support.expect_refusal import refused
from tests.support.torch_release import torch_limit


def _at_line(code: str) -> str:
    """Regex for 'this file:line in forward' followed by the source line ``code``."""
    return r"test_edge_errors\.py:\d+ in forward\n\s+" + code


class TestMetadataMutationOfInputs(TestCase):
    """Static layout changes are carried (test_conformance_regressions.py); a symbolic
    new layout has no write-back."""

    def test_t_inplace_on_dynamic_input_is_refused(self):
        class M(nn.Module):
            def forward(self, x):
                x.t_()
                return x + 1

        with refused(pf.Refusal.INPUT_METADATA_MUTATION, r"in-place metadata[\s\S]*aten\.t_\.default[\s\S]*"
                                    + _at_line(r"x\.t_\(\)")):
            pf.export(M(), (torch.randn(2, 3),), dynamic_shapes=({0: torch.export.Dim("a"), 1: torch.export.Dim("b")},))

    def test_unsqueeze_inplace_on_dynamic_input_is_refused(self):
        class M(nn.Module):
            def forward(self, x):
                y = x * 2
                x.unsqueeze_(0)
                return y

        with refused(pf.Refusal.INPUT_METADATA_MUTATION, r"aten\.unsqueeze_\.default[\s\S]*"
                                    + _at_line(r"x\.unsqueeze_\(0\)")):
            pf.export(M(), (torch.randn(3),), dynamic_shapes=({0: torch.export.Dim("n")},))


class TestWritesThroughAliasedInputs(TestCase):
    """Carried through a synthetic base (tests/state/test_aliased_inputs.py); refused where the
    members cannot share one base."""

    def test_write_to_input_aliased_with_another_dtype_is_refused(self):
        class M(nn.Module):
            def forward(self, x, y):
                x.add_(1)
                return y * 2

        x = torch.randn(3)
        with refused(pf.Refusal.WRITE_TO_ALIASED_INPUTS, r"writes to inputs 'x', 'y', which share memory"):
            pf.export(M(), (x, x.view(torch.int32)))

    def test_replay_keeps_an_input_passed_twice_aliased(self):
        """The verifier must see the caller's aliasing: a program exported for distinct
        inputs differs from eager when both arguments are one tensor, and verify says so."""
        class M(nn.Module):
            def forward(self, x, y):
                x.add_(1)
                return y * 2

        ep = pf.export(M(), (torch.randn(3), torch.randn(3)))
        self.assertTrue(pf.verify(ep, M(), (torch.randn(3), torch.randn(3))).ok)
        t = torch.randn(3)
        report = pf.verify(ep, M(), (t, t))
        self.assertFalse(report.ok)
        self.assertIn("output: values differ", str(report))

    def test_replay_keeps_overlapping_views_aliased(self):
        """As above, for two views of one tensor (verify copies their memory once)."""
        class M(nn.Module):
            def forward(self, x, y):
                y.mul_(2)
                return x.sum()

        ep = pf.export(M(), (torch.randn(4), torch.randn(2)))
        t = torch.randn(4)
        report = pf.verify(ep, M(), (t, t[2:]))
        self.assertFalse(report.ok)
        self.assertIn("output: values differ", str(report))


class TestStateReplacedByAssignment(TestCase):
    def test_parameter_replaced_by_assignment_is_refused(self):
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.w = nn.Parameter(torch.randn(3))

            def forward(self, x):
                self.w = nn.Parameter(self.w * 2)
                return x * self.w

        with refused(pf.Refusal.STATE_REPLACED, r"replaces parameter 'w' by assignment"):
            pf.export(M(), (torch.randn(3),))

    def test_buffer_replaced_with_other_dtype_is_refused(self):
        """(another shape is carried: tests/state/test_state.py)"""
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.register_buffer("seen", torch.zeros(3))

            def forward(self, x):
                self.seen = self.seen.double() + x
                return x + 1

        with refused(pf.Refusal.STATE_REPLACED, r"replaces buffer 'seen' by assignment with a value of another dtype"):
            pf.export(M(), (torch.randn(3),))


class TestErrorsInsideTheModel(TestCase):
    def test_shape_error_names_op_and_line(self):
        class M(nn.Module):
            def forward(self, x, y):
                z = x.relu()
                return torch.mm(z, y)

        with self.assertRaisesRegex(pf.ExportError, r"aten\.mm\.default[\s\S]*" + _at_line(r"return torch\.mm\(z, y\)")):
            pf.export(M(), (torch.randn(2, 3), torch.randn(4, 5)))

    def test_users_own_exception_names_line(self):
        class M(nn.Module):
            def forward(self, x):
                if x.shape[0] != 5:
                    raise ValueError("expected 5 rows")
                return x

        with self.assertRaisesRegex(pf.ExportError, r"ValueError: expected 5 rows[\s\S]*"
                                    + _at_line(r'raise ValueError\("expected 5 rows"\)')):
            pf.export(M(), (torch.randn(2),))

    def test_inplace_on_broadcast_view_names_op_and_line(self):
        class M(nn.Module):
            def forward(self, x, y):
                x.add_(y)
                return x

        with self.assertRaisesRegex(pf.ExportError, r"aten\.add_\.Tensor[\s\S]*" + _at_line(r"x\.add_\(y\)")):
            pf.export(M(), (torch.randn(3), torch.randn(2, 3)))


class TestRefusedCatalogue(TestCase):
    def test_every_refused_case_raises_unsupported(self):
        """The refused half of the catalogue (also run by scripts/compare_torch_paths.py)."""
        for name, case in REFUSED.items():
            with self.subTest(name):
                model, args, kwargs = case.build()
                with self.assertRaisesRegex(pf.UnsupportedError, r"t_|unsqueeze_|shares? memory") as caught:
                    pf.export(model, args, kwargs)
                self.assertIs(caught.exception.kind, case.refused)


class WriteThroughDetach(nn.Module):
    def forward(self, x):
        x.detach().add_(1)  # eager: writes x, allowed even when x requires grad
        return x * 2


def test_write_through_detach_to_input_that_requires_grad():
    # torch's own module() refuses the copy_ write-back on such a leaf; ours writes it back
    # under no_grad, and the write is a no_grad region keeping x's autograd identity
    from tests.support.reference import export_checked

    export_checked(WriteThroughDetach(), (torch.randn(3),))


class GradValueWrittenIntoIntegerTensor(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(3))

    def forward(self, x):
        x[0] = self.w[1]
        return x


class TestGradValueIntoIntegerTensor(TestCase):
    """torch 2.13: fill.Tensor / masked_fill.Tensor (the functional forms every functional
    path needs) raise 'Autograd not support dtype' when they write a value that requires
    grad into an integer tensor; eager's in-place fill_ gives the integer tensor a grad_fn
    when called directly and none through x[i] = v (found by fuzzing, seed 9)."""

    def test_is_refused_naming_op_and_line(self):
        with refused(pf.Refusal.GRAD_VALUE_INTO_INTEGER, r"integer tensor[\s\S]*aten\.fill_\.Tensor[\s\S]*"
                                    + _at_line(r"x\[0\] = self\.w\[1\]")):
            pf.export(GradValueWrittenIntoIntegerTensor(), (torch.zeros(2, 3, dtype=torch.long),))

    @torch_limit("torch's functional fill.Tensor cannot run under autograd with an integer self and a "
                 "value that requires grad (GRAD_VALUE_INTO_INTEGER)", raises=pf.UnsupportedError)
    def test_exports_and_replays(self):
        from tests.support.reference import export_checked

        export_checked(GradValueWrittenIntoIntegerTensor(), (torch.zeros(2, 3, dtype=torch.long),))

    def test_detached_value_exports(self):
        class Detached(GradValueWrittenIntoIntegerTensor):
            def forward(self, x):
                x[0] = self.w[1].detach()
                return x

        from tests.support.reference import export_checked

        export_checked(Detached(), (torch.zeros(2, 3, dtype=torch.long),))


class WriteThroughAsStridedOfAView(nn.Module):
    def forward(self, x):
        v = x[1:]
        w = v.as_strided((2, 2), (2, 1), 2)
        w.add_(1)
        return x


class TestWriteThroughAsStridedOfAView(TestCase):
    """torch 2.13's functionalization bans a write through a chain whose second view is
    as_strided (pytorch/pytorch#104505); torch.export fails the same way (found by fuzzing)."""

    def test_is_refused_naming_op_and_line(self):
        with refused(pf.Refusal.WRITE_THROUGH_AS_STRIDED_OF_VIEW, r"as_strided\(\) view taken of another view"
                                    r"[\s\S]*aten\.add_\.Tensor[\s\S]*" + _at_line(r"w\.add_\(1\)")):
            pf.export(WriteThroughAsStridedOfAView(), (torch.randn(6),))

    @torch_limit("torch's functionalization cannot replay a write through as_strided of a view "
                 "(WRITE_THROUGH_AS_STRIDED_OF_VIEW)", raises=pf.UnsupportedError)
    def test_exports_and_replays(self):
        from tests.support.reference import export_checked

        export_checked(WriteThroughAsStridedOfAView(), (torch.randn(6),))

    def test_as_strided_of_the_base_exports(self):
        class OfBase(nn.Module):
            def forward(self, x):
                w = x.as_strided((2, 2), (2, 1), 1)
                w.add_(1)
                return x

        from tests.support.reference import export_checked

        export_checked(OfBase(), (torch.randn(6),))
