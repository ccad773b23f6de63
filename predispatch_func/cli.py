"""``predispatch-func``: one console script, one small function per subcommand."""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Any

import torch
from rich.console import Console

from .export import export, load
from .render import render_program, render_report
from .verify import verify


def _load_factory(spec: str) -> tuple[torch.nn.Module, tuple, dict]:
    """``MODULE:FACTORY`` -> (model, args, kwargs); the factory returns 2 or 3 items."""
    module_name, _, attr = spec.partition(":")
    if not attr:
        raise SystemExit(f"expected MODULE:FACTORY, got {spec!r}")
    sys.path.insert(0, "")
    made = getattr(importlib.import_module(module_name), attr)()
    if not isinstance(made, tuple) or len(made) not in (2, 3):
        raise SystemExit(f"{spec} must return (model, args) or (model, args, kwargs)")
    model, args, kwargs = (*made, {}) if len(made) == 2 else made
    return model, tuple(args) if isinstance(args, (tuple, list)) else (args,), dict(kwargs)


def _export_and_show(model, args, kwargs, ns, console) -> int:
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


def cmd_demo(ns: argparse.Namespace, console: Console) -> int:
    from .demo import example

    model, args = example()
    console.print("[bold]demo[/bold]: input mutated through a view, a buffer mutation, "
                  "honest composites kept (linear, layer_norm), a lying composite "
                  "(type_as returning its input) decomposed")
    ns.verify = True
    return _export_and_show(model, args, {}, ns, console)


def cmd_export(ns: argparse.Namespace, console: Console) -> int:
    model, args, kwargs = _load_factory(ns.factory)
    return _export_and_show(model, args, kwargs, ns, console)


def cmd_verify(ns: argparse.Namespace, console: Console) -> int:
    if ns.program and ns.post_dispatch:
        raise SystemExit("--post-dispatch chooses how to export; a saved --program is already exported")
    model, args, kwargs = _load_factory(ns.factory)
    # pf.load keeps module()'s write-back of a no_grad update to a parameter or input
    ep = load(ns.program) if ns.program else export(model, args, kwargs, pre_dispatch=not ns.post_dispatch)
    report = verify(ep, model, args, kwargs)
    render_report(report, console)
    return 0 if report.ok else 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="predispatch-func", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="export and verify the built-in example")
    demo.set_defaults(run=cmd_demo)
    exp = sub.add_parser("export", help="export MODULE:FACTORY and print the program")
    exp.add_argument("factory", help="MODULE:FACTORY returning (model, args[, kwargs])")
    exp.add_argument("--save", metavar="PATH", help="write the program with torch.export.save")
    exp.add_argument("--verify", action="store_true", help="replay against eager")
    exp.set_defaults(run=cmd_export)
    ver = sub.add_parser("verify", help="replay a program (or a fresh export) against eager")
    ver.add_argument("factory", help="MODULE:FACTORY returning (model, args[, kwargs])")
    ver.add_argument("--program", metavar="PATH", help="a program saved with --save")
    ver.set_defaults(run=cmd_verify)
    for p in (demo, exp, ver):
        p.add_argument("--post-dispatch", action="store_true",
                       help="export one level lower (after autograd, plain ATen)")
    _register_optional(sub)
    return parser


def _register_optional(sub: Any) -> None:
    """Subcommands that live in their own packages register themselves here."""
    from .opsets.cli import register as register_ops
    from .schema_audit.cli import register as register_audit

    register_ops(sub)
    register_audit(sub)
    importlib.import_module(".commands.eager", __package__).register(sub)


def main(argv: list[str] | None = None) -> int:
    ns = _parser().parse_args(argv)
    return ns.run(ns, Console())


if __name__ == "__main__":
    raise SystemExit(main())
