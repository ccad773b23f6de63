"""PyTorch's ``TestExport`` with ``export`` swapped for ours, as torch's variant suites do.

torch runs ``test/export/test_export.py``'s ``TestExport`` again in variant files
(``test_export_nonstrict.py``, ``test_serdes.py``, ...) that patch the name
``export`` the test module imported (``patch("test_export.export", mocked)``,
see torch's ``test/export/testing.py``). This runner does the same with
``predispatch_func.export`` and runs each test twice, once as is (torch.export)
and once with ours, so a table can list every test torch.export passes and we
do not.

The test file is PyTorch's code: the developer reads it in (never committed)::

    mkdir -p .testexport && curl -L -o .testexport/test_export.py \\
      https://raw.githubusercontent.com/pytorch/pytorch/<commit>/test/export/test_export.py

Its sibling ``testing.py`` only supplies decorators that mark expected failures
of torch's own variants; the runner provides a stand-in (``_testing_shim``) so a
newer test file never needs a matching sibling.

Tests run in one worker process (imports are paid once); the parent sends one
(exporter, test) at a time and waits at most ``--timeout`` seconds for its
result. A test that runs over, or a worker that dies, is recorded (``timeout``,
``crash``), the worker's process group is killed and a fresh worker takes the
rest. Results go to a jsonl (one line per test and exporter), so an interrupted
run resumes where it stopped.

Usage::

    python scripts/run_torch_export_tests.py [--test-file .testexport/test_export.py]
        [--torch-export-only | --ours-only] [-k REGEX] [--limit N] [--timeout 60]
    python -m scripts.run_torch_export_tests --report docs/runs/torch_export_tests.md \\
        --results .testexport/results-torch-2.13.0.jsonl .testexport/results-torch-2.15.0.jsonl
"""

from __future__ import annotations

import argparse
import ast
import collections
import functools
import json
import os
import re
import select
import signal
import subprocess
import sys
import time
import traceback
import types

try:
    from scripts.torch_export_dispositions import DISPOSITIONS, GRAPH_TEXT, REGION_HOP, STRICT_ONLY
except ImportError:  # run as a file, without the repository root on the path: its folder is
    from torch_export_dispositions import DISPOSITIONS, GRAPH_TEXT, REGION_HOP, STRICT_ONLY  # type: ignore[no-redef]

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_DIR = os.path.join(_ROOT, ".testexport")
TEST_CLASS = "TestExport"
EXPORTERS = ("torch", "ours")
# "torch-nonstrict": torch.export with `strict=False` forced on every call, as torch's own
# test_export_nonstrict.py runs the file; a reference row (--torch-nonstrict) that says which tests
# only Dynamo's strict capture passes, so the report can call them strict-only from a result
NONSTRICT = "torch-nonstrict"
# "ours-all": ours also behind `torch.export.export`, which about a fifth of TestExport calls by name
# (torch's variant files leave those calls alone); an extra, stricter run with --patch-torch-export
OURS_ALL = "ours-all"

# keywords of torch.export.export that predispatch_func.export takes as they are
_PASSED_KWARGS = ("dynamic_shapes", "preserve_module_call_signature")


# --- the swapped export ---------------------------------------------------------------


class ExportCalls:
    """What the swapped-in ``export`` saw during one test: how often it ran, and
    which keywords of torch.export.export it dropped because ours lacks them."""

    def __init__(self) -> None:
        self.calls = 0
        self.dropped: set[str] = set()


def make_ours(calls: ExportCalls):
    """``torch.export.export``'s signature mapped onto ``predispatch_func.export``."""
    import predispatch_func as pf

    @functools.wraps(pf.export)
    def export(mod, args=(), kwargs=None, *, dynamic_shapes=None, strict=False,
               preserve_module_call_signature=(), prefer_deferred_runtime_asserts_over_guards=False, **rest):
        calls.calls += 1
        if strict:
            calls.dropped.add("strict=True")
        for name, value in rest.items():
            if value not in (None, False, ()):
                calls.dropped.add(f"{name}={value!r}"[:80])
        return pf.export(mod, args, kwargs, dynamic_shapes=dynamic_shapes,
                         preserve_module_call_signature=tuple(preserve_module_call_signature or ()),
                         prefer_deferred_runtime_asserts_over_guards=prefer_deferred_runtime_asserts_over_guards)

    return export


