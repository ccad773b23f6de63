"""The audit tables shipped with the package, one per supported torch release.

``tables/aten-<release>.json`` is written by ``scripts/build_audit_table.py``
(a full audit of aten on that torch) and read once, lazily, by the exporter:
the table of the installed torch's release. It records the torch it was built
against and every audited overload's schema, so :func:`staleness` can tell,
cheaply, when a torch build added, removed or changed an op, and
:func:`diff` what changed for a user between two releases.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path

import torch

from .. import _torch_compat as tc
from .tagger import Entry

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
    from .runner import audit_many
    from .tagger import tag

    ops = list(ops)
    results = audit_many(ops, isolate=isolate, use_opinfo=use_opinfo, progress=progress)
    return [tag(op, r) for op, r in zip(ops, results)]


def build(progress: Callable[[str], None] | None = None) -> AuditTable:
    """Audit every aten overload (the script's job; about half a minute)."""
    from .runner import audit_scope

    entries = audit_entries(audit_scope("aten"), progress=progress)
    return AuditTable(torch.__version__, torch.version.git_version or "", {e.op: e for e in entries})


def save(table: AuditTable, path: Path | None = None) -> Path:
    """One entry per line, sorted by overload (:class:`ShippedEntries` finds a line by
    bisection), so a torch bump shows up as a readable diff. Written to the table of the
    release it was built on unless ``path`` says otherwise."""
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


class ShippedEntries(Mapping[str, Entry]):
    """A table's entries by overload name, each parsed the first time it is asked for.

    An export meets a few dozen of the three thousand overloads, and parsing all of them
    is most of what reading the table costs a first export. :func:`save` writes one entry
    a line, sorted by overload, so an entry's line is found by bisection and parsed on
    demand (indexing every line cost a first export 5-9 ms); a file in any other layout is
    parsed whole, as :func:`load` does. A file edited out of order finds fewer entries,
    never another op's: an op without an entry is left to the trace-time guard, as one the
    audit never met.
    """

    __slots__ = ("_lines", "_parsed")

    def __init__(self, text: str):
        self._parsed: dict[str, Entry] = {}
        lines = _entry_lines(text)
        if lines is None:
            self._parsed = AuditTable.from_json(json.loads(text)).entries
        self._lines: list[str] = lines or []

    @classmethod
    def read(cls, path: Path | None = None) -> ShippedEntries:
        return cls(Path(path or table_path()).read_text())

    def __getitem__(self, name: str) -> Entry:
        entry = self._parsed.get(name)
        if entry is None:
            data = json.loads(self._line_of(name))
            if data.get("op") != name:
                raise ValueError(f"audit table line for {name} names {data.get('op')!r}")
            entry = self._parsed[name] = Entry.from_json(data)
        return entry

    def _line_of(self, name: str) -> str:
        lines = self._lines
        at = bisect.bisect_left(lines, name, key=_op_of)
        if at == len(lines) or _op_of(lines[at]) != name:
            raise KeyError(name)
        return lines[at].removesuffix(",")

    def __iter__(self) -> Iterator[str]:
        return iter(self._parsed) if not self._lines else map(_op_of, self._lines)

    def __len__(self) -> int:
        return len(self._parsed if not self._lines else self._lines)


_OP_KEY = ', "op": "'


def _entry_lines(text: str) -> list[str] | None:
    """The entry lines of a table in :func:`save`'s layout (a header line ending in the
    entries' bracket, one entry a line, ``]}`` last), else None."""
    lines = text.rstrip("\n").split("\n")
    if len(lines) < 3 or lines[-1] != "]}" or not lines[0].endswith('"entries": ['):
        return None
    try:
        head = json.loads(lines[0] + "]}")
    except ValueError:
        return None
    if head.get("format") != FORMAT:
        raise ValueError(f"audit table format {head.get('format')!r}, expected {FORMAT}")
    del lines[0], lines[-1]
    return lines


def _op_of(line: str) -> str:
    """The overload an entry line names. Inside a JSON string every quote is escaped, so
    the first unescaped ``, "op": "`` is the key."""
    start = line.find(_OP_KEY)
    if not line.startswith("{") or start < 0:
        raise ValueError(f"audit table line is not an entry: {line[:80]!r}")
    start += len(_OP_KEY)
    return line[start:line.index('"', start)]


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
    from .runner import overloads_in

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
