"""The schema audit: which composites lie about their schema.

:func:`shipped_decision` is what the exporter asks. For aten it answers from
the table shipped with the package (``aten_table.json``, loaded once); for any
other namespace it audits the op the first time export meets it (real CPU
samples synthesised from the schema, outside the trace) and caches the answer.
None means no answer: then the trace-time guard in ``modes/composite_policy.py``
decides alone.

Pipeline: ``samples`` (inputs) -> ``checker`` (verdict) -> ``tagger``
(decision) -> ``table`` (shipped aten table) -> ``report`` / ``cli``.
"""

from __future__ import annotations

import threading

from .. import _torch_compat as tc

_lock = threading.Lock()
_shipped: dict[str, str] | None = None
_shipped_untested: dict[str, list[str]] = {}
_custom: dict[str, "Entry"] = {}


def _shipped_decisions() -> dict[str, str]:
    global _shipped
    if _shipped is None:
        with _lock:
            if _shipped is None:
                from .table import TABLE_PATH, load

                entries = load().entries if TABLE_PATH.exists() else {}
                _shipped_untested.update({n: e.untested_layouts for n, e in entries.items() if e.untested_layouts})
                _shipped = {name: e.decision for name, e in entries.items()}
    return _shipped


def shipped_decision(op: tc.OpOverload) -> str | None:
    """``"keep"``, ``"decompose"`` or None (not audited) for ``op``."""
    if op.namespace == "aten":
        return _shipped_decisions().get(str(op))
    if not tc.has_composite_implicit_kernel(op):
        return None
    return audit_custom_op(op).decision


def shipped_untested_layouts(op: tc.OpOverload) -> list[str]:
    """The sparse layouts ``op`` accepts that the audit never ran it on."""
    if op.namespace == "aten":
        _shipped_decisions()
        return _shipped_untested.get(str(op), [])
    if not tc.has_composite_implicit_kernel(op):
        return []
    return audit_custom_op(op).untested_layouts


def audit_custom_op(op: tc.OpOverload) -> "Entry":
    """Audit a non-aten composite now (once per process), even from inside a trace."""
    name = str(op)
    if name not in _custom:
        from .runner import audit_op
        from .tagger import tag

        with tc.outside_all_modes():
            _custom[name] = tag(op, audit_op(op, use_opinfo=False))
    return _custom[name]


def forget_custom_audits() -> None:
    """Drop cached custom-op verdicts (a test redefining an op under the same name)."""
    _custom.clear()


from .tagger import Entry  # noqa: E402  (re-exported; cheap, no op_db import)

__all__ = ["Entry", "audit_custom_op", "forget_custom_audits", "shipped_decision", "shipped_untested_layouts"]
