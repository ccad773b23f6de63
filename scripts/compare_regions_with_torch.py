"""Issue 3's table: which region cases each torch 2.13 path gets wrong, and ours.

The cases are the region tests themselves: every test in
``tests/test_regions.py`` that exports through ``export_checked`` is run with
that function swapped for a recorder, so the (model, args) pairs compared
here are exactly the ones the tests prove. Each path's program is replayed
against eager with the same comparison ``predispatch_func.verify`` uses
(outputs, written-back inputs and buffers, gradients, grad mode after the
call), through the path runners of ``scripts/compare_torch_paths.py``.

Run: python scripts/compare_regions_with_torch.py [--json out.json]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import unittest
import warnings

import torch
from rich.console import Console
from rich.table import Table

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
warnings.simplefilter("ignore")

import test_regions  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "scripts"))
from cases_core import Case  # noqa: E402
from compare_torch_paths import (run_ours, run_torch_aot_pre_dispatch,  # noqa: E402
                                 run_torch_export_replay_only, run_torch_run_decompositions)


class _Recorded(Exception):
    pass


def collect_cases() -> list[tuple[str, torch.nn.Module, tuple]]:
    cases = []

    def recorder(model, args, kwargs=None, **_):
        cases.append((current[0], copy.deepcopy(model), copy.deepcopy(tuple(args))))
        raise _Recorded

    current = [""]
    original = test_regions.export_checked
    test_regions.export_checked = recorder
    try:
        classes = [c for c in vars(test_regions).values() if isinstance(c, type)
                   and issubclass(c, unittest.TestCase) and c.__module__ == test_regions.__name__]
        for cls in classes:
            for name in unittest.TestLoader().getTestCaseNames(cls):
                current[0] = name.removeprefix("test_")
                try:
                    getattr(cls(name), name)()
                except _Recorded:
                    pass
                except Exception:  # a test that exports without the oracle
                    pass
    finally:
        test_regions.export_checked = original
    return cases


PATHS = {"ours": run_ours, "torch.export (replay only)": run_torch_export_replay_only,
         "run_decompositions": run_torch_run_decompositions,
         "aot_pre_dispatch (replay only)": lambda case: run_torch_aot_pre_dispatch(case, judge_contract=False)}


def judge(run, name, model, args) -> tuple[str, str]:
    case = Case(name, lambda: (copy.deepcopy(model), copy.deepcopy(args), {}))
    try:
        return run(case)
    except Exception as exc:  # noqa: BLE001 - an exporter that raises is that path's verdict
        return "error", f"{type(exc).__name__}: {str(exc).splitlines()[0][:90]}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    ns = parser.parse_args()
    cases = collect_cases()
    table = Table(title=f"region cases replayed against eager ({len(cases)} cases)")
    table.add_column("case")
    for path in PATHS:
        table.add_column(path)
    rows, wrong = [], {p: 0 for p in PATHS}
    for name, model, args in cases:
        verdicts = {p: judge(run, name, model, args) for p, run in PATHS.items()}
        for p, (v, _) in verdicts.items():
            wrong[p] += v != "ok"
        rows.append({"case": name, **{p: {"verdict": v, "detail": d} for p, (v, d) in verdicts.items()}})
        table.add_row(name, *[f"{v} {d}".strip() for v, d in verdicts.values()])
    table.add_row("[bold]not ok[/bold]", *[f"[bold]{wrong[p]}/{len(cases)}[/bold]" for p in PATHS])
    Console(width=200).print(table)
    print("torch.export's program is not functional (in-place nodes stay); only its replay is judged")
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
