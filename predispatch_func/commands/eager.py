"""``predispatch-func eager``: run a model eagerly on an op set and say what that took.

Examples::

    predispatch-func eager my_mod:make --target core_aten          # forward, eval mode
    predispatch-func eager my_mod:make --target my_backend.txt --train --json

The model runs under ``pf.eager.on(target, observe=True)`` (the Python mode,
which sees every call; with ``--train``: in train mode,
forward and backward of a loss over its floating outputs). Ops with no path
into the target run as they are and are reported with the lines that called
them, so one run lists everything the backend lacks. The exit status is 1
when such ops were met.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import torch
from rich import box
from rich.console import Console
from rich.table import Table

from ..opsets import OpSet


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("eager", help="run a model eagerly on an op set (pf.eager.on) and report")
    p.add_argument("factory", help="MODULE:FACTORY returning (model, args[, kwargs])")
    p.add_argument("--target", metavar="FILE|core_aten", default="core_aten",
                   help="the backend's op set: core_aten or a file of names (one a line)")
    p.add_argument("--train", action="store_true", help="train mode, forward and backward")
    p.add_argument("--json", action="store_true", help="print the session's counts as JSON")
    p.set_defaults(run=cmd_eager)


def cmd_eager(ns: argparse.Namespace, console: Console) -> int:
    from .. import eager
    from .user_code import load_factory, load_target

    model, args, kwargs = load_factory(ns.factory)
    target = load_target(ns.target)  # core_aten by default
    assert target is not None
    model.train(ns.train)
    session = eager.on(target, on_unreachable="run", observe=True)  # observed: every op that reached the backend
    with session:
        out = model(*args, **kwargs)
        if ns.train:
            _loss(out).backward()
    report = session.stats.as_dict()
    if ns.json:
        print(json.dumps({"target": target.name, **report}, indent=1))
    else:
        _render(report, target, console)
    return 1 if report["unreachable"] else 0


def _loss(out: Any) -> torch.Tensor:
    values = [out] if isinstance(out, torch.Tensor) else (out.values() if hasattr(out, "values") else out)
    floats = [v.float().pow(2).mean() for v in values if isinstance(v, torch.Tensor) and v.is_floating_point()]
    if not floats:
        raise SystemExit("--train needs a floating output to differentiate")
    return torch.stack(floats).sum()


def _render(report: dict, target: OpSet, console: Console) -> None:
    reached = Table(title=f"{len(report['reached'])} ops reached the backend ({target.name} and the runtime floor)",
                    box=box.SIMPLE_HEAD, title_justify="left")
    reached.add_column("op", no_wrap=True)
    reached.add_column("calls", justify="right")
    for op, calls in report["reached"].items():
        name = f"{op} [red](not in the target)[/red]" if op in report["unreachable"] else op
        reached.add_row(name, str(calls) if calls else "in kernels")
    console.print(reached)
    decomposed = Table(title=f"{len(report['decomposed'])} ops decomposed into the target", box=box.SIMPLE_HEAD,
                       title_justify="left")
    for header in ("op", "calls", "cache hits", "traced", "run uncached"):
        decomposed.add_column(header, no_wrap=True, justify="left" if header == "op" else "right")
    for op, calls in report["decomposed"].items():
        decomposed.add_row(op, str(calls), str(report["cache_hits"].get(op, 0)),
                           str(report["cache_misses"].get(op, 0)), str(report["uncached"].get(op, 0)))
    console.print(decomposed)
    if report["unreachable"]:
        console.print(f"[red]{len(report['unreachable'])} op(s) with no path into {target.name}[/red] "
                      "(run as they are here; the backend must implement them):")
        for op, lines in report["unreachable"].items():
            console.print(f"  {op}", highlight=False)
            for line in lines or ["(no user source line found)"]:
                console.print(f"    {line}", style="dim", highlight=False, overflow="fold")
    else:
        console.print(f"every op reached {target.name} or the runtime floor")
