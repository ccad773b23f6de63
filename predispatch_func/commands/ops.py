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
import re
from typing import Any

import torch
from rich import box
from rich.console import Console
from rich.table import Table

from ..export import export
from ..opsets.lowering import TargetUnreachableError
from ..opsets.opset import OpSet
from ..opsets.report import OpUse, ops_report
from ..program.runtime import load
from .user_code import FACTORY_HELP, load_factory, load_target


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("ops", help="list the operators a model's program uses")
    p.add_argument("factory", nargs="?", help=FACTORY_HELP)
    p.add_argument("--program", metavar="FILE.pt2", help="a program saved with torch.export.save")
    p.add_argument("--target", metavar="FILE|core_aten",
                   help="an op set (one name a line) or core_aten: show what it lacks and why")
    p.add_argument("--json", action="store_true", help="print a JSON list, one object per op")
    p.add_argument("--wide", action="store_true",
                   help="show each place's source line too (by default: module, type and file:line)")
    p.set_defaults(run=run)


def run(ns: argparse.Namespace, console: Console) -> int:
    if (ns.factory is None) == (ns.program is None):
        raise SystemExit("give MODULE:FACTORY or --program FILE.pt2 (one of them)")
    target = load_target(getattr(ns, "target", None))
    missing = None
    ep: torch.export.ExportedProgram
    if ns.program:
        ep = load(ns.program)
    else:
        model, args, kwargs = load_factory(ns.factory)
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
        _render(uses, target, console, wide=ns.wide)
    return 1 if missing else 0


# below this width the places go under the table instead of into a column of it
_WHERE_COLUMN_MIN_WIDTH = 140


def _render(uses: list[OpUse], target: OpSet | None, console: Console, *, wide: bool = False) -> None:
    """The table a backend writer reads first, legible at 80 columns: op names are never
    broken; each place is ``module (Type) file:line`` (its source line too with ``wide``),
    in a column of the table on a wide terminal, listed under it on a narrow one."""
    places = {u.op: u.where if wide else [brief_place(w) for w in u.where] for u in uses}
    in_column = console.width >= _WHERE_COLUMN_MIN_WIDTH
    table = Table(title=f"{len(uses)} operators, {sum(u.count for u in uses)} calls", box=box.SIMPLE_HEAD,
                  pad_edge=False, collapse_padding=True, title_justify="left")
    table.add_column("op", no_wrap=True)
    for header in ("calls", "core", "composite", "decomp"):
        table.add_column(header, no_wrap=True, min_width=len(header), justify="right" if header == "calls" else "left")
    if target is not None and in_column:
        table.add_column(f"in {target.name}", overflow="fold", min_width=12)
    if in_column:
        table.add_column("where in the model", overflow="fold")
    for u in uses:
        row = [u.op, str(u.count), "yes" if u.core_aten else "", u.composite.replace("trace-time guard", "guard"),
               "yes" if u.has_decomposition else ""]
        if target is not None and in_column:
            row.append("yes" if u.in_target else f"[red]no[/red]: {u.missing_why}")
        if in_column:
            row.append("\n".join(places[u.op]))
        table.add_row(*row)
    console.print(table)
    if not in_column:
        console.print("where in the model" + ("" if wide else " (--wide: with the source lines)") + ":")
        for u in uses:
            verdict = "" if target is None or u.in_target else f": [red]not in {target.name}[/red]: {u.missing_why}"
            console.print(f"  {u.op}{verdict}", highlight=False, overflow="fold")
            for place in places[u.op]:
                console.print(f"    {place}", style="dim", highlight=False, overflow="fold")
    if target is not None:
        outside = [u for u in uses if not u.in_target]
        lowered = [u for u in outside if u.missing_why and u.missing_why.startswith("decomposes")]
        console.print(f"{len(outside)} op(s) outside {target.name}: {len(lowered)} lowered by "
                      f"export(..., target=), {len(outside) - len(lowered)} missing")


_FILE_LINE = re.compile(r"^(?P<head>.*?\S+\.py:\d+)\b")


def brief_place(place: str) -> str:
    """``encoder.layer.0.query (Linear) modeling_bert.py:177 q = self.query(h)`` ->
    ``encoder.layer.0.query (Linear) modeling_bert.py:177``."""
    match = _FILE_LINE.match(place)
    return match["head"] if match else place
