"""Errors that name the op and the user's source line.

A compiler user who gets "RuntimeError deep inside torch" cannot act on it.
Every error we raise says which op was involved and which line of *their*
model made it, found by walking the stack past torch's and our own frames.
"""

from __future__ import annotations

import os
import sys
import traceback
from types import TracebackType

import torch

_SKIP_DIRS = tuple(
    os.path.dirname(m.__file__) + os.sep
    for m in (torch, sys.modules[__name__.rsplit(".", 1)[0]])
    if getattr(m, "__file__", None)
)
_STDLIB_DIR = os.path.dirname(os.__file__) + os.sep


def _is_user_frame(filename: str) -> bool:
    if filename.startswith(_SKIP_DIRS) or filename.startswith("<"):
        return False
    return not (filename.startswith(_STDLIB_DIR) and "site-packages" not in filename)


def _format(frame: traceback.FrameSummary) -> str:
    line = f"{frame.filename}:{frame.lineno} in {frame.name}"
    return f"{line}\n    {frame.line}" if frame.line else line


def user_source_line(tb: TracebackType | None = None) -> str | None:
    """The innermost user frame, from a traceback if given, else the live stack."""
    frames = traceback.extract_tb(tb) if tb is not None else traceback.extract_stack()[:-1]
    for frame in reversed(frames):
        if _is_user_frame(frame.filename):
            return _format(frame)
    return None


class ExportError(RuntimeError):
    """Exporting failed; the message names the op and the user's source line."""

    def __init__(self, message: str, *, op: object = None, source: str | None = None):
        self.op = op
        self.source = source
        parts = [message]
        if op is not None:
            parts.append(f"op: {op}")
        if source:
            parts.append(f"at: {source}")
        super().__init__("\n".join(parts))


class UnsupportedError(ExportError):
    """The model does something the exporter cannot honour (never silently changed)."""


class VerificationError(AssertionError):
    """The exported program broke the contract or differs from eager."""
