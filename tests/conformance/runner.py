"""The worker pool: judge (case, exporter) pairs in processes that may crash or hang.

Each worker is a spawned process that judges one pair at a time; a worker
that dies or exceeds the time limit is killed, replaced, and its pair
recorded as an error (``worker crashed`` / ``timeout``). Results are plain
dicts (``judge.Outcome`` fields plus ``case`` and ``exporter``).
"""

from __future__ import annotations

import collections
import json
import multiprocessing as mp
import os
import sys
import time
from collections.abc import Callable
from multiprocessing.connection import wait


def _worker(conn) -> None:
    """Judge (case, exporter) pairs sent over ``conn`` until it closes."""
    import warnings

    warnings.simplefilter("ignore")
    import torch

    torch.set_num_threads(1)
    from . import SUITES, case_names
    from .judge import Outcome, judge

    for suite in SUITES:  # import the databases before the clock of the first case starts
        case_names(suite)
    conn.send("ready")

    while True:
        try:
            name, exporter = conn.recv()
        except EOFError:
            return
        try:
            outcome = judge(name, exporter)
        except Exception as exc:  # noqa: BLE001 (the case builder failed: not a case)
            outcome = Outcome("n/a", f"build raised {type(exc).__name__}: {str(exc)[:200]}")
        conn.send(outcome.__dict__)


class Worker:
    def __init__(self, ctx):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker, args=(child,), daemon=True)
        self.proc.start()
        child.close()
        self.task: tuple[str, str] | None = None
        self.started = 0.0
        self.ready = False

    def give(self, task: tuple[str, str]) -> None:
        self.task, self.started = task, time.monotonic()
        self.conn.send(task)

    def wait_ready(self) -> None:
        """Block until the worker has imported torch and the databases."""
        if not self.ready:
            if self.conn.recv() != "ready":
                raise RuntimeError("worker did not start")
            self.ready = True

    def stop(self) -> None:
        self.proc.kill()
        self.proc.join()


def run(tasks: list[tuple[str, str]], workers: int, timeout: float, sink: Callable[[dict], None]) -> None:
    ctx = mp.get_context("spawn")
    pool = [Worker(ctx) for _ in range(min(workers, len(tasks)))]
    pending = collections.deque(tasks)
    done = 0
    for w in pool:
        w.wait_ready()
        if pending:
            w.give(pending.popleft())
    while any(w.task for w in pool):
        ready = wait([w.conn for w in pool if w.task] + [w.proc.sentinel for w in pool if w.task], timeout=1.0)
        now = time.monotonic()
        for i, w in enumerate(pool):
            if w.task is None:
                continue
            result = None
            if w.conn in ready:
                try:
                    result = w.conn.recv()
                except (EOFError, OSError):
                    result = None
            if result is None and (w.proc.sentinel in ready or not w.proc.is_alive()):
                result = {"status": "error", "detail": f"worker died (exit code {w.proc.exitcode})",
                          "signature": "worker crashed", "seconds": round(now - w.started, 3)}
            elif result is None and now - w.started > timeout:
                result = {"status": "error", "detail": f"timed out after {timeout:.0f}s",
                          "signature": "timeout", "seconds": round(now - w.started, 3)}
            if result is None:
                continue
            name, exporter = w.task
            sink({"case": name, "exporter": exporter, **result})
            done += 1
            if done % 100 == 0:
                print(f"  {done}/{len(tasks)}", file=sys.stderr, flush=True)
            if result["signature"] in ("worker crashed", "timeout"):
                w.stop()
                pool[i] = w = Worker(ctx)
                w.wait_ready()
            w.task = None
            if pending:
                w.give(pending.popleft())
    for w in pool:
        w.conn.close()
        w.proc.join(timeout=5)
        if w.proc.is_alive():
            w.stop()


def load_results(path: str) -> dict[tuple[str, str], dict]:
    results = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                if line.strip():
                    r = json.loads(line)
                    results[(r["case"], r["exporter"])] = r
    return results