def make_nonstrict(fn, calls: ExportCalls):
    """torch.export with ``strict=False`` forced, as torch's ``test_export_nonstrict.py`` swaps it in."""
    @functools.wraps(fn)
    def export(*args, **kwargs):
        calls.calls += 1
        if kwargs.get("strict"):
            calls.dropped.add("strict=True")
        kwargs["strict"] = False
        return fn(*args, **kwargs)

    return export


def make_counted(fn, calls: ExportCalls):
    @functools.wraps(fn)
    def export(*args, **kwargs):
        calls.calls += 1
        return fn(*args, **kwargs)

    return export


def _testing_shim() -> types.ModuleType:
    """Stand-in for torch's ``test/export/testing.py``: its ``expectedFailure*``
    decorators only mark tests for torch's variant files, so each one here sets
    its marker and returns the test unchanged, whatever its name."""
    mod = types.ModuleType("testing")

    def __getattr__(name: str):
        if name.startswith(("expectedFailure", "xfail")):
            def mark(fn):
                setattr(fn, "_" + name, True)
                return fn
            return mark
        raise AttributeError(name)

    mod.__getattr__ = __getattr__  # type: ignore[attr-defined]
    return mod


# --- failure classification -----------------------------------------------------------


class SourceIndex:
    """Statements of the test file by line, to say what a failing line was doing."""

    def __init__(self, path: str) -> None:
        with open(path) as f:
            self.text = f.read()
        self.tree = ast.parse(self.text)
        self.stmts: list[ast.stmt] = [n for n in ast.walk(self.tree) if isinstance(n, ast.stmt)]
        self.raises_blocks: list[tuple[int, int]] = []
        for node in ast.walk(self.tree):
            if isinstance(node, ast.With) and any(_is_assert_raises(i.context_expr) for i in node.items):
                self.raises_blocks.append((node.lineno, node.end_lineno or node.lineno))

    def statement(self, line: int) -> str:
        """The innermost simple statement that spans ``line`` (a multi-line call whole)."""
        best = None
        for s in self.stmts:
            if isinstance(s, (ast.With, ast.For, ast.While, ast.If, ast.Try, ast.FunctionDef, ast.ClassDef)):
                continue
            if s.lineno <= line <= (s.end_lineno or s.lineno):
                if best is None or (s.end_lineno - s.lineno) < (best.end_lineno - best.lineno):
                    best = s
        return ast.get_source_segment(self.text, best) or "" if best is not None else ""

    def in_assert_raises(self, line: int) -> bool:
        return any(a <= line <= b for a, b in self.raises_blocks)

    def line(self, line: int) -> str:
        lines = self.text.splitlines()
        return lines[line - 1].strip() if 0 < line <= len(lines) else ""


def _is_assert_raises(expr: ast.expr) -> bool:
    return (isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute)
            and expr.func.attr.startswith(("assertRaises", "assertWarns")))


_GRAPH_TEXT = re.compile(r"assertExpected|FileCheck|\.code\b|print_readable|str\([^)]*graph|graph\)\.strip|"
                         r"\.name\b|format_node|normalize_gm|_graph_str|node\.target|find_nodes|"
                         r"torch\.ops\.\w+\.\w+\.\w+|\bops\b|_nodes\b|names\b|names_and_ops")  # printed graphs, names, ops
_METADATA = re.compile(r"\.meta\b|meta\[|nn_module_stack|stack_trace|source_fn|torch_fn|from_node|"
                       r"graph_signature|input_specs|output_specs|range_constraints|module_call_graph|"
                       r"module_call_signature|constants\b|state_dict|example_inputs|custom\b")


