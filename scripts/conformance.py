"""Conformance run: PyTorch's own test databases through ours and torch.export.

Each case of ``tests/conformance`` (ExportDB, ModuleInfo, OpInfo, hop_db) is
exported with ``predispatch_func.export`` and with ``torch.export.export`` in
the same run, and both programs are replayed against eager by the same oracle
(``tests/conformance/judge.py``). Each (case, exporter) runs in a worker
process with a time limit; a worker that crashes or hangs is replaced and the
case recorded as an error. Results go to a jsonl file, one line per (case,
exporter), so an interrupted run resumes where it stopped.

Usage::

    python scripts/conformance.py [--suite opinfo] [--limit N | --sample N] [--workers 2]
        [--results docs/conformance.jsonl] [--timeout 60] [--report docs/conformance.md] [-k SUBSTR]
    python scripts/conformance.py --report-only   # rebuild the report from the results file
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing as mp
import os
import random
import subprocess
import sys
import time
from multiprocessing.connection import wait

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [_ROOT, os.path.join(_ROOT, "tests")]

STATUSES = ("ok", "wrong", "refusal", "error")


# --- workers ------------------------------------------------------------------------


def _worker(conn) -> None:
    """Judge (case, exporter) pairs sent over ``conn`` until it closes."""
    import warnings

    warnings.simplefilter("ignore")
    import torch

    torch.set_num_threads(1)
    from conformance.judge import Outcome, judge

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

    def give(self, task: tuple[str, str]) -> None:
        self.task, self.started = task, time.monotonic()
        self.conn.send(task)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.join()


def run(tasks: list[tuple[str, str]], workers: int, timeout: float, sink) -> None:
    ctx = mp.get_context("spawn")
    pool = [Worker(ctx) for _ in range(min(workers, len(tasks)))]
    pending = collections.deque(tasks)
    done = 0
    for w in pool:
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
            if result["signature"] in ("worker crashed", "timeout"):
                w.stop()
                pool[i] = w = Worker(ctx)
            w.task = None
            if pending:
                w.give(pending.popleft())
        if done and done % 100 == 0:
            print(f"  {done}/{len(tasks)}", file=sys.stderr, flush=True)
    for w in pool:
        w.conn.close()
        w.proc.join(timeout=5)
        if w.proc.is_alive():
            w.stop()


# --- results and report --------------------------------------------------------------


def load_results(path: str) -> dict[tuple[str, str], dict]:
    results = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                if line.strip():
                    r = json.loads(line)
                    results[(r["case"], r["exporter"])] = r
    return results


def _commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=_ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=_ROOT, check=False,
                               capture_output=True, text=True).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except Exception:  # noqa: BLE001
        return "unknown"


def report(results: dict[tuple[str, str], dict], suites: list[str], meta: dict) -> str:
    import torch

    by_case: dict[str, dict[str, dict]] = collections.defaultdict(dict)
    for (case, exporter), r in results.items():
        if case.split("/", 1)[0] in suites:
            by_case[case][exporter] = r
    lines = ["# Conformance against PyTorch's own test databases", "",
             "Generated by `python scripts/conformance.py` (do not edit by hand).", "",
             f"- commit: `{meta.get('commit', _commit())}`, torch `{torch.__version__}`",
             f"- run: {meta.get('run', '')}", "",
             ("Each case is exported with ours and with `torch.export.export` in the same run and both "
             "programs are replayed against eager (outputs, written-back inputs, buffers, parameters, "
             "each output's `requires_grad`, gradients, RNG state). `wrong`: exports but differs from "
             "eager (or, for ours, breaks the IR contract). `refusal`: a clear error (our "
             "`UnsupportedError`, torch's `UserError`). `error`: any other exception. Cases where eager "
             "itself raises, or the database has no such sample, are not counted."), ""]
    complete = {c: rs for c, rs in by_case.items() if len(rs) == 2 and "n/a" not in
                (rs["ours"]["status"], rs["torch"]["status"])}
    lines += ["## Summary", "", ("| suite | cases | ours ok / wrong / refusal / error | "
                                 "torch.export ok / wrong / refusal / error | ours not ok where torch ok |"),
              "|---|---|---|---|---|"]
    for suite in suites:
        rows = {c: rs for c, rs in complete.items() if c.startswith(suite + "/")}
        if not rows:
            continue
        counts = {e: collections.Counter(rs[e]["status"] for rs in rows.values()) for e in ("ours", "torch")}
        behind = sum(1 for rs in rows.values() if rs["torch"]["status"] == "ok" and rs["ours"]["status"] != "ok")
        cells = [" / ".join(str(counts[e][s]) for s in STATUSES) for e in ("ours", "torch")]
        lines.append(f"| {suite} | {len(rows)} | {cells[0]} | {cells[1]} | {behind} |")
    lines.append("")
    for suite in suites:
        rows = {c: rs for c, rs in complete.items() if c.startswith(suite + "/")}
        if not rows:
            continue
        lines += [f"## {suite}", ""]
        variants = collections.defaultdict(dict)
        for c, rs in rows.items():
            variants[c.split("/")[2]][c] = rs
        lines += ["| variant | cases | ours ok / wrong / refusal / error | torch.export ok / wrong / refusal / error |",
                  "|---|---|---|---|"]
        for variant, vrows in sorted(variants.items()):
            counts = {e: collections.Counter(rs[e]["status"] for rs in vrows.values()) for e in ("ours", "torch")}
            cells = [" / ".join(str(counts[e][s]) for s in STATUSES) for e in ("ours", "torch")]
            lines.append(f"| {variant} | {len(vrows)} | {cells[0]} | {cells[1]} |")
        lines.append("")
        wrong = sorted((c, rs) for c, rs in rows.items() if "wrong" in (rs["ours"]["status"], rs["torch"]["status"]))
        if wrong:
            lines += ["Silently wrong (ours / torch.export):", ""]
            for c, rs in wrong:
                for e in ("ours", "torch"):
                    if rs[e]["status"] == "wrong":
                        lines.append(f"- `{c}` {e} (torch.export: {rs['torch']['status']}): "
                                     f"{_md(rs[e]['detail'][:200])}" if e == "ours" else
                                     f"- `{c}` torch.export (ours: {rs['ours']['status']}): {_md(rs[e]['detail'][:200])}")
            lines.append("")
        for e, title in (("ours", "Our errors and refusals"), ("torch", "torch.export's errors and refusals")):
            clusters = collections.defaultdict(list)
            for c, rs in rows.items():
                if rs[e]["status"] in ("error", "refusal"):
                    clusters[(rs[e]["status"], rs[e]["signature"])].append(c)
            if not clusters:
                continue
            lines += [f"{title}, by cause:", "", "| n | kind | signature | e.g. |", "|---|---|---|---|"]
            for (status, sig), cs in sorted(clusters.items(), key=lambda kv: -len(kv[1])):
                lines.append(f"| {len(cs)} | {status} | {_md(sig)} | `{min(cs)}` |")
            lines.append("")
    na = sum(1 for rs in by_case.values() if any(r["status"] == "n/a" for r in rs.values()))
    lines += [f"Not counted: {na} case names with no sample or where eager raises.", ""]
    return "\n".join(lines)


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


# --- main ----------------------------------------------------------------------------


def select(suites: list[str], k: str | None, limit: int | None, sample: int | None, seed: int) -> list[str]:
    import conformance

    names = [n for s in suites for n in conformance.case_names(s) if not k or k in n]
    if sample is not None:
        rng = random.Random(seed)
        names = [n for s in suites for n in sorted(rng.sample([m for m in names if m.startswith(s + "/")],
                                                             min(sample, sum(m.startswith(s + "/") for m in names))))]
    if limit is not None:
        names = names[:limit]
    return names


def main(argv: list[str] | None = None) -> int:
    import conformance

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--suite", action="append", choices=conformance.SUITES, help="repeatable; default all")
    p.add_argument("-k", help="only cases whose name contains this")
    p.add_argument("--limit", type=int, help="the first N cases")
    p.add_argument("--sample", type=int, help="a seeded random N cases per suite")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per (case, exporter)")
    p.add_argument("--results", default=os.path.join(_ROOT, ".conformance", "results.jsonl"))
    p.add_argument("--report", default=os.path.join(_ROOT, "docs", "conformance.md"))
    p.add_argument("--fresh", action="store_true", help="ignore earlier results for the selected cases")
    p.add_argument("--report-only", action="store_true")
    a = p.parse_args(argv)
    suites = a.suite or list(conformance.SUITES)
    results = load_results(a.results)
    start = time.monotonic()
    n_run = 0
    if not a.report_only:
        names = select(suites, a.k, a.limit, a.sample, a.seed)
        tasks = [(n, e) for n in names for e in ("ours", "torch") if a.fresh or (n, e) not in results]
        n_run = len(tasks)
        print(f"{len(names)} cases, {len(tasks)} (case, exporter) runs to do, {a.workers} workers", file=sys.stderr)
        os.makedirs(os.path.dirname(os.path.abspath(a.results)), exist_ok=True)
        with open(a.results, "a") as f:
            def sink(r: dict) -> None:
                results[(r["case"], r["exporter"])] = r
                f.write(json.dumps(r) + "\n")
                f.flush()
            run(tasks, a.workers, a.timeout, sink)
    elapsed = time.monotonic() - start
    meta = {"commit": _commit(),
            "run": f"{n_run} (case, exporter) runs in {elapsed / 60:.1f} min with {a.workers} workers"
                   if n_run else "report rebuilt from the results file"}
    text = report(results, suites, meta)
    with open(a.report, "w") as f:
        f.write(text)
    print(text.split("## ", 2)[1] if "## " in text else text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
