"""Export time of ours against ``torch.export.export`` over the third-party zoo, warm and cold, per family.

Every model of ``tests/models/zoo.py`` this interpreter can build (our corpus is among
its transformers), CPU time of the process with one torch thread, the heap collected
before each timed call:

* **warm**, one process for the whole run: per model, a first export by each exporter
  (not timed), then ``--rounds`` rounds with all alternating; the model's ratio is
  the median of the per-round ratios (paired: all calls of a round see the same
  state of a shared machine). A third "exporter" is the floor: one bare pre-dispatch
  ``make_fx`` trace over fake state (scripts/bare_trace.py), kept as ``floor_ratio``
  (ours / floor).
* **cold**, the way the CLI and conversion scripts run: per model, ``--processes``
  fresh interpreters per exporter, alternating; each imports torch and the model's
  library, builds the model, then times importing the exporter and its first export.
  The model's ratio is the median of ours over the median of torch.export's.
  ``--baseline DIR`` adds a third exporter in the same alternation: ours from another
  checkout (``git worktree add DIR main``), so a change is measured before and after
  under the same load; its seconds and ratio are kept as ``baseline`` in the results.
  ``--empty-cache``: each process gets a new, empty ``$PREDISPATCH_FUNC_CACHE``, as on a
  machine that never ran the package (results go to ``zoo-cold-empty-...``).

Ratios are kept for models both exporters export. Results are appended to
``.bench/zoo-<mode>-torch-<release>.jsonl`` (a rerun resumes); ``--report`` writes
``docs/runs/bench_zoo-torch-<release>.md``: per-family medians and the worst models.

Run:
    python -m scripts.bench_zoo --mode warm [--rounds 5] [--per-family N] [-k SUBSTR] [--heavy]
    python -m scripts.bench_zoo --mode cold [--processes 3] [--per-family 3] [--baseline DIR]
    python -m scripts.bench_zoo --report
"""

from __future__ import annotations

import argparse
import compileall
import gc
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAMILY_ORDER = ("conv", "vision-transformer", "vision", "detection", "segmentation", "video", "optical-flow",
                "encoder", "decoder", "encoder-decoder", "audio", "state-space", "moe")


def release() -> str:
    return torch.__version__.split("+", 1)[0]


def _results_path(mode: str) -> str:
    return os.path.join(_ROOT, ".bench", f"zoo-{mode}-torch-{release()}.jsonl")


def _exporters() -> dict[str, Callable[..., Any]]:
    import predispatch_func as pf
    from scripts.bare_trace import bare_trace
    return {"ours": pf.export, "torch.export": torch.export.export, "floor": bare_trace}


def _timed(export: Callable[..., Any], model: torch.nn.Module, args: tuple, kwargs: dict) -> float:
    gc.collect()
    start = time.process_time()
    export(model, args, kwargs)
    return time.process_time() - start


def _selected(args: argparse.Namespace) -> list:
    from tests.models.zoo import zoo
    chosen, per_family = [], {}
    for zm in zoo():
        if (zm.heavy and not args.heavy) or (args.k and args.k not in zm.name) \
                or (args.family and zm.family != args.family):
            continue
        per_family[zm.family] = per_family.get(zm.family, 0) + 1
        if args.per_family and per_family[zm.family] > args.per_family:
            continue
        chosen.append(zm)
    return chosen[:args.limit]


def _done(path: str) -> set[str]:
    if not os.path.exists(path):
        return set()
    with open(path) as f:
        return {json.loads(line)["name"] for line in f if line.strip()}


def _append(path: str, row: dict) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


# --- warm ---------------------------------------------------------------------------------


