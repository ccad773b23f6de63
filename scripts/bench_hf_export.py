"""Export time of tiny transformers models: ours vs ``torch.export.export``, same process.

For each model (tests/tiny_hf.py: BERT, GPT-2, DistilBERT built from configs,
random weights, offline), each exporter runs once to warm up (ours is also
verified against eager), then all run ``--runs`` times in rotating order; the
table gives the median seconds and the ratios. Besides ``torch.export.export``
(which keeps in-place ops), ``export(...).run_decompositions({})`` is timed:
torch's functional program, the one that does the same job as ours. Timings on a shared machine are noisy: read the
ratio, not the absolute numbers. Usage:
``python scripts/bench_hf_export.py [--runs 5] [--models bert,gpt2,distilbert]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from typing import Callable

import torch

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [_ROOT, os.path.join(_ROOT, "tests")]  # this checkout's package and test models

import predispatch_func as pf  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402
from tiny_hf import MODELS  # noqa: E402


def _seconds(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench(name: str, runs: int) -> dict[str, float]:
    model, args, kwargs = MODELS[name]()
    exporters = {
        "ours": lambda: pf.export(model, args, kwargs),
        "torch": lambda: torch.export.export(model, args, kwargs),
        # torch's functional program, the one comparable to ours
        "torch+decomp": lambda: torch.export.export(model, args, kwargs).run_decompositions({}),
    }
    pf.verify(exporters["ours"](), model, args, kwargs, raise_on_failure=True)  # warm-up, and it is right
    exporters["torch+decomp"]()
    times: dict[str, list[float]] = {k: [] for k in exporters}
    for i in range(runs):
        order = list(exporters)[i % 3:] + list(exporters)[:i % 3]  # rotate who goes first
        for key in order:
            times[key].append(_seconds(exporters[key]))
    return {k: statistics.median(v) for k, v in times.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--models", default=",".join(MODELS))
    opts = parser.parse_args(argv)
    table = Table(title=f"export time, median of {opts.runs} rotating runs after warm-up "
                        f"(torch {torch.__version__})")
    for column in ("model", "ours (s)", "torch.export.export (s)", "ours / torch",
                   "torch export+run_decompositions({}) (s)", "ours / that"):
        table.add_column(column, justify="left" if column == "model" else "right")
    for name in opts.models.split(","):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            med = bench(name, opts.runs)
        table.add_row(name, f"{med['ours']:.3f}", f"{med['torch']:.3f}", f"{med['ours'] / med['torch']:.2f}x",
                      f"{med['torch+decomp']:.3f}", f"{med['ours'] / med['torch+decomp']:.2f}x")
    Console(width=160).print(table)


if __name__ == "__main__":
    main()
