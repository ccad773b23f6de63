"""Rich rendering of an exported program, its signature and its verify report."""

from __future__ import annotations

import torch
from rich.console import Console
from rich.syntax import Syntax
from rich.table import Table

from .artifacts import program_facts
from .graphs import all_graph_modules
from .verify import VerifyReport


def render_program(ep: torch.export.ExportedProgram, console: Console) -> None:
    for where, gm in all_graph_modules(ep.graph_module):
        code = gm.print_readable(print_output=False, include_stride=False, include_device=False)
        console.rule(f"graph {where}")
        console.print(Syntax(code.strip(), "python", theme="ansi_dark", word_wrap=True))
    table = Table(title="signature")
    for col in ("direction", "name", "kind", "target"):
        table.add_column(col)
    for spec in ep.graph_signature.input_specs:
        table.add_row("in", getattr(spec.arg, "name", ""), spec.kind.name, spec.target or "")
    for spec in ep.graph_signature.output_specs:
        table.add_row("out", getattr(spec.arg, "name", ""), spec.kind.name, spec.target or "")
    console.print(table)
    decisions = program_facts(ep.graph_module).composite_decisions
    if decisions:
        dt = Table(title="composites met while tracing")
        for col in ("op", "decision", "why"):
            dt.add_column(col)
        for op, (decision, why) in sorted(decisions.items()):
            style = "green" if decision == "keep" else "yellow"
            dt.add_row(op, f"[{style}]{decision}[/{style}]", why)
        console.print(dt)


def render_report(report: VerifyReport, console: Console) -> None:
    style = "bold green" if report.ok else "bold red"
    console.print(f"[{style}]{report}[/{style}]")
