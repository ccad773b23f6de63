"""Cases where we are known to fall short of torch.export, and why.

``known_gaps.json`` maps a case name to the reason; it is written by
``python scripts/conformance.py --write-known-gaps`` from a full run's results
(a case is a gap when torch.export is ok and we are not, or we are silently
wrong and torch.export is not). Tests mark these ``xfail(strict=True)``: a gap
that closes fails the test until the file is regenerated.
"""

from __future__ import annotations

import functools
import json
import os

PATH = os.path.join(os.path.dirname(__file__), "known_gaps.json")

# A signature (or its start) -> why; the rest fall back to the signature itself.
_REASONS = {
    "ExportError @ stack.py:trace_functional: tracing failed: AssertionError: Current active mode":
        "torch HOPs (cond, map, while_loop, scan, ...) do not yet dispatch through our functional mode "
        "(issues 12 and 13)",
    "program's backward raised where eager's did not: derivative for aten::":
        "the functional form of an in-place random fill (normal_, uniform_, ...) has no derivative, "
        "so the program cannot train through it",
}


def is_gap(ours: dict, torch_: dict) -> bool:
    if ours["status"] == "n/a" or torch_["status"] == "n/a":
        return False
    return (torch_["status"] == "ok" and ours["status"] != "ok") or (
        ours["status"] == "wrong" and torch_["status"] != "wrong")


def reason(ours: dict) -> str:
    sig = ours.get("signature") or ours.get("detail", "")
    for start, why in _REASONS.items():
        if sig.startswith(start):
            return why
    return f"ours: {ours['status']}: {sig}"


@functools.cache
def known_gaps() -> dict[str, str]:
    if not os.path.exists(PATH):
        return {}
    with open(PATH) as f:
        return json.load(f)
