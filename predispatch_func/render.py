"""Rich rendering of an exported program, its signature, its verify report, and an export error."""

from __future__ import annotations

import torch
from rich.console import Console
from rich.syntax import Syntax
from rich.table import Table

from .artifacts import program_facts
from .errors import ExportError, UnsupportedError
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


def render_error(err: ExportError, console: Console, *, debug_how: str) -> None:
    """What a command-line user reads when exporting fails: the error's kind, its message,
    the op and the line of their model, and what to do; the traceback only on request
    (``debug_how`` says how to ask for it)."""
    kind = type(err).__name__ + (f" ({err.kind.name})" if isinstance(err, UnsupportedError) else "")
    lines = [f"error: {kind}: {err.reason}"]
    if err.op is not None:
        lines.append(f"  op: {err.op}")
    if err.source:
        where, *code = err.source.splitlines()
        lines += [f"  at: {where}", *(f"      {line.strip()}" for line in code)]
    lines.append(f"  hint: {err.hint}")
    lines.append(f"  (the traceback: {debug_how})")
    console.print("\n".join(lines), markup=False, highlight=False, soft_wrap=True)
