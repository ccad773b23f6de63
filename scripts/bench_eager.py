"""Cost of ``pf.eager.on``: a forward+backward step under the mode against plain eager, CPU.

For every corpus model (train mode, a loss over the floating outputs):

* ``eager``: the plain step, median of ``--rounds``;
* ``cold``: the first step under the mode with the kernel cache emptied (plans
  decided and every decomposition traced on the way), over the plain step's
  median;
* ``warm``: the median step under the mode with the cache full, over plain;
* ``pass``: the median step under a dispatch mode that only forwards each op,
  over plain: what any Python dispatch mode costs before it decides anything
  (the part of ``warm`` that is not ours);
* distinct aten ops that reach the backend: plainly, and under the mode
  (Core ATen and the floor only).

Rounds alternate plain and mode so drift hits both. Prints a rich table and
writes markdown (``--md``) and JSON (``--json``).

Run: python -m scripts.bench_eager [--rounds 7] [--models bert,gpt2] [--md docs/eager_bench.md]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import warnings

import torch
from rich.console import Console
from rich.table import Table

os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.simplefilter("ignore")

import predispatch_func as pf  # noqa: E402
from predispatch_func import _torch_compat as tc  # noqa: E402
from predispatch_func.eager import mode as eager_mode  # noqa: E402
from tests.models.corpus import CASES, build  # noqa: E402

CORE = pf.OpSet.core_aten()
EXTRA = {"mixtral": ["aten.histc.default"], "wav2vec2": ["aten.linalg_vector_norm.default"]}


class PassThrough(tc.TorchDispatchMode):
    """Forwards every op, counting the distinct ones: the cost of any Python dispatch mode."""

    def __init__(self):
        super().__init__()
        self.ops: set = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(func)
        return func(*args, **(kwargs or {}))


def _loss(out):
    if isinstance(out, torch.Tensor):
        out = [out]
    values = out.values() if hasattr(out, "values") else out
    return sum(v.float().pow(2).mean() for v in values if isinstance(v, torch.Tensor) and v.is_floating_point())


def _step(model, args, kwargs):
    model.zero_grad(set_to_none=True)
    _loss(model(*args, **kwargs)).backward()


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench(name: str, rounds: int) -> dict:
    model, args, kwargs = build(name)
    model.train()
    target = CORE | pf.OpSet.from_names(EXTRA[name]) if name in EXTRA else CORE
    step = lambda: _step(model, args, kwargs)  # noqa: E731
    step()  # warm torch itself (allocator, lazy inits) before anything is timed
    passing = PassThrough()
    with passing:
        step()
    eager_mode._kernels_for.cache_clear()
    session = pf.eager.on(target)
    with session:
        cold = _timed(step)
    plain, warm, through = [], [], []
    for _ in range(rounds):
        plain.append(_timed(step))
        with session:
            warm.append(_timed(step))
        with PassThrough():
            through.append(_timed(step))
    base = statistics.median(plain)
    return {"model": name, "eager_ms": 1e3 * base, "cold": cold / base, "warm": statistics.median(warm) / base,
            "pass": statistics.median(through) / base,
            "ops_plain": len({op for op in passing.ops if getattr(op, "namespace", None) == "aten"}),
            "ops_mode": len({op for op in session.stats.reached if getattr(op, "namespace", None) == "aten"}),
            "decomposed": len(session.stats.decomposed)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--models", default="")
    parser.add_argument("--md", default="")
    parser.add_argument("--json", default="")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: steadier on a shared machine)")
    ns = parser.parse_args()
    torch.set_num_threads(ns.threads)
    names = [n for n in ns.models.split(",") if n] or list(CASES)
    rows = []
    for name in names:
        rows.append(bench(name, ns.rounds))
        print(rows[-1], flush=True)
    table = Table(title=f"pf.eager.on(core_aten) step time over plain eager, torch {torch.__version__}")
    cols = ["model", "eager ms", "cold", "warm", "pass-through mode", "ops plain", "ops under mode", "decomposed"]
    for c in cols:
        table.add_column(c)
    for r in rows:
        table.add_row(r["model"], f"{r['eager_ms']:.1f}", f"{r['cold']:.1f}x", f"{r['warm']:.2f}x",
                      f"{r['pass']:.2f}x", str(r["ops_plain"]), str(r["ops_mode"]), str(r["decomposed"]))
    Console().print(table)
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(rows, f, indent=1)
    if ns.md:
        with open(ns.md, "w") as f:
            f.write("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols) + "\n")
            for r in rows:
                f.write(f"| {r['model']} | {r['eager_ms']:.1f} | {r['cold']:.1f}x | {r['warm']:.2f}x | "
                        f"{r['pass']:.2f}x | {r['ops_plain']} | {r['ops_mode']} | {r['decomposed']} |\n")
            f.write(f"\nmedians of {ns.rounds} rounds, torch {torch.__version__}, CPU, "
                    f"{torch.get_num_threads()} threads\n")


if __name__ == "__main__":
    main()
