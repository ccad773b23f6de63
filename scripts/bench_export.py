"""Export time of ours against torch 2.13's entry points, on the tests/models corpus.

For every corpus model (eval mode) four exporters run in one process,
alternating within each round after a warm-up round, each call from a freshly
collected heap, and the median per exporter is reported, with two ratios to
torch.export: of the two medians, and the median of the per-round ratios
(paired: both calls of a round see the same state of a shared machine):

* ``ours``: ``predispatch_func.export`` (functional, regions kept, composites kept);
* ``torch.export``: ``torch.export.export`` (training IR, not functional);
* ``+run_decomp``: ``torch.export.export(...).run_decompositions({})`` (functional,
  regions lost);
* ``aot_pre``: torch's ``aot_export_module(pre_dispatch=True)`` (forward only);
* ``floor``: one bare ``make_fx(pre_dispatch=True)`` trace over fake state (scripts/bare_trace.py),
  the lower bound of this design; ``floor+meta`` the same recording each node's stack trace
  and module stack, as every program of ours does.

Then a depth sweep: the 7B Llama config on ``meta`` at 2, 8 and 32 layers,
ours and ``torch.export.export``. Prints rich tables and writes JSON.

Run: python -m scripts.bench_export [--rounds 5] [--models gpt2,llama] [--json out.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.simplefilter("ignore")

import predispatch_func as pf  # noqa: E402
from predispatch_func._torch_compat import exporting_state, pytree, torch_aot_export_module  # noqa: E402
from predispatch_func.graphs import all_graph_modules  # noqa: E402
from scripts.bare_trace import bare_trace  # noqa: E402
from scripts.export_7b_on_meta import build_on_meta  # noqa: E402
from tests.models.corpus import CASES, build  # noqa: E402


class _KwargsBound(torch.nn.Module):
    """``aot_export_module`` takes positional inputs and tensor outputs only:
    tensor kwargs are passed positionally after ``n_args`` positional args."""

    def __init__(self, model: torch.nn.Module, n_args: int, tensor_keys: list[str],
                 constants: dict) -> None:
        super().__init__()
        self.model, self.n_args, self.tensor_keys, self.constants = model, n_args, tensor_keys, constants

    def forward(self, *flat: Any) -> tuple:
        kwargs = {**self.constants, **dict(zip(self.tensor_keys, flat[self.n_args:]))}
        return tuple(pytree.tree_leaves(self.model(*flat[: self.n_args], **kwargs)))


def _ops(gm: torch.fx.GraphModule) -> int:
    return sum(1 for _, g in all_graph_modules(gm) for n in g.graph.nodes if n.op == "call_function")


def _ours(model, args, kwargs):
    return _ops(pf.export(model, args, kwargs).graph_module)


def _torch_export(model, args, kwargs):
    return _ops(torch.export.export(model, args, kwargs).graph_module)


def _run_decomp(model, args, kwargs):
    return _ops(torch.export.export(model, args, kwargs).run_decompositions({}).graph_module)


def _aot_pre(model, args, kwargs):
    # transformers' masks take traceable paths only when torch says it is exporting
    keys = [k for k, v in kwargs.items() if isinstance(v, torch.Tensor)]
    bound = _KwargsBound(model, len(args), keys, {k: v for k, v in kwargs.items() if k not in keys})
    with exporting_state():
        gm, _ = torch_aot_export_module(bound, (*args, *(kwargs[k] for k in keys)))
    return _ops(gm)


def _floor(model, args, kwargs):
    return _ops(bare_trace(model, args, kwargs))


def _floor_with_metadata(model, args, kwargs):
    return _ops(bare_trace(model, args, kwargs, metadata=True))


EXPORTERS: dict[str, Callable] = {
    "ours": _ours, "torch.export": _torch_export, "+run_decomp": _run_decomp, "aot_pre": _aot_pre,
    "floor": _floor, "floor+meta": _floor_with_metadata,
}


# wall time by default; `--clock cpu` reads the process's CPU time instead, which a
# loaded machine (other jobs on the same cores) disturbs far less than wall time
CLOCK: Callable[[], float] = time.perf_counter


def _timed(fn: Callable, *inputs: Any) -> tuple[float, int | str]:
    # each export starts from a collected heap: otherwise one exporter's run pays for
    # collecting the garbage the previous one (often the other exporter) left behind
    gc.collect()
    start = CLOCK()
    try:
        nodes = fn(*inputs)
    except Exception as exc:  # a failing exporter is reported, not fatal
        return float("nan"), f"{type(exc).__name__}"
    return CLOCK() - start, nodes


def bench(model: torch.nn.Module, args: tuple, kwargs: dict, rounds: int,
          exporters: dict[str, Callable]) -> dict[str, dict]:
    """Median seconds and node count per exporter; round 0 is the warm-up."""
    times: dict[str, list[float]] = {k: [] for k in exporters}
    nodes: dict[str, Any] = {}
    for r in range(rounds + 1):
        order = list(exporters) if r % 2 == 0 else list(reversed(exporters))
        for name in order:
            seconds, count = _timed(exporters[name], model, args, kwargs)
            nodes[name] = count
            if r > 0:
                times[name].append(seconds)
    return {k: {"median_s": statistics.median(times[k]), "nodes": nodes[k], "samples_s": times[k]}
            for k in exporters}


def _ratio(a: float, b: float) -> float:
    return a / b if b == b and b > 0 else float("nan")


def _paired_ratio(ours: list[float], theirs: list[float]) -> float:
    """Median over rounds of ours/theirs within the round. The two calls of a round run
    back to back, so a slow stretch of a shared machine (which moves single timings
    by tens of percent here) lands on both; the ratio of the two medians does not
    pair them and moves more from run to run."""
    pairs = [_ratio(a, b) for a, b in zip(ours, theirs)]
    pairs = [r for r in pairs if r == r]
    return statistics.median(pairs) if pairs else float("nan")


def corpus_table(results: dict[str, dict], console: Console) -> dict[str, float]:
    table = Table(title="export time (median seconds; ops incl. region bodies)")
    table.add_column("model")
    for name in EXPORTERS:
        table.add_column(name, justify="right")
    others = [k for k in EXPORTERS if k != "ours"]
    for name in others:
        table.add_column(f"ours/{name}", justify="right")
    paired_with = [k for k in ("torch.export", "floor") if k in EXPORTERS]
    for name in paired_with:
        table.add_column(f"ours/{name} paired", justify="right")
    ratios: dict[str, list[float]] = {k: [] for k in [*others, *(f"{p} paired" for p in paired_with)]}
    for model, res in results.items():
        cells = [f"{res[k]['median_s']:.3f} ({res[k]['nodes']})" for k in EXPORTERS]
        row = {k: _ratio(res["ours"]["median_s"], res[k]["median_s"]) for k in others}
        for name in paired_with:
            row[f"{name} paired"] = _paired_ratio(res["ours"]["samples_s"], res[name]["samples_s"])
        for k, r in row.items():
            if r == r:
                ratios[k].append(r)
        table.add_row(model, *cells, *[f"{r:.2f}" for r in row.values()])
    medians = {k: statistics.median(v) if v else float("nan") for k, v in ratios.items()}
    table.add_row("[b]median ratio", *[""] * len(EXPORTERS), *[f"[b]{medians[k]:.2f}" for k in ratios])
    table.add_row("[b]worst ratio", *[""] * len(EXPORTERS), *[f"{max(ratios[k], default=float('nan')):.2f}" for k in ratios])
    table.add_row("[b]models above 1.0", *[""] * len(EXPORTERS), *[str(sum(r > 1.0 for r in ratios[k])) for k in ratios])
    console.print(table)
    return medians


def depth_sweep(depths: list[int], rounds: int, console: Console) -> list[dict]:
    table = Table(title="depth sweep: 7B Llama config on meta (median seconds)")
    for col in ("layers", "ours", "torch.export", "ours/torch.export", "paired", "ours per layer"):
        table.add_column(col, justify="right")
    rows = []
    for depth in depths:
        model, ids = build_on_meta(depth)
        res = bench(model, (ids,), {}, rounds,
                    {"ours": _ours, "torch.export": _torch_export})
        ours, theirs = res["ours"]["median_s"], res["torch.export"]["median_s"]
        rows.append({"layers": depth, **{k: v for k, v in res.items()}})
        paired = _paired_ratio(res["ours"]["samples_s"], res["torch.export"]["samples_s"])
        table.add_row(str(depth), f"{ours:.2f}", f"{theirs:.2f}", f"{_ratio(ours, theirs):.2f}", f"{paired:.2f}",
                      f"{ours / depth:.3f}")
        del model
    console.print(table)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--models", default=",".join(CASES))
    parser.add_argument("--depths", default="2,8,32")
    parser.add_argument("--depth-rounds", type=int, default=3)
    parser.add_argument("--json", default="bench_export.json")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="cpu: process CPU time, one torch thread (for a machine other jobs share)")
    parser.add_argument("--exporters", default=",".join(EXPORTERS),
                        help="a subset of " + ",".join(EXPORTERS) + " (ours and torch.export always run)")
    opts = parser.parse_args()
    global CLOCK
    if opts.clock == "cpu":
        CLOCK = time.process_time
        torch.set_num_threads(1)
    for name in [k for k in list(EXPORTERS) if k not in ("ours", "torch.export")]:
        if name not in opts.exporters.split(","):
            del EXPORTERS[name]
    console = Console(width=170)
    torch.manual_seed(0)
    results = {}
    for name in [m for m in opts.models.split(",") if m]:
        model, args, kwargs = build(name)
        results[name] = bench(model, args, kwargs, opts.rounds, EXPORTERS)
        console.log(name, {k: round(v["median_s"], 3) for k, v in results[name].items()})
    medians = corpus_table(results, console) if results else {}
    depths = [int(d) for d in opts.depths.split(",") if d]
    sweep = depth_sweep(depths, opts.depth_rounds, console) if depths else []
    with open(opts.json, "w") as f:
        json.dump({"torch": torch.__version__, "rounds": opts.rounds, "clock": opts.clock, "models": results,
                   "median_ratios": medians, "depth_sweep": sweep}, f, indent=2, default=str)
    console.print(f"wrote {opts.json}")


if __name__ == "__main__":
    main()