def warm(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    exporters = _exporters()
    path = args.results or _results_path("warm")
    todo = [zm for zm in _selected(args) if zm.name not in _done(path)]
    for i, zm in enumerate(todo):
        row: dict[str, Any] = {"name": zm.name, "library": zm.library, "family": zm.family}
        try:
            model, margs, mkwargs = zm.build()
        except Exception as e:  # noqa: BLE001 (a model this install cannot build is a result)
            _append(path, {**row, "status": f"not built: {type(e).__name__}"})
            continue
        failed = {}
        for name, export in exporters.items():
            try:
                _timed(export, model, margs, mkwargs)
            except Exception as e:  # noqa: BLE001
                failed[name] = f"{type(e).__name__}: {e}".splitlines()[0][:200]
        if failed:
            _append(path, {**row, "status": "failed", "failed": failed})
            print(f"[{i + 1}/{len(todo)}] {zm.name}: failed {sorted(failed)}", flush=True)
            continue
        seconds: dict[str, list[float]] = {name: [] for name in exporters}
        for _ in range(args.rounds):
            for name, export in exporters.items():
                seconds[name].append(_timed(export, model, margs, mkwargs))
        paired = statistics.median(o / t for o, t in zip(seconds["ours"], seconds["torch.export"]))
        floor = statistics.median(o / t for o, t in zip(seconds["ours"], seconds["floor"]))
        _append(path, {**row, "status": "ok", "seconds": seconds, "ratio": paired, "floor_ratio": floor})
        print(f"[{i + 1}/{len(todo)}] {zm.name}: ours {statistics.median(seconds['ours']):.3f} s, torch.export "
              f"{statistics.median(seconds['torch.export']):.3f} s, floor {statistics.median(seconds['floor']):.3f} s, "
              f"paired ratio {paired:.2f}, ours/floor {floor:.2f}", flush=True)


# --- cold ---------------------------------------------------------------------------------


def cold_worker(name: str, exporter: str) -> None:
    """In a fresh interpreter: build ``name``, then time importing ``exporter`` and its first export."""
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    from tests.models.zoo import zoo
    model, margs, mkwargs = {zm.name: zm for zm in zoo()}[name].build()
    gc.collect()
    start = time.process_time()
    if exporter == "ours":
        import predispatch_func as pf
        pf.export(model, margs, mkwargs)
    elif exporter == "floor":
        from scripts.bare_trace import bare_trace
        bare_trace(model, margs, mkwargs)
    else:
        importlib.import_module("torch.export").export(model, margs, mkwargs)
    print(json.dumps({"seconds": time.process_time() - start}))


def _cold_once(name: str, exporter: str, baseline: str | None = None, empty_cache: bool = False) -> float | str:
    """One fresh process; ``baseline`` runs ours from that checkout (its package and this script)."""
    root = baseline if exporter == "baseline" else _ROOT
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    if empty_cache:
        with tempfile.TemporaryDirectory(prefix="pf-cold-") as fresh:
            return _cold_in(name, exporter, root, {**env, "PREDISPATCH_FUNC_CACHE": fresh})
    return _cold_in(name, exporter, root, env)


def _cold_in(name: str, exporter: str, root: str, env: dict[str, str]) -> float | str:
    run = subprocess.run([sys.executable, "-m", "scripts.bench_zoo", "--cold-worker", name,
                          "ours" if exporter == "baseline" else exporter],
                         cwd=root, env=env, capture_output=True, text=True, timeout=900)
    lines = [line for line in run.stdout.splitlines() if line.startswith("{")]
    if run.returncode or not lines:
        return (run.stderr.strip().splitlines() or ["no output"])[-1][:200]
    return float(json.loads(lines[-1])["seconds"])


def _compiled_package(baseline: str | None) -> None:
    """Bytecode for the package, as a pip install leaves it: with PYTHONDONTWRITEBYTECODE set
    (or a read-only checkout) every cold process would compile our sources and torch's not."""
    import predispatch_func
    compileall.compile_dir(os.path.dirname(predispatch_func.__file__), quiet=1)
    if baseline:
        compileall.compile_dir(os.path.join(baseline, "predispatch_func"), quiet=1)


def cold(args: argparse.Namespace) -> None:
    _compiled_package(args.baseline)
    path = args.results or _results_path("cold-empty" if args.empty_cache else "cold")
    todo = [zm for zm in _selected(args) if zm.name not in _done(path)]
    for i, zm in enumerate(todo):
        row: dict[str, Any] = {"name": zm.name, "library": zm.library, "family": zm.family}
        seconds: dict[str, list[float]] = {"ours": [], "torch.export": [], **({"baseline": []} if args.baseline else {})}
        failed = {}
        for _ in range(args.processes):
            for exporter in seconds:
                got = _cold_once(zm.name, exporter, args.baseline, args.empty_cache)
                if isinstance(got, str):
                    failed[exporter] = got
                else:
                    seconds[exporter].append(got)
            if failed:
                break
        if failed:
            _append(path, {**row, "status": "failed", "failed": failed})
            print(f"[{i + 1}/{len(todo)}] {zm.name}: failed {failed}", flush=True)
            continue
        ratios = {name: statistics.median(seconds[name]) / statistics.median(seconds["torch.export"])
                  for name in seconds if name != "torch.export"}
        extra = {"baseline_ratio": ratios["baseline"]} if "baseline" in ratios else {}
        _append(path, {**row, "status": "ok", "seconds": seconds, "ratio": ratios["ours"], **extra})
        print(f"[{i + 1}/{len(todo)}] {zm.name}: " + ", ".join(
            f"{name} {statistics.median(got):.2f} s" for name, got in seconds.items())
            + ", ratio " + ", ".join(f"{name} {r:.2f}" for name, r in ratios.items()), flush=True)


# --- the report ---------------------------------------------------------------------------


def _rows(mode: str) -> list[dict]:
    path = _results_path(mode)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [r for r in rows if r["status"] == "ok"]


def _median_seconds(row: dict, exporter: str) -> float:
    return statistics.median(row["seconds"][exporter])


def _median_or_dash(values: list[float]) -> str:
    return f"{statistics.median(values):.2f}" if values else "-"


def _table(rows: list[dict], title: str) -> list[str]:
    """Per-family medians; ours/floor where the run timed the floor (warm runs since it exists)."""
    if not rows:
        return [f"## {title}", "", "Not run.", ""]
    families = sorted({r["family"] for r in rows},
                      key=lambda f: FAMILY_ORDER.index(f) if f in FAMILY_ORDER else len(FAMILY_ORDER))
    lines = [f"## {title}", "", "| family | models | ours s (median) | torch.export s (median) | median ratio | "
             "worst ratio | above 1.0 | ours/floor median | ours/floor worst |", "|---|---|---|---|---|---|---|---|---|"]
    for family in [*families, None]:
        group = [r for r in rows if family is None or r["family"] == family]
        ratios = [r["ratio"] for r in group]
        floors = [r["floor_ratio"] for r in group if "floor_ratio" in r]
        lines.append(f"| {family or '**all**'} | {len(group)} | "
                     f"{statistics.median(_median_seconds(r, 'ours') for r in group):.3f} | "
                     f"{statistics.median(_median_seconds(r, 'torch.export') for r in group):.3f} | "
                     f"{statistics.median(ratios):.2f} | {max(ratios):.2f} | {sum(x > 1.0 for x in ratios)} | "
                     f"{_median_or_dash(floors)} | {f'{max(floors):.2f}' if floors else '-'} |")
    worst = sorted(rows, key=lambda r: -r["ratio"])[:12]
    lines += ["", "Worst models:", "", "| model | family | ours s | torch.export s | ratio | ours/floor |",
              "|---|---|---|---|---|---|"]
    lines += [f"| {r['name']} | {r['family']} | {_median_seconds(r, 'ours'):.3f} | "
              f"{_median_seconds(r, 'torch.export'):.3f} | {r['ratio']:.2f} | "
              f"{r['floor_ratio']:.2f} |" if "floor_ratio" in r else
              f"| {r['name']} | {r['family']} | {_median_seconds(r, 'ours'):.3f} | "
              f"{_median_seconds(r, 'torch.export'):.3f} | {r['ratio']:.2f} | - |" for r in worst]
    return [*lines, ""]


def report(args: argparse.Namespace) -> None:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=_ROOT, capture_output=True,
                            text=True).stdout.strip()
    lines = [f"# Export time over the third-party zoo, torch {release()}", "",
             f"Generated by `python -m scripts.bench_zoo --report` at commit `{commit}` (torch {torch.__version__}). "
             "Process CPU time with one torch thread; ratios are ours / `torch.export.export` for models both "
             "export. Warm: one process, a first export of each model by each exporter untimed, then "
             "alternating rounds; a model's ratio is the median of its per-round ratios. Cold: fresh "
             "interpreters, alternating; each builds the model, then times importing the exporter and its "
             "first export; a model's ratio is the median of ours over the median of torch.export's. "
             f"{args.note}".strip(), ""]
    lines += _table(_rows("warm"), "Warm (paired)")
    lines += _table(_rows("cold"), "Cold (first export in a fresh process)")
    lines += _table(_rows("cold-empty"), "Cold with an empty cache directory (`--empty-cache`)")
    out = args.out or os.path.join(_ROOT, "docs", "runs", f"bench_zoo-torch-{release()}.md")
    with open(out, "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=("warm", "cold"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--per-family", type=int, default=0, help="the first N models of each family")
    parser.add_argument("--family")
    parser.add_argument("-k", help="models whose name contains this")
    parser.add_argument("--limit", type=int)
    parser.add_argument("--heavy", action="store_true", help="include the zoo's heavy models")
    parser.add_argument("--results", help="results file (default .bench/zoo-<mode>-torch-<release>.jsonl)")
    parser.add_argument("--baseline", help="cold: also time ours from this checkout, alternating")
    parser.add_argument("--empty-cache", action="store_true",
                        help="cold: a new empty $PREDISPATCH_FUNC_CACHE for every process")
    parser.add_argument("--report", action="store_true")
    parser.add_argument("--note", default="", help="a sentence for the report (machine load, ...)")
    parser.add_argument("--out")
    parser.add_argument("--cold-worker", nargs=2, metavar=("MODEL", "EXPORTER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cold_worker:
        cold_worker(*args.cold_worker)
    elif args.report:
        report(args)
    elif args.mode == "warm":
        warm(args)
    elif args.mode == "cold":
        cold(args)
    else:
        parser.error("--mode warm|cold or --report")


if __name__ == "__main__":
    main()
