"""``predispatch-func``: one console script; each subcommand lives in ``commands/``."""

from __future__ import annotations

import argparse

from rich.console import Console

from .commands import COMMANDS


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="predispatch-func",
                                  description="Export PyTorch models into a functional pre-dispatch IR, "
                                              "verified against eager.")
    subparsers = top.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.register(subparsers)
    return top


def main(argv: list[str] | None = None) -> int:
    ns = parser().parse_args(argv)
    return ns.run(ns, Console())


if __name__ == "__main__":
    raise SystemExit(main())
