"""Run a test's body in a fresh interpreter: for checks that process-global torch state set by
earlier tests can change (a registered PrivateUse1 backend, CUDA's lazy-init queue)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_in_fresh_process(module: str, function: str, *args: str, timeout: float = 600) -> None:
    """Call ``module.function(*args)`` (string arguments) in a new Python process; fail with its
    output if it raises."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", f"import {module} as m; m.{function}(*{args!r})"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{module}.{function} failed in a fresh process:\n{done.stdout}\n{done.stderr}"
