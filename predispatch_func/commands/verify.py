"""``predispatch-func verify MODULE:FACTORY [--program FILE.pt2]``: replay against the reference."""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console

from ..export import export
from ..program.runtime import load
from ..render import render_report
from ..verify import verify
from .export import add_post_dispatch_flag
from .user_code import FACTORY_HELP, load_factory


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("verify", help="replay a program (or a fresh export) against the reference")
    p.add_argument("factory", help=FACTORY_HELP)
    p.add_argument("--program", metavar="PATH", help="a program saved with --save")
    add_post_dispatch_flag(p)
    p.set_defaults(run=run)


def run(ns: argparse.Namespace, console: Console) -> int:
    if ns.program and ns.post_dispatch:
        raise SystemExit("--post-dispatch chooses how to export; a saved --program is already exported")
    model, args, kwargs = load_factory(ns.factory)
    # pf.load keeps module()'s write-back of a no_grad update to a parameter or input
    ep = load(ns.program) if ns.program else export(model, args, kwargs, pre_dispatch=not ns.post_dispatch)
    report = verify(ep, model, args, kwargs)
    render_report(report, console)
    return 0 if report.ok else 1
