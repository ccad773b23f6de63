"""``predispatch-func demo``: export and verify the built-in example (``predispatch_func/commands/demo_model.py``)."""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console

from .demo_model import example
from .export import add_post_dispatch_flag, export_and_show


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("demo", help="export and verify the built-in example")
    add_post_dispatch_flag(p)
    p.set_defaults(run=run)


def run(ns: argparse.Namespace, console: Console) -> int:
    model, args = example()
    console.print("[bold]demo[/bold]: input mutated through a view, a buffer mutation, "
                  "honest composites kept (linear, layer_norm), a lying composite "
                  "(type_as returning its input) decomposed")
    ns.verify = True
    return export_and_show(model, args, {}, ns, console)
