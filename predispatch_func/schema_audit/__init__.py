"""The schema audit: which composites lie about their schema.

:func:`shipped_decision` is what the exporter asks. For aten it answers from
the table shipped for the installed torch's release (``tables/aten-<release>.json``,
loaded once). On a torch with no shipped table it audits each aten composite
the first time an export meets it and caches the entry on disk per torch build
(a few seconds on a first export instead of a full audit), warning once. Any
other namespace is audited the same way, cached per process. None means no
answer: then the trace-time guard in ``trace/composite_policy.py`` decides alone.

Pipeline: ``samples`` (inputs) -> ``checker`` (verdict) -> ``tagger``
(decision) -> ``table`` (shipped aten tables, the lazy cache) -> ``report`` (shown by
``predispatch-func audit``, in ``commands/audit.py``).
"""

from __future__ import annotations

import threading
import warnings

from .. import _torch_compat as tc

_lock = threading.Lock()
_aten: AtenEntries | None = None
_custom: dict[str, Entry] = {}


class NoShippedAuditTable(UserWarning):
    """The installed torch has no shipped audit table: aten composites are audited lazily."""


def _aten_entries() -> AtenEntries:
    global _aten
    if _aten is None:
        with _lock:
            if _aten is None:
                from .lazy import AtenEntries

                _aten = AtenEntries.for_installed_torch()
                if _aten.lazy:
                    warnings.warn(_aten.lazy_notice(), NoShippedAuditTable, stacklevel=4)
    return _aten


def shipped_decision(op: tc.OpOverload) -> str | None:
    """``"keep"``, ``"decompose"`` or None (not audited) for ``op``."""
    if op.namespace == "aten":
        entry = _aten_entries().get(op)
        return None if entry is None else entry.decision
    if not tc.has_composite_implicit_kernel(op):
        return None
    return audit_custom_op(op).decision


def shipped_untested_layouts(op: tc.OpOverload) -> list[str]:
    """The sparse layouts ``op`` accepts that the audit never ran it on."""
    if op.namespace == "aten":
        entry = _aten_entries().get(op)
        return [] if entry is None else entry.untested_layouts
    if not tc.has_composite_implicit_kernel(op):
        return []
    return audit_custom_op(op).untested_layouts


def use_aten_entries(entries: AtenEntries | None) -> None:
    """Answer aten lookups from ``entries`` (None: the installed torch's, chosen again)."""
    global _aten
    _aten = entries


def audit_custom_op(op: tc.OpOverload) -> Entry:
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


from .lazy import AtenEntries  # noqa: E402
from .tagger import Entry  # noqa: E402  (re-exported; cheap, no op_db import)

__all__ = ["AtenEntries", "Entry", "NoShippedAuditTable", "audit_custom_op", "forget_custom_audits",
           "shipped_decision", "shipped_untested_layouts", "use_aten_entries"]