def classify(exc: BaseException, tb, test_file: str, index: SourceIndex) -> tuple[str, str]:
    """(category, the failing statement of the test file) for one failure of ours.

    - "expected-error": inside ``with self.assertRaises*`` or its own message
      ("not raised", "does not match"): another error, or none, where one was due;
    - "graph-text": a printed graph or node names compared (assertExpectedInline,
      FileCheck, ``gm.code``, ``node.name``);
    - "metadata": node.meta, the graph signature, range constraints, module call graph;
    - "semantic": everything else (the export itself raised, values differ, ...)."""
    frames = [f for f in traceback.extract_tb(tb) if os.path.abspath(f.filename) == test_file]
    line = frames[-1].lineno if frames else 0
    stmt = index.statement(line) if line else ""
    msg = str(exc)
    names = [f.name for f in traceback.extract_tb(tb)]
    if (isinstance(exc, AssertionError) and (" not raised" in msg or "does not match" in msg)) \
            or (line and index.in_assert_raises(line)):
        return "expected-error", stmt or index.line(line)
    if isinstance(exc, AssertionError) and ("assertExpectedInline" in names or "assertExpected" in names):
        return "graph-text", stmt
    if isinstance(exc, (AssertionError, RuntimeError)) and _GRAPH_TEXT.search(stmt) \
            and not _METADATA.search(stmt):
        return "graph-text", stmt
    if isinstance(exc, (AssertionError, KeyError, AttributeError)) and _METADATA.search(stmt):
        return "metadata", stmt
    if isinstance(exc, AssertionError) and _GRAPH_TEXT.search(stmt):
        return "graph-text", stmt
    return "semantic", stmt


def first_line(exc: BaseException) -> str:
    text = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
    text = text.split("To execute this test, run the following")[0].strip()  # torch's TestCase adds it
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return f"{type(exc).__name__}: {line}"[:300]


# --- the worker -----------------------------------------------------------------------


def _load_test_module(test_file: str):
    """Import the test file by name: its folder is on the worker's PYTHONPATH (``Worker``), so
    the file's own imports of its neighbours resolve as in torch's tree."""
    sys.modules["testing"] = _testing_shim()
    import importlib

    return importlib.import_module(os.path.splitext(os.path.basename(test_file))[0])


def list_tests(test_file: str) -> list[str]:
    """Test names of TestExport in file order (without importing torch)."""
    tree = ast.parse(open(test_file).read())
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == TEST_CLASS:
            return list(dict.fromkeys(  # a name defined twice runs once, as unittest sees it
                f.name for f in node.body
                if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.name.startswith("test_")))
    raise SystemExit(f"no class {TEST_CLASS} in {test_file}")


def worker(test_file: str, result_fd: int) -> None:
    import unittest
    from unittest.mock import patch

    import torch

    torch.set_num_threads(1)
    out = os.fdopen(result_fd, "w", buffering=1)  # stdout/stderr are the tests' (a log)
    mod = _load_test_module(test_file)
    index = SourceIndex(test_file)
    cls = getattr(mod, TEST_CLASS)
    torch_export = mod.export
    out.write(json.dumps({"ready": True, "torch": torch.__version__}) + "\n")

    class Result(unittest.TestResult):
        def __init__(self) -> None:
            super().__init__()
            self.outcome: tuple[str, BaseException | None, object] = ("pass", None, None)

        def addFailure(self, test, err):  # noqa: N802
            self.outcome = ("fail", err[1], err[2])

        def addError(self, test, err):  # noqa: N802
            self.outcome = ("error", err[1], err[2])

        def addSkip(self, test, reason):  # noqa: N802
            self.outcome = ("skip", unittest.SkipTest(reason), None)

        def addExpectedFailure(self, test, err):  # noqa: N802
            self.outcome = ("xfail", err[1], err[2])

        def addUnexpectedSuccess(self, test):  # noqa: N802
            self.outcome = ("xpass", None, None)

        def addSubTest(self, test, subtest, err):  # noqa: N802
            if err is not None and self.outcome[0] == "pass":
                kind = "fail" if issubclass(err[0], test.failureException) else "error"
                self.outcome = (kind, err[1], err[2])

    for request in sys.stdin:
        exporter, name = request.split()
        calls = ExportCalls()
        fn = (make_ours(calls) if exporter in ("ours", OURS_ALL)
              else make_nonstrict(torch_export, calls) if exporter == NONSTRICT
              else make_counted(torch_export, calls))
        result = Result()
        start = time.monotonic()
        with patch.object(mod, "export", fn), \
                patch.object(torch.export, "export", fn if exporter == OURS_ALL else torch.export.export):
            unittest.TestSuite([cls(name)]).run(result)
        status, exc, tb = result.outcome
        row = {"test": name, "exporter": exporter, "status": status,
               "secs": round(time.monotonic() - start, 2), "export_calls": calls.calls,
               "dropped": sorted(calls.dropped)}
        if exc is not None:
            row["reason"] = first_line(exc) if status != "skip" else str(exc)[:300]
        if status in ("fail", "error") and exc is not None:
            row["category"], stmt = classify(exc, tb, os.path.abspath(test_file), index)
            row["statement"] = stmt.strip().splitlines()[0][:200] if stmt.strip() else ""
        out.write(json.dumps(row) + "\n")


