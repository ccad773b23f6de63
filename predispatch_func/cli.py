"""``predispatch-func``: one console script; each subcommand lives in ``commands/``.

An export that fails is printed as its kind, message, the model's line and a hint,
with exit status 1 (``render.render_error``); ``--debug`` or the environment variable
``PREDISPATCH_FUNC_DEBUG=1`` lets the exception through with its traceback.
"""

from __future__ import annotations

import argparse
import os

from rich.console import Console

from .commands import COMMANDS
from .errors import ExportError
from .render import render_error

DEBUG_ENV = "PREDISPATCH_FUNC_DEBUG"
_DEBUG_HELP = f"show the Python traceback of an export error (or set {DEBUG_ENV}=1)"


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="predispatch-func",
                                  description="Export PyTorch models into a functional pre-dispatch IR, "
                                              "verified against the reference.")
    top.add_argument("--debug", action="store_true", help=_DEBUG_HELP)
    subparsers = top.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.register(subparsers)
    for sub in subparsers.choices.values():  # also after the command: `predispatch-func ops m:make --debug`
        sub.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=_DEBUG_HELP)
    return top


def main(argv: list[str] | None = None) -> int:
    ns = parser().parse_args(argv)
    if ns.debug or os.environ.get(DEBUG_ENV, "") not in ("", "0"):
        return ns.run(ns, Console())
    try:
        return ns.run(ns, Console())
    except ExportError as err:
        render_error(err, Console(stderr=True), debug_how=f"run again with --debug, or {DEBUG_ENV}=1")
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
