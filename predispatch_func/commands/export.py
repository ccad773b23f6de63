"""``predispatch-func export MODULE:FACTORY``: export a user's model and print the program."""

from __future__ import annotations

import argparse
from typing import Any

import torch
from rich.console import Console

from ..export import export
from ..render import render_program, render_report
from ..verify import verify
from .user_code import FACTORY_HELP, load_factory


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("export", help="export MODULE:FACTORY and print the program")
    p.add_argument("factory", help=FACTORY_HELP)
    p.add_argument("--save", metavar="PATH", help="write the program with torch.export.save")
    p.add_argument("--verify", action="store_true", help="replay against eager")
    add_post_dispatch_flag(p)
    p.set_defaults(run=run)


def add_post_dispatch_flag(parser: argparse.ArgumentParser) -> None:
    """The one choice of how to export that ``demo``, ``export`` and ``verify`` share."""
    parser.add_argument("--post-dispatch", action="store_true",
                        help="export one level lower (after autograd, plain ATen)")


def run(ns: argparse.Namespace, console: Console) -> int:
    model, args, kwargs = load_factory(ns.factory)
    return export_and_show(model, args, kwargs, ns, console)


def export_and_show(model: torch.nn.Module, args: tuple, kwargs: dict, ns: argparse.Namespace,
                    console: Console) -> int:
    """Export, print the program, then save and verify as ``ns`` asks; the exit status."""
    ep = export(model, args, kwargs, pre_dispatch=not ns.post_dispatch)
    render_program(ep, console)
    if getattr(ns, "save", None):
        torch.export.save(ep, ns.save)
        console.print(f"saved to {ns.save}")
    if getattr(ns, "verify", True):
        report = verify(ep, model, args, kwargs)
        render_report(report, console)
        return 0 if report.ok else 1
    return 0
