"""scripts/run_torch_export_tests.py on a tiny stand-in for PyTorch's test file:
each test runs with both exporters, a hung test is cut at the time limit and the
next test still runs, failures are classed by what the failing line checks, and
the report lists what torch.export passes and we do not."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "run_torch_export_tests.py")

FAKE_TEST_FILE = textwrap.dedent('''
    import time
    import unittest

    import torch
    from torch._dynamo.test_case import TestCase
    from torch.export import export

    try:
        from . import testing
    except ImportError:
        import testing


    class M(torch.nn.Module):
        def forward(self, x):
            return x.sin() + 1


    class TestExport(TestCase):
        def test_passes(self):
            x = torch.randn(3)
            self.assertEqual(export(M(), (x,)).module()(x), M()(x))

        @testing.expectedFailureSerDer  # a marker of torch's variant files: ignored here
        def test_graph_text(self):
            export(M(), (torch.randn(3),))
            self.assertExpectedInline("torch" if export.__module__.startswith("torch") else "ours", """torch""")

        def test_expected_error(self):
            with self.assertRaisesRegex(ValueError, "only torch says this"):
                if export.__module__.startswith("torch"):
                    raise ValueError("only torch says this")
                export(M(), (torch.randn(3),))

        def test_hangs_with_ours(self):
            if not export.__module__.startswith("torch"):
                time.sleep(600)

        def test_skipped(self):
            self.skipTest("not here")

        def test_never_calls_export(self):
            torch.export.export(M(), (torch.randn(3),))
''')


def _load_runner():
    spec = importlib.util.spec_from_file_location("run_torch_export_tests", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.deep
def test_runner_end_to_end(tmp_path):
    folder = tmp_path / ".testexport"
    folder.mkdir()
    (folder / "test_export.py").write_text(FAKE_TEST_FILE)
    results = folder / "results.jsonl"
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, SCRIPT, "--test-file", str(folder / "test_export.py"),
                           "--results", str(results), "--timeout", "20"],
                          capture_output=True, text=True, env=env, timeout=280)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {(r["test"], r["exporter"]): r for r in map(json.loads, results.read_text().splitlines())}

    assert rows[("test_passes", "torch")]["status"] == "pass"
    assert rows[("test_passes", "ours")]["status"] == "pass"
    assert rows[("test_passes", "ours")]["export_calls"] == 1
    assert rows[("test_graph_text", "ours")]["category"] == "graph-text"
    assert rows[("test_expected_error", "ours")]["category"] == "expected-error"
    assert rows[("test_hangs_with_ours", "torch")]["status"] == "pass"
    assert rows[("test_hangs_with_ours", "ours")]["status"] == "timeout"
    # the worker was replaced: the tests after the hung one still ran
    assert rows[("test_skipped", "ours")]["status"] == "skip"
    assert rows[("test_never_calls_export", "ours")]["export_calls"] == 0

    # resumable: a second run finds nothing to do
    again = subprocess.run([sys.executable, SCRIPT, "--test-file", str(folder / "test_export.py"),
                            "--results", str(results)], capture_output=True, text=True, env=env, timeout=120)
    assert "0 (test, exporter) runs to do" in again.stdout

    report = tmp_path / "report.md"
    subprocess.run([sys.executable, SCRIPT, "--report", str(report), "--results", str(results)], check=True,
                   capture_output=True, text=True)
    text = report.read_text()
    for name in ("test_graph_text", "test_expected_error", "test_hangs_with_ours"):
        assert f"`{name}`" in text
    assert "| predispatch_func.export | 6 |" in text


def test_classify_uses_the_failing_statement(tmp_path):
    runner = _load_runner()
    src = tmp_path / "t.py"
    src.write_text(textwrap.dedent('''
        def f(self):
            self.assertExpectedInline(
                "a",
                "b",
            )

        def g(self):
            with self.assertRaisesRegex(ValueError, "x"):
                raise KeyError("y")

        def h(self):
            self.assertEqual(node.meta["nn_module_stack"], 1)
    '''))
    index = runner.SourceIndex(str(src))
    assert "assertExpectedInline" in index.statement(4)
    assert index.in_assert_raises(10) and not index.in_assert_raises(13)
    assert "nn_module_stack" in index.statement(13)


def test_every_failure_left_has_a_disposition_or_reads_unexplained():
    runner = _load_runner()
    listed = {"test": "test_device_to_static", "status": "fail", "category": "graph-text"}
    assert runner.disposition(listed)[0] == "graph text"
    # a graph-text disposition holds only where the failing line checks graph text
    assert runner.disposition({**listed, "category": "semantic"})[0] == runner.UNEXPLAINED
    assert runner.disposition({"test": "test_not_listed", "status": "error"})[0] == runner.UNEXPLAINED
    lines = "\n".join(runner.disposition_lines([listed, {"test": "test_not_listed", "status": "error"}], "x"))
    assert "**1 unexplained**" in lines and "| `test_not_listed` | UNEXPLAINED |" in lines


def test_strict_only_comes_from_torch_s_non_strict_result_never_from_a_list():
    runner = _load_runner()
    seen = []
    calls = runner.ExportCalls()
    forced = runner.make_nonstrict(lambda *a, **k: seen.append(k), calls)
    forced("m", ("x",), strict=True)
    forced("m", ("x",))
    assert seen == [{"strict": False}, {"strict": False}] and calls.calls == 2 and calls.dropped == {"strict=True"}

    ours = {"test": "test_device_to_static", "status": "fail", "category": "graph-text"}
    failed = {"test": "test_device_to_static", "exporter": runner.NONSTRICT, "status": "fail",
              "reason": "AssertionError: Unsupported not raised"}
    kind, why = runner.disposition({**ours, "nonstrict": failed})
    assert kind == "strict-only" and "Unsupported not raised" in why
    # torch's non-strict export passing it: the list decides, as without the reference row
    assert runner.disposition({**ours, "nonstrict": {**failed, "status": "pass"}})[0] == "graph text"
    # a hand-listed strict-only test without a failing reference row reads as unexplained
    runner.DISPOSITIONS["test_listed_strict_only"] = ("strict-only", "said so")
    try:
        assert runner.disposition({"test": "test_listed_strict_only", "status": "fail"})[0] == runner.UNEXPLAINED
    finally:
        del runner.DISPOSITIONS["test_listed_strict_only"]
