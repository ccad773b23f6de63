"""Ops per corpus model, and export time to Core ATen: ours against torch's, in one run.

For every corpus model (eval mode):

* distinct operators in our default program and in ``export(..., target=core_aten)``
  (all graphs; region HOPs, getitem and shape bookkeeping not counted), and in
  torch's ``torch.export.export(...).run_decompositions()`` for reference;
* whether the Core ATen program replays against the reference (``pf.verify`` with the target);
* export time, median of ``--rounds`` after a warm-up round, alternating:
  ``pf.export(model, args, target=OpSet.core_aten())`` against
  ``torch.export.export(model, args).run_decompositions()`` (torch's default
  table: Core ATen).

A model torch cannot lower completely (an op with no ATen decomposition) is
exported to Core ATen plus the ops our lowering names. Prints a rich table and
optionally writes JSON.

Run: python -m scripts.bench_opsets [--rounds 3] [--models bert,gpt2] [--json out.json]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import time
import warnings

import torch
from rich.console import Console
from rich.table import Table

os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.simplefilter("ignore")

import predispatch_func as pf
from predispatch_func.graphs import all_graph_modules
from predispatch_func.opsets import TargetUnreachableError, is_infrastructure
from tests.models.corpus import CASES, build


def distinct_ops(ep: torch.export.ExportedProgram) -> set[str]:
    return {str(n.target) for _, gm in all_graph_modules(ep.graph_module) for n in gm.graph.nodes
            if n.op == "call_function" and not is_infrastructure(n.target)}


def target_for(model, args, kwargs) -> tuple[pf.OpSet, list[str]]:
    """Core ATen, plus whatever torch has no ATen decomposition for (named by our refusal)."""
    core = pf.OpSet.core_aten()
    try:
        pf.export(model, args, kwargs, target=core)
        return core, []
    except TargetUnreachableError as exc:
        extra = sorted(exc.missing)
        return core | pf.OpSet.from_names(extra, name="extra"), extra


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--models", default=",".join(CASES))
    parser.add_argument("--json")
    ns = parser.parse_args()
    rows = []
    console = Console()
    for name in ns.models.split(","):
        model, args, kwargs = build(name)
        target, extra = target_for(model, args, kwargs)
        default_ops = distinct_ops(pf.export(model, args, kwargs))
        ours_ep = pf.export(model, args, kwargs, target=target)
        report = pf.verify(ours_ep, model, args, kwargs, target=target)

        def ours(model=model, args=args, kwargs=kwargs, target=target):
            return pf.export(model, args, kwargs, target=target)

        def theirs(model=model, args=args, kwargs=kwargs):
            return torch.export.export(copy.deepcopy(model), args, kwargs).run_decompositions()

        try:
            torch_ops = len(distinct_ops(theirs()))
        except Exception as exc:  # noqa: BLE001 (report torch's failure, keep going)
            torch_ops, theirs = f"fails: {type(exc).__name__}", None
        times: dict[str, list[float]] = {"ours": [], "torch": []}
        for _ in range(ns.rounds):
            for key, fn in (("ours", ours), ("torch", theirs)):
                if fn is None:
                    continue
                start = time.perf_counter()
                fn()
                times[key].append(time.perf_counter() - start)
        med = {k: statistics.median(v) if v else None for k, v in times.items()}
        rows.append({"model": name, "ops_default": len(default_ops), "ops_core_aten": len(distinct_ops(ours_ep)),
                     "ops_torch_run_decompositions": torch_ops, "kept_outside_core": extra,
                     "verify": "ok" if report.ok else "; ".join(report.problems),
                     "s_ours_core_aten": med["ours"], "s_torch_run_decompositions": med["torch"]})
        console.print(rows[-1])
    table = Table(title=f"Core ATen export, median of {ns.rounds} (eval mode)")
    for col in ("model", "ops default", "ops core_aten", "ops torch", "ours s", "torch s", "ours/torch",
                "kept outside core (no ATen decomposition)", "verify"):
        table.add_column(col)
    for r in rows:
        ratio = (f"{r['s_ours_core_aten'] / r['s_torch_run_decompositions']:.2f}"
                 if r["s_torch_run_decompositions"] else "-")
        table.add_row(r["model"], str(r["ops_default"]), str(r["ops_core_aten"]),
                      str(r["ops_torch_run_decompositions"]), f"{r['s_ours_core_aten']:.2f}",
                      f"{r['s_torch_run_decompositions']:.2f}" if r["s_torch_run_decompositions"] else "-",
                      ratio, ", ".join(r["kept_outside_core"]), r["verify"])
    console.print(table)
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
