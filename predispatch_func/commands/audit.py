"""``predispatch-func audit``: run the schema audit and show what it found.

Examples::

    predispatch-func audit                      # every aten composite (+ kernels with OpInfo samples)
    predispatch-func audit --op aten.type_as    # one packet (all overloads) or one overload
    predispatch-func audit --verdict lies_alias --json
    predispatch-func audit --import mylib.ops --namespace mylib
    predispatch-func audit --diff 2.13.0        # composites whose audit changed from 2.13.0 to this torch
    predispatch-func audit --diff 2.13.0 --against 2.15.0 --all-ops
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .. import _torch_compat as tc
from ..schema_audit.report import render_diff, render_summary, render_table, to_json
from ..schema_audit.tagger import DECOMPOSE, KEEP, apply_overrides
from ..schema_audit.verdicts import VERDICTS
from .user_code import import_user_module


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("audit", help="find composites whose behaviour contradicts their schema")
    p.add_argument("--namespace", default="aten", help="operator namespace to audit (default aten)")
    p.add_argument("--op", action="append", default=[],
                   help="an overload (aten.type_as.default) or packet (aten.type_as); repeatable")
    p.add_argument("--verdict", action="append", choices=VERDICTS, default=[],
                   help="show only these verdicts; repeatable")
    p.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                   help="import MODULE first (it registers custom ops); repeatable")
    p.add_argument("--override", action="append", default=[], metavar="OP=keep|decompose",
                   help="a user decision for one overload; the report shows it")
    p.add_argument("--json", action="store_true", help="print a JSON list, one object per overload")
    p.add_argument("--no-opinfo", action="store_true",
                   help="schema-synthesised samples only (skips importing torch's op_db)")
    p.add_argument("--diff", metavar="RELEASE",
                   help="compare the shipped tables: what changed from torch RELEASE to --against")
    p.add_argument("--against", metavar="RELEASE",
                   help="with --diff: the newer release (default: the installed torch's)")
    p.add_argument("--all-ops", action="store_true", help="with --diff: kernels too, not only composites")
    p.set_defaults(run=run)


def _select_ops(ns: argparse.Namespace) -> list[tc.OpOverload]:
    from ..schema_audit.runner import audit_scope, overloads_in

    if not ns.op:
        return audit_scope(ns.namespace)
    chosen = []
    for spec in ns.op:
        namespace, _, rest = spec.partition(".")
        if not rest:
            namespace, rest = ns.namespace, spec
        name, _, overload = rest.partition(".")
        if overload:
            op = tc.resolve_overload(namespace, rest)
            found = [op] if op is not None else []
        else:
            found = [op for op in overloads_in(namespace) if tc.schema_of(op).name.split("::")[1] == name]
        if not found:
            raise SystemExit(f"no operator {spec!r}")
        chosen += found
    return chosen


def _overrides(specs: list[str]) -> dict[str, str]:
    out = {}
    for spec in specs:
        op, _, decision = spec.partition("=")
        if decision not in (KEEP, DECOMPOSE):
            raise SystemExit(f"--override expects OP=keep|decompose, got {spec!r}")
        out[op] = decision
    return out


def run(ns: argparse.Namespace, console: Console) -> int:
    # deferred: --help and --diff need not load the audit's runner and samples
    from ..schema_audit.table import audit_entries

    if ns.diff:
        return run_diff(ns, console)

    for module in ns.imports:
        import_user_module(module)
    ops = _select_ops(ns)
    start = time.perf_counter()
    use_opinfo = not ns.no_opinfo and ns.namespace == "aten"
    if len(ops) < 20:
        entries = audit_entries(ops, use_opinfo=use_opinfo)
    else:
        # with --json the bar goes to stderr so stdout stays one JSON document
        bar_console = Console(stderr=True) if ns.json else console
        with Progress(TextColumn("auditing"), BarColumn(), MofNCompleteColumn(),
                      TextColumn("{task.description}"), TimeElapsedColumn(),
                      console=bar_console, transient=True) as bar:
            task = bar.add_task("", total=len(ops))
            entries = audit_entries(ops, use_opinfo=use_opinfo,
                                    progress=lambda name: bar.update(task, advance=1, description=name))
    wall = time.perf_counter() - start
    entries = apply_overrides(entries, _overrides(ns.override))
    shown = [e for e in entries if not ns.verdict or e.verdict in ns.verdict]
    if ns.json:
        print(to_json(shown))
        return 0
    render_table(shown, console)
    render_summary(entries, console, wall_s=wall)
    return 0


def run_diff(ns: argparse.Namespace, console: Console) -> int:
    """What a user upgrading torch from ``--diff`` to ``--against`` must look at."""
    from ..schema_audit.table import diff, installed_release, load_release

    against = ns.against or installed_release()
    try:
        before, after = load_release(ns.diff), load_release(against)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    changes = diff(before, after, composites_only=not ns.all_ops)
    if ns.json:
        print(json.dumps([{"op": c.op, "change": c.what,
                           "before": None if c.before is None else c.before.to_json(),
                           "after": None if c.after is None else c.after.to_json()} for c in changes], indent=1))
        return 0
    render_diff(changes, ns.diff, against, console)
    return 0
