"""Rebuild ``predispatch_func/schema_audit/tables/aten-<release>.json``: a full audit of aten
on the torch of this interpreter.

Run after adding a torch release (``tests/audit/test_schema_audit.py`` fails while the
installed torch's table is missing or stale)::

    python scripts/build_audit_table.py            # writes the installed torch's table, prints the summary
    python scripts/build_audit_table.py --check    # exit 1 if the shipped table differs
    python scripts/build_audit_table.py --every-torch   # each supported torch, in its CI venv (.ci/torch_venv)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console  # noqa: E402
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn  # noqa: E402

from predispatch_func.schema_audit import table as audit_table  # noqa: E402
from predispatch_func.schema_audit.report import render_summary  # noqa: E402
from predispatch_func.schema_audit.runner import audit_scope  # noqa: E402


def _key(entry):
    return None if entry is None else (entry.verdict, entry.decision)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare with the shipped table, write nothing")
    parser.add_argument("--every-torch", action="store_true",
                        help="run this script under each supported torch (the venvs of .ci/torch_venv)")
    ns = parser.parse_args()
    if ns.every_torch:
        return _every_torch(ns.check)
    console = Console(stderr=True)
    start = time.perf_counter()
    total = len(audit_scope("aten"))
    with Progress(TextColumn("auditing aten"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.description}"), TimeElapsedColumn(), console=console) as bar:
        task = bar.add_task("", total=total)
        built = audit_table.build(progress=lambda name: bar.update(task, advance=1, description=name))
    wall = time.perf_counter() - start
    entries = list(built.entries.values())
    render_summary(entries, console, wall_s=wall)
    if ns.check:
        # verdicts and decisions only: evidence of ops that corrupt torch's heap
        # (quantized_lstm_cell) names whichever samples happened to crash
        shipped = audit_table.load().entries if audit_table.table_path().exists() else {}
        differ = [op for op in sorted(set(shipped) | set(built.entries))
                  if _key(shipped.get(op)) != _key(built.entries.get(op))]
        for op in differ:
            console.print(f"[red]{op}[/red]: shipped {_key(shipped.get(op))}, now {_key(built.entries.get(op))}")
        console.print("shipped table is up to date" if not differ else f"{len(differ)} ops differ")
        return 0 if not differ else 1
    console.print(f"wrote {audit_table.save(built)}")
    return 0


def _every_torch(check: bool) -> int:
    from predispatch_func.torch_support import SUPPORTED_TORCH_RELEASES

    root = Path(__file__).resolve().parents[1]
    failed = 0
    for release in SUPPORTED_TORCH_RELEASES:
        venv = subprocess.run([str(root / ".ci" / "torch_venv"), release], check=True, capture_output=True,
                              text=True).stdout.strip()
        print(f"torch {release}: {venv}", file=sys.stderr)
        command = [f"{venv}/bin/python", __file__, *(["--check"] if check else [])]
        failed |= subprocess.run(command, cwd=root, env={**os.environ, "PYTHONPATH": str(root)}).returncode
    return failed


if __name__ == "__main__":
    raise SystemExit(main())
