"""The audit table shipped with the package, and whether it still fits this torch.

``aten_table.json`` is written by ``scripts/build_audit_table.py`` (a full
audit of aten) and read once, lazily, by the exporter. It records the torch it
was built against and every audited overload's schema, so :func:`staleness`
can tell, cheaply, when a torch upgrade added, removed or changed an op.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Callable, Iterable

import torch

from .. import _torch_compat as tc
from .runner import audit_many, audit_scope, overloads_in
from .tagger import Entry, tag

TABLE_PATH = Path(__file__).with_name("aten_table.json")
FORMAT = 1


@dataclasses.dataclass
class AuditTable:
    torch_version: str
    torch_git: str
    entries: dict[str, Entry]  # str(op) -> entry

    def to_json(self) -> dict:
        return {"format": FORMAT, "torch_version": self.torch_version, "torch_git": self.torch_git,
                "entries": [e.to_json() for e in sorted(self.entries.values(), key=lambda e: e.op)]}

    @classmethod
    def from_json(cls, data: dict) -> "AuditTable":
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


def save(table: AuditTable, path: Path = TABLE_PATH) -> None:
    """One entry per line, so a torch bump shows up as a readable diff."""
    data = table.to_json()
    head = {k: v for k, v in data.items() if k != "entries"}
    lines = [json.dumps(e, sort_keys=True) for e in data["entries"]]
    body = json.dumps(head, sort_keys=True)[:-1] + ', "entries": [\n' + ",\n".join(lines) + "\n]}\n"
    path.write_text(body)


def load(path: Path = TABLE_PATH) -> AuditTable:
    return AuditTable.from_json(json.loads(Path(path).read_text()))


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
