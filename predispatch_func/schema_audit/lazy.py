"""Audit entries for aten on the installed torch: the shipped table, or audited lazily.

A shipped table (``tables/aten-<release>.json``) answers every overload at
once. A torch release without one (a newer release, a nightly) gets the same
answers one composite at a time: the first time an export meets a composite
it is audited in this process (real CPU samples, OpInfo's included, a fraction
of a second each), and the entry is written to a cache file per torch build, so
later exports and later processes answer from disk. ``predispatch-func audit``
still audits everything.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path

import torch

from .. import _torch_compat as tc
from ..disk_cache import cache_root, read_json, torch_build, write_json
from .tagger import Entry


def lazy_cache_path() -> Path | None:
    """The per-build cache of lazily audited entries (None: ``$PREDISPATCH_FUNC_CACHE`` is empty)."""
    root = cache_root()
    return None if root is None else root / f"audit-aten-{torch_build()}.json"


class AtenEntries:
    """Audit entries of aten overloads by name, from a table or audited on first use."""

    __slots__ = ("_entries", "lazy", "_cache_path", "_lock", "audited_now")

    def __init__(self, entries: Mapping[str, Entry], *, lazy: bool, cache_path: Path | None = None):
        self._entries = entries
        self.lazy = lazy
        self._cache_path = cache_path
        self._lock = threading.Lock()
        self.audited_now: list[str] = []  # overloads this process audited (lazy mode)

    @classmethod
    def for_installed_torch(cls) -> AtenEntries:
        from .table import ShippedEntries, table_path

        if table_path().exists():
            return cls(ShippedEntries.read(), lazy=False)
        return cls.lazily(lazy_cache_path())

    @classmethod
    def lazily(cls, cache_path: Path | None) -> AtenEntries:
        entries: dict[str, Entry] = {}
        cached = read_json(cache_path)
        if cached is not None:
            try:
                entries = {e["op"]: Entry.from_json(e) for e in cached}
            except (KeyError, TypeError):
                entries = {}  # a cache from another format: audit again
        return cls(entries, lazy=True, cache_path=cache_path)

    def lazy_notice(self) -> str:
        from .table import shipped_releases

        where = f"cached in {self._cache_path}" if self._cache_path else "not cached ($PREDISPATCH_FUNC_CACHE is empty)"
        return (f"predispatch_func ships schema-audit tables for torch {', '.join(shipped_releases())}, not for "
                f"the installed {torch.__version__}: each aten composite is audited the first time an export "
                f"meets it ({where}); `predispatch-func audit` audits all of them")

    def get(self, op: tc.OpOverload) -> Entry | None:
        name = str(op)
        entry = self._entries.get(name)
        if entry is None and self.lazy and tc.has_composite_implicit_kernel(op):
            entry = self._audit(op)
        return entry

    def _audit(self, op: tc.OpOverload) -> Entry:
        from .runner import audit_op
        from .tagger import tag

        entries = self._entries
        assert isinstance(entries, dict), "only a lazy AtenEntries audits, into its own dict"
        with self._lock:
            if str(op) in entries:
                return entries[str(op)]
            with tc.outside_all_modes():
                entry = tag(op, audit_op(op))
            entries[entry.op] = entry
            self.audited_now.append(entry.op)
            self._write()
            return entry

    def _write(self) -> None:
        if self._cache_path is not None:
            write_json(self._cache_path, [e.to_json() for e in sorted(self._entries.values(), key=lambda e: e.op)])
