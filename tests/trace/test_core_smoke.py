"""First edge cases of the core exporter; the full catalogue is tests/support/cases_core.py (tests/test_catalogue.py)."""

import torch
from expecttest import TestCase

import predispatch_func as pf
from tests.support.expect_refusal import refused
from tests.support.reference import export_checked, graph_code


class TypeAsThenInplace(torch.nn.Module):
    def forward(self, x, z):
        y = x.type_as(z)
        y.mul_(3)
        return y + 1


class TestCoreSmoke(TestCase):
    def test_type_as_alias_mutation_reaches_input(self):
        ep = export_checked(TypeAsThenInplace(), (torch.randn(3), torch.randn(3)))
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, x, z):
    mul = torch.ops.aten.mul.Tensor(x, 3);  x = None
    add = torch.ops.aten.add.Tensor(mul, 1)
    return (mul, add)""")

    def test_autocast_left_enabled_is_refused_with_source_line(self):
        class LeavesAutocast(torch.nn.Module):
            def forward(self, x):
                torch.autocast("cpu", dtype=torch.bfloat16).__enter__()
                return x * 2

        try:
            with refused(pf.Refusal.MODE_LEFT_CHANGED, r"leaves autocast[\s\S]*test_core_smoke.py"):
                pf.export(LeavesAutocast(), (torch.randn(2),))
        finally:
            torch.set_autocast_enabled("cpu", False)
        self.assertFalse(torch.is_autocast_enabled("cpu"))

    def test_verify_catches_a_wrong_program(self):
        class AddOne(torch.nn.Module):
            def forward(self, x):
                return x + 1

        class AddTwo(torch.nn.Module):
            def forward(self, x):
                return x + 2

        ep = pf.export(AddOne(), (torch.randn(3),))
        report = pf.verify(ep, AddTwo(), (torch.randn(3),))
        self.assertFalse(report.ok)
        with self.assertRaises(pf.VerificationError):
            pf.verify(ep, AddTwo(), (torch.randn(3),), raise_on_failure=True)
