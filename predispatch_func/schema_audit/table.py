"""The audit tables shipped with the package, one per supported torch release.

``tables/aten-<release>.json`` is written by ``scripts/build_audit_table.py``
(a full audit of aten on that torch) and read once, lazily, by the exporter:
the table of the installed torch's release. It records the torch it was built
against and every audited overload's schema, so :func:`staleness` can tell,
cheaply, when a torch build added, removed or changed an op, and
:func:`diff` what changed for a user between two releases.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

from .. import _torch_compat as tc
from .runner import audit_many, audit_scope, overloads_in
from .tagger import Entry, tag

TABLES_DIR = Path(__file__).with_name("tables")
FORMAT = 1


def release_of(version: str) -> str:
    """``2.15.0+cu132`` -> ``2.15.0``: the local tag names a build of the same source
    (same ops, same schemas), so one table serves every build of a release."""
    return version.split("+")[0]


def installed_release() -> str:
    return release_of(torch.__version__)


def table_path(release: str | None = None) -> Path:
    """Where the shipped table of ``release`` (default: the installed torch's) lives."""
    return TABLES_DIR / f"aten-{release or installed_release()}.json"


def shipped_releases() -> list[str]:
    """Releases with a shipped table, oldest first."""
    found = [p.name.removeprefix("aten-").removesuffix(".json") for p in TABLES_DIR.glob("aten-*.json")]
    return sorted(found, key=lambda r: tuple(int(x) if x.isdigit() else 0 for x in r.split(".")))


@dataclasses.dataclass
class AuditTable:
    torch_version: str
    torch_git: str
    entries: dict[str, Entry]  # str(op) -> entry

    def to_json(self) -> dict:
        return {"format": FORMAT, "torch_version": self.torch_version, "torch_git": self.torch_git,
                "entries": [e.to_json() for e in sorted(self.entries.values(), key=lambda e: e.op)]}

    @classmethod
    def from_json(cls, data: dict) -> AuditTable:
        if data.get("format") != FORMAT:
            raise ValueError(f"audit table format {data.get('format')!r}, expected {FORMAT}")
        entries = {e["op"]: Entry.from_json(e) for e in data["entries"]}
        return cls(data["torch_version"], data["torch_git"], entries)


def audit_entries(ops: Iterable[tc.OpOverload], *, isolate: bool = True,
                  use_opinfo: bool = True,
                  progress: Callable[[str], None] | None = None) -> list[Entry]:
    ops = list(ops)
    results = audit_many(ops, isolate=isolate, use_opinfo=use_opinfo, progress=progress)
    return [tag(op, r) for op, r in zip(ops, results)]


def build(progress: Callable[[str], None] | None = None) -> AuditTable:
    """Audit every aten overload (the script's job; about half a minute)."""
    entries = audit_entries(audit_scope("aten"), progress=progress)
    return AuditTable(torch.__version__, torch.version.git_version or "", {e.op: e for e in entries})


def save(table: AuditTable, path: Path | None = None) -> Path:
    """One entry per line, so a torch bump shows up as a readable diff. Written to the
    table of the release it was built on unless ``path`` says otherwise."""
    path = path or table_path(release_of(table.torch_version))
    data = table.to_json()
    head = {k: v for k, v in data.items() if k != "entries"}
    lines = [json.dumps(e, sort_keys=True) for e in data["entries"]]
    body = json.dumps(head, sort_keys=True)[:-1] + ', "entries": [\n' + ",\n".join(lines) + "\n]}\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(body)
    return path


def load(path: Path | None = None) -> AuditTable:
    """The table at ``path`` (default: the shipped table of the installed torch's release)."""
    return AuditTable.from_json(json.loads(Path(path or table_path()).read_text()))


def load_release(release: str) -> AuditTable:
    """The shipped table of ``release`` (a ValueError naming the shipped ones if none)."""
    path = table_path(release_of(release))
    if not path.exists():
        raise ValueError(f"no audit table shipped for torch {release}; shipped: {', '.join(shipped_releases())}")
    return load(path)


@dataclasses.dataclass(frozen=True)
class VerdictChange:
    """One overload whose audit changed between two torch releases (None: not registered there)."""

    op: str
    before: Entry | None
    after: Entry | None

    @property
    def what(self) -> str:
        if self.before is None:
            return "new"
        if self.after is None:
            return "removed"
        if (self.before.verdict, self.before.decision) != (self.after.verdict, self.after.decision):
            return "verdict"
        return "schema"


def diff(before: AuditTable, after: AuditTable, *, composites_only: bool = True) -> list[VerdictChange]:
    """Overloads whose verdict, decision or schema differ between two tables, or that exist
    in one only: what a user upgrading torch from ``before`` to ``after`` must look at.
    By default only composites (the ops whose keep/decompose decision the audit makes)."""
    changes = []
    for name in sorted(set(before.entries) | set(after.entries)):
        old, new = before.entries.get(name), after.entries.get(name)
        if composites_only and not ((old and old.composite) or (new and new.composite)):
            continue
        if old is None or new is None or (old.verdict, old.decision, old.schema) != (
                new.verdict, new.decision, new.schema):
            changes.append(VerdictChange(name, old, new))
    return changes


def staleness(table: AuditTable) -> list[str]:
    """Why ``table`` does not describe the installed torch (empty: it does)."""
    problems = []
    # the local tag (+cpu, +cu128) names a build of the same source: same ops, same schemas
    if table.torch_version.split("+")[0] != torch.__version__.split("+")[0]:
        problems.append(f"built for torch {table.torch_version}, installed {torch.__version__}")
    if table.torch_git != (torch.version.git_version or ""):
        problems.append(f"built for torch commit {table.torch_git[:12]}, installed "
                        f"{(torch.version.git_version or '')[:12]}")
    current = {str(op): op for op in overloads_in("aten")}
    for name in sorted(set(table.entries) - set(current)):
        problems.append(f"{name} is in the table but no longer registered")
    for name, entry in sorted(table.entries.items()):
        op = current.get(name)
        if op is not None and str(tc.schema_of(op)) != entry.schema:
            problems.append(f"{name} changed schema: {entry.schema} -> {tc.schema_of(op)}")
    missing = sorted(set(current) - set(table.entries))
    problems += [f"{'composite' if tc.has_composite_implicit_kernel(current[n]) else 'kernel'} "
                 f"{n} is not in the table" for n in missing]
    return problems
