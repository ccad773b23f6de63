"""The installed torch's release, and strict xfails for torch's own limits.

A torch limit (docs/limits.md, rows marked *(torch)*) is a strict xfail
on every release that still has it: the test asks for what eager does (export
and replay), and fails loudly once torch fixes the case. Then that release is
named in ``lifted_in``, and from it on the test must pass, while older
releases keep the xfail (and the refusal). Checked on torch 2.13.0, 2.14.1
and 2.15.0.
"""

from __future__ import annotations

import re

import pytest
import torch


def torch_release() -> tuple[int, int, int]:
    """(major, minor, patch) of the installed torch (``2.15.0+cu132`` -> ``(2, 15, 0)``)."""
    numbers = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", torch.__version__)
    assert numbers is not None, torch.__version__
    major, minor, patch = numbers.groups()
    return int(major), int(minor), int(patch or 0)


def torch_limit(reason: str, *, raises: type[BaseException] | tuple[type[BaseException], ...] | None = None,
                lifted_in: tuple[int, ...] | None = None) -> pytest.MarkDecorator:
    """A strict xfail for a case torch itself blocks, unless the installed torch is
    ``lifted_in`` or newer (then the case must export and equal eager)."""
    still_limited = lifted_in is None or torch_release() < lifted_in
    lifted = f" (lifted in torch {'.'.join(map(str, lifted_in))})" if lifted_in else ""
    return pytest.mark.xfail(still_limited, strict=True, raises=raises, reason=f"torch limit{lifted}: {reason}")
