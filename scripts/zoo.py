"""The third-party model zoo through ours and torch.export, in one run.

Every model of ``tests/models/zoo.py`` this interpreter can build (torchvision and
timm need a torchvision wheel that loads on this torch) is exported with
``predispatch_func.export`` and with ``torch.export.export``, each program replayed
against the reference over three calls by the same replay, ours contract-checked, both
exports timed in CPU time (one warm-up export of a small conv net by each first).
Results go to a jsonl file, one line per model, so an interrupted run resumes; the
report is ``docs/zoo/torch-<release>.md`` and ``.json``: per-library counts (built /
ours ok / torch.export ok / ours-only failures / silently wrong), per-family export
time medians, and one row per model.

On a GPU, ``--device cuda [--precision bf16]`` runs the light models there (under
``autocast("cuda", bfloat16)`` for bf16), torch.export judged only where ours is not ok; the
report is ``docs/zoo/torch-<release>-cuda-<precision>.md``. ``--shard K/N`` runs every N-th
model from the K-th (0-based), for N processes in parallel, each with its own results file
(concatenate them, then ``--report-only``).

Usage::

    python -m scripts.zoo [--library timm] [-k SUBSTR] [--limit N] [--results PATH] [--timeout 300]
    python -m scripts.zoo --device cuda --precision bf16 --shard 0/8 --results .zoo/cuda-bf16-0.jsonl
    python -m scripts.zoo --report-only
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import torch
from torch import nn

import predispatch_func as pf
from tests.models.zoo import zoo
from tests.models.zoo_run import run_one, tolerance

LIBRARIES = ("torchvision", "timm", "transformers")


def release() -> str:
    return torch.__version__.split("+", 1)[0]


def warm_up() -> None:
    """One export of a small conv net by each exporter, so neither pays its first-export costs on a zoo model."""
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.LazyLinear(2))
    x = torch.randn(2, 3, 8, 8)
    model(x)
    pf.export(model.eval(), (x,))
    torch.export.export(model, (x,))


def run(args: argparse.Namespace) -> None:
    done = set()
    if os.path.exists(args.results):
        with open(args.results) as f:
            done = {json.loads(line)["name"] for line in f if line.strip()}
    todo = [m for m in zoo() if (not args.library or m.library == args.library)
            and (not args.k or args.k in m.name) and not (args.device != "cpu" and m.heavy)]
    if args.shard:  # before dropping what is done, so a resumed shard keeps its models
        k, n = (int(part) for part in args.shard.split("/"))
        todo = todo[k::n]
    todo = [m for m in todo if m.name not in done][:args.limit]
    if not todo:
        return
    # round robin over the libraries, so an interrupted run has covered each of them
    position = {m.name: i for lib in LIBRARIES for i, m in enumerate(m for m in todo if m.library == lib)}
    todo.sort(key=lambda m: (m.heavy, position[m.name]))  # the heavy models last
    warm_up()
    os.makedirs(os.path.dirname(args.results) or ".", exist_ok=True)
    for i, zm in enumerate(todo):
        start = time.time()
        result = run_one(zm, timeout=args.timeout, device=args.device, precision=args.precision,
                         torch_only_where_ours_misses=args.device != "cpu")
        with open(args.results, "a") as f:
            f.write(json.dumps(result.as_dict()) + "\n")
        ours = result.ours.status if result.ours else "-"
        theirs = result.torch.status if result.torch else "-"
        print(f"[{i + 1}/{len(todo)}] {zm.name}: built={result.built} ours={ours} torch={theirs} "
              f"({time.time() - start:.0f} s)", flush=True)
        if any(o is not None and "timed out" in o.error for o in (result.ours, result.torch)):
            # the alarm fires anywhere, possibly inside torch with a mode or a patch half-undone: the
            # next model gets a fresh process (the run resumes from its results file)
            sys.stdout.flush()
            os.execv(sys.executable, [sys.executable, "-m", "scripts.zoo", *sys.argv[1:]])


# --- the report ---------------------------------------------------------------------------


def _ok(outcome: dict | None) -> bool:
    return bool(outcome) and outcome["status"] == "ok"


def _counts(rows: list[dict]) -> dict[str, int]:
    built = [r for r in rows if r["built"]]
    return {
        "built": len(built),
        "ours ok": sum(_ok(r["ours"]) for r in built),
        "torch.export ok": sum(_ok(r["torch"]) for r in built),
        "ours-only failures": sum(_ok(r["torch"]) and not _ok(r["ours"]) for r in built),
        "torch.export-only failures": sum(_ok(r["ours"]) and not _ok(r["torch"]) for r in built),
        "ours silently wrong": sum(bool(r["ours"]) and r["ours"]["status"] == "wrong" for r in built),
        "torch.export silently wrong": sum(bool(r["torch"]) and r["torch"]["status"] == "wrong" for r in built),
        "timed out (either)": sum(_timed_out(r["ours"]) or _timed_out(r["torch"]) for r in built),
        "not built": len(rows) - len(built),
    }


def _timed_out(outcome: dict | None) -> bool:
    return bool(outcome) and outcome["status"] == "failed" and "timed out" in outcome["error"]


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):.2f}" if values else "-"


def _cell(outcome: dict | None) -> str:
    if not outcome:
        return "-"
    if outcome["status"] == "ok":
        return "ok"
    text = outcome["error"].replace("|", "\\|").replace("\n", " ")[:140]
    return f"**{outcome['status']}**" + (f" `{outcome['refusal']}`" if outcome["refusal"] else "") + f": {text}"


def _where(device: str, precision: str) -> str:
    return "" if (device, precision) == ("cpu", "fp32") else f"-{device}-{precision}"


def report(results: str, timeout: int, device: str = "cpu", precision: str = "fp32") -> None:
    with open(results) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    libraries = [lib for lib in LIBRARIES if any(r["library"] == lib for r in rows)]
    counts = {lib: _counts([r for r in rows if r["library"] == lib]) for lib in libraries}
    counts["all"] = _counts(rows)
    both = [r for r in rows if _ok(r["ours"]) and _ok(r["torch"])]
    families = sorted({r["family"] for r in both})
    timing = {fam: {"models": len(group := [r for r in both if r["family"] == fam]),
                    "ours s": _median([r["ours"]["seconds"] for r in group]),
                    "torch.export s": _median([r["torch"]["seconds"] for r in group]),
                    "ratio": _median([r["ours"]["seconds"] / r["torch"]["seconds"] for r in group])}
              for fam in families}
    timing["all"] = {"models": len(both), "ours s": _median([r["ours"]["seconds"] for r in both]),
                     "torch.export s": _median([r["torch"]["seconds"] for r in both]),
                     "ratio": _median([r["ours"]["seconds"] / r["torch"]["seconds"] for r in both])}
    missing = [lib for lib in LIBRARIES if lib not in libraries]
    title = f"# Third-party model zoo on torch {release()}"
    if (device, precision) != ("cpu", "fp32"):
        title += f", {device}" + (f" under autocast({precision})" if precision != "fp32" else "")
    lines = [title, "",
             f"Generated by `python -m scripts.zoo` (torch {torch.__version__}). Each model built offline with "
             "random weights, exported by ours and by `torch.export.export` in the same run, each program "
             f"replayed against the reference over {3} calls (outputs, inputs written back, buffers; gradients for the "
             "`[train]` rows), ours contract-checked. *Silently wrong*: exported without error, replay differs.", ""]
    if device != "cpu":
        lines += [f"On {device}: the light models only; torch.export run only where ours is not ok (enough to tell "
                  f"an ours-only failure), replay tolerance {tolerance(device, precision)}.", ""]
    planned = len([m for m in zoo() if device == "cpu" or not m.heavy])
    if len(rows) < planned:
        lines += [f"**Partial run**: {len(rows)} of the {planned} zoo models this install can build were run "
                  "(`python -m scripts.zoo` resumes from its results file).", ""]
    if missing:
        lines += [f"Not run on this torch: {', '.join(missing)} (no torchvision wheel loads on this torch build; "
                  "timm imports torchvision).", ""]
    ours_only = [r for r in rows if r["built"] and _ok(r["torch"]) and not _ok(r["ours"])]
    timed_out = [r["name"] for r in rows if r["built"] and (_timed_out(r["ours"]) or _timed_out(r["torch"]))]
    if timed_out:
        lines += [f"**Timed out** (export and replay over {timeout} s of wall time, on a CPU shared by "
                  "other jobs; not judged, to be rerun on an idle machine): " + ", ".join(timed_out) + ".", ""]
    if ours_only:
        lines += ["**Ours-only failures** (torch.export exports and is right, we are not): "
                  + ", ".join(r["name"] for r in ours_only) + ".", ""]
    keys = list(counts["all"])
    lines += ["| library | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
    lines += [f"| {lib} | " + " | ".join(str(c[k]) for k in keys) + " |" for lib, c in counts.items()]
    lines += ["", "## Export time (CPU seconds, models both export right; medians; ratio = median of ours/torch.export)",
              "", "| family | models | ours s | torch.export s | ratio |", "|---|---|---|---|---|"]
    lines += [f"| {fam} | {t['models']} | {t['ours s']} | {t['torch.export s']} | {t['ratio']} |"
              for fam, t in timing.items()]
    lines += ["", "## Models", "", "| model | family | ours | torch.export | ours s | torch.export s |",
              "|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: r["name"]):
        if not r["built"]:
            lines.append(f"| {r['name']} | {r['family']} | not built: {r['build_error'][:120]} | | | |")
            continue
        secs = [f"{o['seconds']:.2f}" if o and o["seconds"] is not None else "-" for o in (r["ours"], r["torch"])]
        lines.append(f"| {r['name']} | {r['family']} | {_cell(r['ours'])} | {_cell(r['torch'])} | "
                     f"{secs[0]} | {secs[1]} |")
    os.makedirs(os.path.join(_ROOT, "docs", "zoo"), exist_ok=True)
    base = os.path.join(_ROOT, "docs", "zoo", f"torch-{release()}{_where(device, precision)}")
    with open(base + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(base + ".json", "w") as f:
        json.dump({"torch": torch.__version__, "counts": counts, "timing": timing, "models": rows}, f, indent=1)
    print("\n".join(lines[: 12 + len(counts)]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--library", choices=LIBRARIES)
    parser.add_argument("-k", help="only models whose name contains this")
    parser.add_argument("--limit", type=int)
    parser.add_argument("--timeout", type=int, default=300, help="seconds per export and replay")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="fp32")
    parser.add_argument("--shard", help="K/N: every N-th model from the K-th (0-based)")
    parser.add_argument("--results")
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args()
    args.results = args.results or os.path.join(
        _ROOT, ".zoo", f"results-torch-{release()}{_where(args.device, args.precision)}.jsonl")
    if args.device != "cpu":  # eager's own bf16 backward varies run to run on a GPU (tests/cuda/conftest.py)
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
    if not args.report_only:
        run(args)
    report(args.results, args.timeout, args.device, args.precision)


if __name__ == "__main__":
    main()
