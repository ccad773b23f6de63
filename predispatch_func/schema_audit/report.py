"""Showing an audit: a rich table, a summary, or JSON (one object per overload)."""

from __future__ import annotations

import collections
import dataclasses
import json

import torch
from rich.console import Console
from rich.table import Table

from .tagger import Entry
from .verdicts import VERDICTS

_VERDICT_STYLE = {"lies_alias": "bold red", "lies_mutation": "bold red", "maybe_alias": "yellow",
                  "honest": "green", "untested": "dim"}


@dataclasses.dataclass
class Summary:
    composites: int
    kernels: int
    verdicts: dict[str, int]  # over composites
    kernel_verdicts: dict[str, int]
    lying_composites: list[str]
    lying_kept_by_torch: list[str]  # the ones torch.export would keep as single nodes
    lying_kernels: list[str]
    overrides: list[str]


def summarize(entries: list[Entry]) -> Summary:
    comps = [e for e in entries if e.composite]
    kernels = [e for e in entries if not e.composite]

    def counts(rows: list[Entry]) -> dict[str, int]:
        c = collections.Counter(e.verdict for e in rows)
        return {v: c.get(v, 0) for v in VERDICTS}

    return Summary(
        composites=len(comps), kernels=len(kernels), verdicts=counts(comps),
        kernel_verdicts=counts(kernels),
        lying_composites=[e.op for e in comps if e.lies],
        lying_kept_by_torch=[e.op for e in comps if e.lies and e.torch_keeps],
        lying_kernels=[e.op for e in kernels if e.lies],
        overrides=[f"{e.op}: {e.override} (audit: {e.audit_decision})" for e in entries if e.override],
    )


# below this width each overload is two lines (verdict, then evidence) instead of a table row
_TABLE_MIN_WIDTH = 140


def render_table(entries: list[Entry], console: Console, *, evidence_width: int = 70) -> None:
    """One row per overload; on a terminal narrower than the table needs, two lines per
    overload, so op names are never broken and the evidence stays readable."""
    def decision(e: Entry) -> str:
        return e.decision if not e.override else f"{e.decision} (override; audit: {e.audit_decision})"

    def evidence(e: Entry) -> str:
        text = f"on {', '.join(e.lies_on_layouts)}: {e.evidence}" if e.lies and e.lies_on_layouts else e.evidence
        return text if len(text) <= evidence_width else text[:evidence_width - 1] + "…"

    def torch_side(e: Entry) -> str:
        return ("tagged maybe_aliasing_or_mutating, " if e.torch_tagged else "") + \
            ("torch.export keeps it" if e.torch_keeps else "torch.export decomposes it")

    if console.width < _TABLE_MIN_WIDTH:
        console.print("[bold]schema audit[/bold]")
        for e in entries:
            style = _VERDICT_STYLE[e.verdict]
            console.print(f"{e.op}{'' if e.composite else ' [dim](kernel)[/dim]'}  [{style}]{e.verdict}[/] -> "
                          f"{decision(e)}", highlight=False, overflow="fold")
            console.print(f"    {evidence(e).rstrip()}; {torch_side(e)}", style="dim", highlight=False, overflow="fold")
        return
    table = Table(title="schema audit", show_lines=False)
    table.add_column("op", no_wrap=True)
    for col in ("verdict", "decision"):
        table.add_column(col, no_wrap=True)
    for col in ("evidence", "torch tag", "torch.export"):
        table.add_column(col, overflow="fold")
    for e in entries:
        table.add_row(
            e.op + ("" if e.composite else " [dim](kernel)[/dim]"),
            f"[{_VERDICT_STYLE[e.verdict]}]{e.verdict}[/]", decision(e), evidence(e),
            "maybe_aliasing_or_mutating" if e.torch_tagged else "-",
            "keeps" if e.torch_keeps else "decomposes",
        )
    console.print(table)


def render_summary(entries: list[Entry], console: Console, *, wall_s: float | None = None) -> None:
    s = summarize(entries)
    lying = len(s.lying_composites)
    line = ", ".join(f"{v} {n}" for v, n in s.verdicts.items() if n)
    console.print(f"[bold]{s.composites} composites[/bold] audited: {line}")
    if s.kernels:
        kline = ", ".join(f"{v} {n}" for v, n in s.kernel_verdicts.items() if n)
        console.print(f"{s.kernels} kernels (no composite): {kline}")
    console.print(f"[bold red]{lying} composites lie[/bold red]; torch {torch.__version__.split('+')[0]}'s export would keep "
                  f"{len(s.lying_kept_by_torch)} of them as single nodes: "
                  + (", ".join(s.lying_kept_by_torch) or "none"))
    if s.lying_kernels:
        console.print("kernels whose schema lies: " + ", ".join(s.lying_kernels))
    for o in s.overrides:
        console.print(f"override: {o}")
    if wall_s is not None:
        console.print(f"audit wall time: {wall_s:.1f}s")


def to_json(entries: list[Entry]) -> str:
    return json.dumps([e.to_json() for e in entries], indent=1)


def render_diff(changes: list, before: str, after: str, console: Console) -> None:
    """The overloads whose audit changed between two torch releases (``table.diff``)."""
    if not changes:
        console.print(f"no audited composite changed from torch {before} to {after}")
        return
    table = Table(title=f"schema audit: torch {before} -> {after}", title_justify="left")
    table.add_column("overload", no_wrap=True)
    table.add_column("change")
    table.add_column(f"torch {before}")
    table.add_column(f"torch {after}")

    def cell(entry: Entry | None) -> str:
        if entry is None:
            return "[dim]not registered[/dim]"
        style = _VERDICT_STYLE.get(entry.verdict, "")
        return f"[{style}]{entry.verdict}[/{style}] -> {entry.decision}" if style else f"{entry.verdict} -> {entry.decision}"

    for change in changes:
        table.add_row(change.op, change.what, cell(change.before), cell(change.after))
    console.print(table)
    counts = collections.Counter(c.what for c in changes)
    console.print(", ".join(f"{n} {what}" for what, n in sorted(counts.items())))
