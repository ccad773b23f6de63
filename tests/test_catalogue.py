"""The edge-case catalogue (tests/support/cases_core.py) is whole: every exported case is pinned
by a test somewhere under tests/, every refused case raises its refusal kind."""

from pathlib import Path

from expecttest import TestCase

import predispatch_func as pf
from tests.support.cases_core import CASES, REFUSED


class TestCatalogue(TestCase):
    def test_every_catalogue_case_is_exported_by_a_test(self):
        """scripts/compare_torch_paths.py reports on CASES; each must be pinned by a test."""
        text = "".join(p.read_text() for p in Path(__file__).parent.rglob("test_*.py"))
        self.assertEqual([n for n in CASES if f'export_case("{n}"' not in text], [])
        self.assertGreaterEqual(len(CASES), 45)


class TestRefusedCatalogue(TestCase):
    def test_every_refused_case_raises_unsupported(self):
        """The refused half of the catalogue (also run by scripts/compare_torch_paths.py)."""
        for name, case in REFUSED.items():
            with self.subTest(name):
                model, args, kwargs = case.build()
                with self.assertRaisesRegex(pf.UnsupportedError, r"t_|unsqueeze_|shares? memory") as caught:
                    pf.export(model, args, kwargs)
                self.assertIs(caught.exception.kind, case.refused)
