"""The subcommands of ``predispatch-func``, one module each.

Each module has ``register(subparsers)``: it adds its parser and sets ``run``,
a function ``(namespace, console) -> exit status``. ``cli.py`` only registers
them, in the order ``COMMANDS`` lists. They sit above the library: a command
may import anything in the package, and nothing in a library package imports
a command (a test walks the imports).
"""

from __future__ import annotations

from . import audit, demo, eager, export, ops, verify

COMMANDS = (demo, export, verify, ops, audit, eager)

__all__ = ["COMMANDS"]
