"""``predispatch-func ops``: which operators a model needs, and what a target lacks.

Examples::

    predispatch-func ops my_mod:make                        # every op of the exported program
    predispatch-func ops --program prog.pt2 --target core_aten
    predispatch-func ops my_mod:make --target my_backend.txt --json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from .lowering import TargetUnreachableError
from .opset import OpSet
from .report import OpUse, ops_report


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("ops", help="list the operators a model's program uses")
    p.add_argument("factory", nargs="?", help="MODULE:FACTORY returning (model, args[, kwargs])")
    p.add_argument("--program", metavar="FILE.pt2", help="a program saved with torch.export.save")
    p.add_argument("--target", metavar="FILE|core_aten",
                   help="an op set (one name a line) or core_aten: show what it lacks and why")
    p.add_argument("--json", action="store_true", help="print a JSON list, one object per op")
    p.set_defaults(run=cmd_ops)


def cmd_ops(ns: argparse.Namespace, console: Console) -> int:
    if (ns.factory is None) == (ns.program is None):
        raise SystemExit("give MODULE:FACTORY or --program FILE.pt2 (one of them)")
    target = OpSet.parse(ns.target) if ns.target else None
    missing = None
    ep: torch.export.ExportedProgram
    if ns.program:
        from ..export import load

        ep = load(ns.program)
    else:
        from ..cli import _load_factory
        from ..export import export

        model, args, kwargs = _load_factory(ns.factory)
        ep = export(model, args, kwargs)
        if target is not None:  # can the lowering reach the target? ask it
            try:
                export(model, args, kwargs, target=target)
            except TargetUnreachableError as exc:
                missing = exc.missing
    uses = ops_report(ep, target, missing)
    if ns.json:
        print(json.dumps([dataclasses.asdict(u) for u in uses], indent=1))
    else:
        _render(uses, target, console)
    return 1 if missing else 0


def _render(uses: list[OpUse], target: OpSet | None, console: Console) -> None:
    table = Table(title=f"{len(uses)} operators, {sum(u.count for u in uses)} calls")
    for col in ("op", "count", "core ATen", "composite", "decomposes", "where in the model"):
        table.add_column(col, overflow="fold")
    if target is not None:
        table.add_column(f"in {target.name}")
    for u in uses:
        row = [u.op, str(u.count), "yes" if u.core_aten else "", u.composite,
               "yes" if u.has_decomposition else "", "\n".join(u.where)]
        if target is not None:
            row.append("yes" if u.in_target else f"[red]no[/red]: {u.missing_why}")
        table.add_row(*row)
    console.print(table)
    if target is not None:
        outside = [u for u in uses if not u.in_target]
        lowered = [u for u in outside if u.missing_why and u.missing_why.startswith("decomposes")]
        console.print(f"{len(outside)} op(s) outside {target.name}: {len(lowered)} lowered by "
                      f"export(..., target=), {len(outside) - len(lowered)} missing")