# --- the parent -----------------------------------------------------------------------


class Worker:
    """One worker process; ``run`` gives a result row, or None when the time ran out
    or the worker died (the worker is then gone and must be replaced)."""

    def __init__(self, test_file: str, python: str, log) -> None:
        r, w = os.pipe()
        self.proc = subprocess.Popen([python, os.path.abspath(__file__), "--worker", str(w), "--test-file", test_file],
                                     stdin=subprocess.PIPE, stdout=log, stderr=log, text=True,
                                     pass_fds=(w,), start_new_session=True,
                                     env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                         [os.path.dirname(os.path.abspath(test_file)), _ROOT,
                                          os.environ.get("PYTHONPATH", "")])},
                                     )
        os.close(w)
        self.results = os.fdopen(r, "r")
        self.buf = ""

    def _line(self, timeout: float) -> dict | None:
        deadline = time.monotonic() + timeout
        while "\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.results], [], [], left)[0]:
                return None
            chunk = os.read(self.results.fileno(), 65536).decode()
            if not chunk:
                return None
            self.buf += chunk
        line, self.buf = self.buf.split("\n", 1)
        return json.loads(line)

    def ready(self, timeout: float) -> dict | None:
        return self._line(timeout)

    def run(self, exporter: str, name: str, timeout: float) -> dict | None:
        try:
            self.proc.stdin.write(f"{exporter} {name}\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            return None
        return self._line(timeout)

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        self.results.close()


def load_results(path: str) -> dict[tuple[str, str], dict]:
    rows: dict[tuple[str, str], dict] = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                if line.strip():
                    row = json.loads(line)
                    if "test" in row:
                        rows[(row["test"], row["exporter"])] = row
    return rows


def torch_version(python: str) -> str:
    return subprocess.run([python, "-c", "import torch; print(torch.__version__.split('+')[0])"],
                          capture_output=True, text=True, check=True).stdout.strip()


def run(args) -> None:
    test_file = os.path.abspath(args.test_file)
    version = torch_version(args.python)
    results_path = args.results[0] if args.results else os.path.join(DEFAULT_DIR, f"results-torch-{version}.jsonl")
    os.makedirs(os.path.dirname(results_path), exist_ok=True)
    done = load_results(results_path)
    names = list_tests(test_file)
    if args.k:
        names = [n for n in names if re.search(args.k, n)]
    if args.limit:
        names = names[:args.limit]
    exporters = ["torch"] if args.torch_export_only else ["ours"] if args.ours_only else list(EXPORTERS)
    if args.patch_torch_export:
        exporters = [OURS_ALL]
    if args.torch_nonstrict:
        exporters = [NONSTRICT]

    def wanted(n: str, e: str) -> bool:
        if args.rerun:
            return True
        if args.rerun_failed:
            return (n, e) in done and done[(n, e)]["status"] in ("fail", "error")
        return (n, e) not in done

    todo = [(n, e) for n in names for e in exporters if wanted(n, e)]
    print(f"torch {version}: {len(names)} tests, {len(todo)} (test, exporter) runs to do -> {results_path}",
          flush=True)
    log = open(os.path.join(os.path.dirname(results_path), f"worker-torch-{version}.log"), "a")
    sink = open(results_path, "a")
    w: Worker | None = None
    counts: collections.Counter[str] = collections.Counter()
    for i, (name, exporter) in enumerate(todo, 1):
        if w is None:
            w = Worker(test_file, args.python, log)
            hello = w.ready(args.import_timeout)
            if hello is None:
                w.kill()
                raise SystemExit(f"the worker did not import {test_file}; see {log.name}")
        start = time.monotonic()
        row = w.run(exporter, name, args.timeout)
        if row is None:
            dead = w.proc.poll() is not None
            w.kill()
            w = None
            row = {"test": name, "exporter": exporter, "secs": round(time.monotonic() - start, 2),
                   "status": "crash" if dead else "timeout",
                   "reason": "the worker died" if dead else f"over the {args.timeout:g} s limit"}
        row["torch"] = version
        sink.write(json.dumps(row) + "\n")
        sink.flush()
        counts[f"{exporter}:{row['status']}"] += 1
        print(f"[{i}/{len(todo)}] {exporter:5} {row['status']:7} {row['secs']:6.1f}s {name}"
              + (f"  -- {row.get('reason', '')[:120]}" if row["status"] not in ("pass", "skip") else ""),
              flush=True)
    if w is not None:
        w.kill()
    print(dict(sorted(counts.items())))


# --- the report -----------------------------------------------------------------------

UNEXPLAINED = "UNEXPLAINED"
_OK = ("pass", "xfail", "xpass")

CATEGORIES = (("graph-text", "graph text / node names"), ("metadata", "metadata"),
              ("semantic", "semantic"), ("expected-error", "expected an error, got another/none"))

THEMES = (  # first match wins; the test name and our first error line are searched
    ("timeouts (our export hangs)", lambda r: r["status"] in ("timeout", "crash")),
    ("derived Dims (dx + 1, 2*dx, dx*dy) refused", lambda r: "derived dims are not supported" in r.get("reason", "")),
    ("Python state of the model refused (python_state='error')", lambda r: re.search(
        r"changes (the contents of )?attribute|writes to tensor attribute", r.get("reason", ""))),
    ("errors expected (another error, or none)", lambda r: r.get("category") == "expected-error"),
    ("unbacked ints / data-dependent", lambda r: re.search(
        r"unbacked|item|data.dependent|nonzero|masked_select|tolist|_check|\bu\d+\b|constrain|runtime_assert|"
        r"bincount|sym_or|guard_on_data", r["test"] + " " + r.get("reason", ""), re.I)),
    ("dynamic shapes / Dim", lambda r: re.search(
        r"dynamic|dim\b|_dim|shape|symint|symbolic|derived|range|specializ|Dim '|VR\[", r["test"] + " " + r.get("reason", ""),
        re.I)),
    ("HOPs and regions (cond, map, scan, while_loop, vmap, set_grad, autocast)", lambda r: re.search(
        r"cond|while_loop|\bmap\b|scan|hop|higher.order|invoke_subgraph|associative|wrap_with|vmap|set_grad|"
        r"autocast|"
        r"hints", r["test"] + " " + r.get("reason", ""), re.I)),
    ("custom ops / subclasses / real-tensor propagation", lambda r: re.search(
        r"custom|torchbind|subclass|opaque|triton|script|fake|twotensor|library|real_tensor|draft",
        r["test"] + " " + r.get("reason", ""), re.I)),
    ("module call signature / unflatten", lambda r: re.search(
        r"preserve_module|unflatten|module_call|swap", r["test"] + " " + r.get("reason", ""), re.I)),
    ("distributed collectives (effect tokens)", lambda r: re.search(r"distributed|c10d", r["test"] + " " +
                                                                    r.get("reason", ""))),
    ("state: attributes, constants, buffers, leaks", lambda r: re.search(
        r"state|constant|buffer|param|attr|leak|lifted|lazy|hook|tensor_attribute",
        r["test"] + " " + r.get("reason", ""), re.I)),
    ("device / dtype conversion ops (aten.to)", lambda r: re.search(r"device_to|float_conversion|\bto\b",
                                                                    r["test"], re.I)),
    ("graph text / node names", lambda r: r.get("category") == "graph-text"),
    ("metadata", lambda r: r.get("category") == "metadata"),
    ("other", lambda r: True),
)


def theme(row: dict) -> str:
    return next(name for name, pred in THEMES if pred(row))


def _table_row(label: str, rows: list[dict]) -> str:
    st = collections.Counter(r["status"] for r in rows)
    cat = collections.Counter(r.get("category") for r in rows if r["status"] in ("fail", "error"))
    cells = [label, len(rows), st["pass"] + st["xfail"] + st["xpass"], cat["graph-text"], cat["metadata"],
             cat["semantic"], cat["expected-error"], st["timeout"] + st["crash"], st["skip"]]
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("`", "'").replace("\n", " ")


def torch_section(rows: dict[tuple[str, str], dict], names: list[str]) -> list[str]:
    """The table and the list of tests torch.export passes and we do not, for one torch."""
    version = next(iter(rows.values())).get("torch", "?")
    both = [n for n in names if (n, "torch") in rows and (n, "ours") in rows]
    ok = ("pass", "xfail", "xpass")
    torch_ok = [n for n in both if rows[(n, "torch")]["status"] in ok]
    lost = [rows[(n, "ours")] for n in torch_ok if rows[(n, "ours")]["status"] not in ok]
    gained = [n for n in both if rows[(n, "torch")]["status"] not in ok + ("skip",)
              and rows[(n, "ours")]["status"] in ok]
    torch_bad = [rows[(n, "torch")] for n in both if rows[(n, "torch")]["status"] not in ok + ("skip",)]
    unexercised = [n for n in torch_ok if rows[(n, "ours")]["status"] in ok
                   and rows[(n, "ours")].get("export_calls", 0) == 0]
    dropped = collections.Counter(d for n in both for d in rows[(n, "ours")].get("dropped", ()))
    lines = [f"## torch {version}", "",
             f"{len(both)} tests of `{TEST_CLASS}` run with both exporters "
             f"(columns: how each test ended; a test that fails counts once, in the class of its first failure).",
             "",
             "| export | tests | pass | fails on graph text / node names | fails on metadata | fails semantically "
             "| expected an error, got another/none | timeouts | skipped |",
             "|---|---|---|---|---|---|---|---|---|",
             _table_row("torch.export.export", [rows[(n, "torch")] for n in both]),
             _table_row("predispatch_func.export", [rows[(n, "ours")] for n in both]),
             _table_row("ours, on the tests torch.export passes", [rows[(n, "ours")] for n in torch_ok])]
    nonstrict_rows = [rows[(n, NONSTRICT)] for n in both if (n, NONSTRICT) in rows]
    if nonstrict_rows:
        lines.insert(-2, _table_row("torch.export, `strict=False` forced (reference for strict-only tests)",
                                    nonstrict_rows))
    all_rows = [rows[(n, OURS_ALL)] for n in torch_ok if (n, OURS_ALL) in rows]
    if all_rows:
        lines.append(_table_row("ours also behind `torch.export.export`, on the tests torch.export passes",
                                all_rows))
    lines += ["",
             f"- torch.export passes {len(torch_ok)}; we pass {len(torch_ok) - len(lost)} of those and do not pass "
             f"**{len(lost)}** (listed below).",
             f"- {len(unexercised)} of our passes never reached our `export` (the test calls `torch.export.export`, "
             "`_export` or `export_for_training` by name, which torch's own variant files leave alone too): they say "
             "nothing about ours. Tests that call both count as ours.",
             f"- Tests we pass and torch.export does not: {', '.join(f'`{n}`' for n in gained) or 'none'}.",
             "- Keywords of torch.export.export ours does not take (dropped, with the number of tests): "
             + (", ".join(f"`{k}` ({v})" for k, v in dropped.most_common()) or "none") + ".",
             f"- Tests torch.export itself does not pass with this torch ({len(torch_bad)}; the test file is "
             "newer than some releases, so these say nothing about ours):"]
    lines += [f"  - `{r['test']}` ({r['status']}): {_md(r.get('reason', ''))[:110]}" for r in torch_bad]
    lines.append("")
    if all_rows:
        more = [r for r in all_rows if r["status"] not in ok and rows[(r["test"], "ours")]["status"] in ok]
        lines += [f"With `--patch-torch-export` (ours also behind `torch.export.export`, which the tests call by "
                  f"name), {len(more)} more tests that torch.export passes fail with ours:", ""]
        lines += [f"- `{r['test']}` ({r['status']}, {r.get('category', r['status'])}): {_md(r.get('reason', ''))}"
                  for r in more]
        lines.append("")
    for r in lost:  # the strict-only reference travels with the row the dispositions judge
        if (r["test"], NONSTRICT) in rows:
            r["nonstrict"] = rows[(r["test"], NONSTRICT)]
    lines += disposition_lines(lost, version)
    by_theme: dict[str, list[dict]] = collections.defaultdict(list)
    for r in lost:
        by_theme[theme(r)].append(r)
    ordered = sorted(by_theme.items(), key=lambda kv: -len(kv[1]))
    lines += [f"### Tests torch.export passes and we do not (torch {version}), by theme", "",
              "| theme | tests |", "|---|---|"]
    lines += [f"| {t} | {len(rs)} |" for t, rs in ordered]
    lines.append("")
    for t, rs in ordered:
        lines += [f"#### {t} ({len(rs)})", ""]
        for r in rs:
            extra = f"; dropped {', '.join(r['dropped'])}" if r.get("dropped") else ""
            lines.append(f"- `{r['test']}` ({r['status']}, {r.get('category', r['status'])}{extra}; "
                         f"{disposition(r)[0]}): {_md(r.get('reason', ''))}")
        lines.append("")
    return lines


def disposition(row: dict) -> tuple[str, str]:
    """(kind, reason) for one test torch.export passes and ours does not.

    *strict-only* comes from the result of the same test with torch.export, ``strict=False`` forced
    (``row["nonstrict"]``, the --torch-nonstrict row), never from a list: torch's own non-strict
    export fails it too. Everything else is read from scripts/torch_export_dispositions.py; a
    graph-text disposition holds only where the runner classed the failing line as graph text too,
    else it reads as unexplained."""
    ref = row.get("nonstrict")
    if ref is not None and ref["status"] not in _OK + ("skip",):
        return STRICT_ONLY, f"torch.export with strict=False fails it too: {ref.get('reason', ref['status'])}"
    kind, why = DISPOSITIONS.get(row["test"], (UNEXPLAINED, "no disposition in scripts/torch_export_dispositions.py"))
    if kind == STRICT_ONLY:
        return UNEXPLAINED, ("listed as strict-only, but no torch.export strict=False result fails it"
                             " (run --torch-nonstrict)")
    if kind in (GRAPH_TEXT, REGION_HOP) and row.get("category") != "graph-text":
        return UNEXPLAINED, f"listed as {kind}, but the failing line checks {row.get('category', row['status'])}"
    return kind, why


def disposition_lines(lost: list[dict], version: str) -> list[str]:
    """Every test torch.export passes and we do not, with why it is left so."""
    kinds = collections.Counter(disposition(r)[0] for r in lost)
    lines = [f"### Disposition of each test torch.export passes and we do not (torch {version})", "",
             f"From `scripts/torch_export_dispositions.py`; **{kinds[UNEXPLAINED]} unexplained**.", "",
             "| disposition | tests |", "|---|---|"]
    lines += [f"| {k} | {n} |" for k, n in kinds.most_common()]
    lines += ["", "| test | disposition | why |", "|---|---|---|"]
    for r in sorted(lost, key=lambda r: (disposition(r)[0], r["test"])):
        kind, why = disposition(r)
        lines.append(f"| `{r['test']}` | {kind} | {_md(why)} |")
    lines.append("")
    return lines


def report(paths: list[str], out: str, source: str) -> None:
    here = os.path.relpath(__file__, _ROOT)
    lines = ["# PyTorch's `TestExport` with `export` swapped for ours", "",
             f"Generated by `{here} --report` (do not edit by hand). The yardstick is PyTorch's own",
             "`test/export/test_export.py`, class `TestExport`, which torch also runs with the `export` name swapped",
             "(`test_export_nonstrict.py`, `test_serdes.py`, ...). Each test runs twice in the same worker, as it is",
             "(`torch.export.export`) and with `test_export.export` patched to `predispatch_func.export` (the test",
             "names are unchanged, so the tests take their non-strict branches); a test over the time limit is",
             "killed with its worker and recorded as a timeout.", "",
             f"- Test file: {source}. It is PyTorch's code and is never committed; read it in as below.",
             "- Keywords of `torch.export.export` that `predispatch_func.export` does not honour are dropped per",
             "  call (`strict=True`: ours always traces non-strict) and counted below.",
             "- A failure of ours is classed by what the failing line of the test checks: *graph text / node names*",
             "  (`assertExpectedInline`, `FileCheck`, `gm.code`, node names, lists of op targets), *metadata*",
             "  (`node.meta`, graph signature, range constraints, constants), *expected an error* (inside",
             "  `assertRaises*`/`assertWarns*`, or 'not raised'), *semantic* (everything else: our export raised,",
             "  values or shapes differ, ...). Themes are keyword heuristics over the test name and our error.", "",
             "Reproduce (one process; two CPU cores are enough; about 10 minutes a torch):", "",
             "```bash",
             "mkdir -p .testexport && curl -L -o .testexport/test_export.py \\",
             "  https://raw.githubusercontent.com/pytorch/pytorch/00131b6bd4bedfa71eb27b407292be0ba45e5ee8/test/export/test_export.py",
             "PY=~/.cache/predispatch-func-ci/torch-2.13.0/bin/python   # any venv with torch and this package",
             f"PYTHONPATH=. $PY {here} --timeout 60           # -> .testexport/results-torch-2.13.0.jsonl",
             f"PYTHONPATH=. $PY {here} -k 'test_cond' --rerun   # a subset again; --ours-only, --limit N",
             f"PYTHONPATH=. $PY {here} --ours-only --rerun      # after a change of ours: torch.export's rows stand",
             f"PYTHONPATH=. $PY {here} --patch-torch-export --rerun  # ours also behind torch.export.export (extra row)",
             f"PYTHONPATH=. $PY {here} --torch-nonstrict --rerun  # torch.export, strict=False forced (strict-only row)",
             "PYTHONPATH=. python3 -m scripts.run_torch_export_tests --report docs/runs/torch_export_tests.md \\",
             "  --results .testexport/results-torch-2.13.0.jsonl .testexport/results-torch-2.15.0.jsonl",
             "```", ""]
    lost: set[str] = set()
    for path in paths:
        rows = load_results(path)
        if rows:
            lines += torch_section(rows, list(dict.fromkeys(t for t, _ in rows)))
            lost |= {t for (t, e), r in rows.items() if e == "ours" and r["status"] not in _OK
                     and rows.get((t, "torch"), {}).get("status") in _OK}
    stale = sorted(set(DISPOSITIONS) - lost)
    lines += ["## Dispositions of tests that now pass", "",
              "Entries of `scripts/torch_export_dispositions.py` for tests ours passes on every torch above "
              "(to be removed): " + (", ".join(f"`{t}`" for t in stale) or "none") + "."]
    with open(out, "w") as f:
        f.write("\n".join(lines).rstrip() + "\n")
    print(f"wrote {out}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--test-file", default=os.path.join(DEFAULT_DIR, "test_export.py"))
    p.add_argument("--results", nargs="+", help="jsonl of results (default .testexport/results-torch-<v>.jsonl); "
                   "with --report, one per torch")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--torch-export-only", action="store_true")
    g.add_argument("--ours-only", action="store_true")
    p.add_argument("-k", help="only tests whose name matches this regex")
    p.add_argument("--limit", type=int, help="only the first N tests (after -k)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per test and exporter (default 60)")
    p.add_argument("--import-timeout", type=float, default=300.0, help="seconds for a worker to import the file")
    p.add_argument("--rerun", action="store_true", help="run tests that already have a result again")
    p.add_argument("--rerun-failed", action="store_true", help="run again only what failed or raised last time (not timeouts)")
    p.add_argument("--torch-nonstrict", action="store_true",
                   help=f"run torch.export with strict=False forced (results as exporter {NONSTRICT!r}): the "
                   "reference that makes a test strict-only in the report")
    p.add_argument("--patch-torch-export", action="store_true",
                   help=f"run ours also behind torch.export.export (results as exporter {OURS_ALL!r})")
    p.add_argument("--python", default=sys.executable, help="the interpreter (and so the torch) to test with")
    p.add_argument("--report", metavar="MD", help="write the markdown report from --results and stop")
    p.add_argument("--source", default="pytorch/pytorch `test/export/test_export.py` at commit "
                   "`00131b6bd4bedfa71eb27b407292be0ba45e5ee8`", help="where the test file came from, for the report")
    p.add_argument("--worker", type=int, metavar="FD", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker is not None:
        worker(os.path.abspath(args.test_file), args.worker)
    elif args.report:
        report(args.results or [], args.report, args.source)
    else:
        run(args)


if __name__ == "__main__":
    main()
