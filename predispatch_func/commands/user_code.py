"""Reaching the user's code from the command line: ``MODULE:FACTORY`` and ``--import MODULE``.

A command runs where the user stands, so a module in the working directory
must import as it would under ``python -m``: the directory goes first on the
path (once) before the import.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

import torch

from ..opsets import OpSet

FACTORY_HELP = "MODULE:FACTORY returning (model, args[, kwargs])"


def import_user_module(name: str) -> ModuleType:
    """Import ``name`` as ``python -m`` would find it from the working directory."""
    if "" not in sys.path:
        sys.path.insert(0, "")
    return importlib.import_module(name)


def load_factory(spec: str) -> tuple[torch.nn.Module, tuple, dict]:
    """``MODULE:FACTORY`` -> (model, args, kwargs); the factory returns 2 or 3 items."""
    module_name, _, attr = spec.partition(":")
    if not attr:
        raise SystemExit(f"expected MODULE:FACTORY, got {spec!r}")
    made = getattr(import_user_module(module_name), attr)()
    if not isinstance(made, tuple) or len(made) not in (2, 3):
        raise SystemExit(f"{spec} must return (model, args) or (model, args, kwargs)")
    model, args, kwargs = (*made, {}) if len(made) == 2 else made
    return model, tuple(args) if isinstance(args, (tuple, list)) else (args,), dict(kwargs)


def load_target(spec: str | None) -> OpSet | None:
    """``--target core_aten|FILE`` as an :class:`OpSet` (None without one); a file's decomposition
    lines import from the working directory as a factory does. A bad file ends the command with
    what is wrong in it, not a traceback."""
    if not spec:
        return None
    if "" not in sys.path:
        sys.path.insert(0, "")
    try:
        return OpSet.parse(spec)
    except (OSError, ValueError, TypeError) as exc:
        raise SystemExit(f"--target {spec}: {exc}") from exc
