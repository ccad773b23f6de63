"""The schema audit: which composites lie about their schema.

:func:`shipped_decision` is what the exporter asks; it answers from the
table shipped with the package, or None when the op is not in it (then the
trace-time guard in ``modes/composite_policy.py`` decides alone).
"""

from __future__ import annotations

import torch


def shipped_decision(op: torch._ops.OpOverload) -> str | None:
    return None
