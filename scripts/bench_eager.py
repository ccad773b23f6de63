"""Cost of ``pf.eager.on``: a forward+backward step under the mode against plain eager, CPU
(or ``--device cuda``: the models and inputs on the GPU, each step synchronised).

For every corpus model (train mode, a loss over the floating outputs):

* ``eager``: the plain step, median of ``--rounds``;
* ``cold``: the first step of a session with every cache emptied (the kernels
  registered on the session's key, plans decided, every decomposition traced
  on the way), over the plain step's median;
* ``warm``: the median step of a session (keyed: the default) with the caches
  full, over plain;
* ``observed``: the same under ``observe=True`` (a Python dispatch mode that sees
  every op; what the fast path replaced), over plain;
* ``pass``: the median step under a dispatch mode that only forwards each op,
  over plain: what any Python dispatch mode costs before it decides anything;
* ``calls/step``: calls into our kernels per warm step (ops outside the target,
  each a trip into Python); ``ops plain`` / ``ops under mode``: distinct aten
  ops that reach the backend plainly, and under the (observed) mode; and
  ``decomposed``: distinct ops the backend was spared;
* ``grads``: the largest difference between a plain step's gradients and a
  warm session step's (same inputs, same weights): the mode must equal eager.

Rounds alternate plain, keyed, observed and pass-through so drift hits all
alike. Prints a rich table and writes markdown (``--md``) and JSON (``--json``).

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
from predispatch_func.eager import above_autograd, session_key  # noqa: E402
from predispatch_func.eager import mode as eager_mode  # noqa: E402
from tests.models.corpus import CASES, build  # noqa: E402

CORE = pf.OpSet.core_aten()
# ops torch has no ATen decomposition for, met by these models: the backend must have them
EXTRA = {"mixtral": ["aten.histc.default"], "wav2vec2": ["aten.linalg_vector_norm.default"]}


CUDA_ATTENTION = [f"aten.{kind}.default" for kind in (  # sdpa's fused CUDA kernels and what they call
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_backward",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_efficient_attention_backward",
    "_flash_attention_forward", "_flash_attention_backward",
    "_efficient_attention_forward", "_efficient_attention_backward")]


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


DEVICE = "cpu"


def _sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def _timed(fn) -> float:
    _sync()
    start = time.perf_counter()
    fn()
    _sync()
    return time.perf_counter() - start


def _grads(model) -> dict:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _largest_difference(a: dict, b: dict) -> float:
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
    return max(((x.double() - b[n].double()).abs().max().item() for n, x in a.items()), default=0.0)


def _cold_caches() -> None:
    """Forget every plan, trace and registration, as in a fresh process."""
    session_key.release()
    eager_mode._kernels_for.cache_clear()
    above_autograd._graphs.clear()


def bench(name: str, rounds: int) -> dict:
    model, args, kwargs = build(name)
    model.train().to(DEVICE)
    move = lambda value: tc.pytree.tree_map_only(torch.Tensor, lambda t: t.to(DEVICE), value)  # noqa: E731
    args, kwargs = move(args), move(kwargs)
    target = CORE | pf.OpSet.from_names(EXTRA[name]) if name in EXTRA else CORE
    if DEVICE == "cuda":  # sdpa's fused CUDA kernels have no decomposition: a GPU backend has them
        target = target | pf.OpSet.from_names(CUDA_ATTENTION)
    step = lambda: _step(model, args, kwargs)  # noqa: E731
    step()  # warm torch itself (allocator, lazy inits) before anything is timed
    passing = PassThrough()
    with passing:
        step()
    _cold_caches()
    session = pf.eager.on(target)
    with session:
        cold = _timed(step)
    assert session.keyed
    observed = pf.eager.on(target, observe=True)
    with observed:
        step()
    plain, warm, seen, through = [], [], [], []
    calls_before = sum(n for _, n in session.stats.decomposed.items())
    for _ in range(rounds):
        plain.append(_timed(step))
        with session:
            warm.append(_timed(step))
        with observed:
            seen.append(_timed(step))
        with PassThrough():
            through.append(_timed(step))
    calls = (sum(n for _, n in session.stats.decomposed.items()) - calls_before) / rounds
    step()
    plain_grads = _grads(model)
    with session:
        step()
    grads = _largest_difference(plain_grads, _grads(model))
    base = statistics.median(plain)
    return {"model": name, "eager_ms": 1e3 * base, "cold": cold / base, "warm": statistics.median(warm) / base,
            "observed": statistics.median(seen) / base, "pass": statistics.median(through) / base,
            "calls": calls, "grads": grads,
            "ops_plain": len({op for op in passing.ops if getattr(op, "namespace", None) == "aten"}),
            "ops_mode": len({op for op in observed.stats.reached if getattr(op, "namespace", None) == "aten"}),
            "decomposed": len(observed.stats.decomposed)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--models", default="")
    parser.add_argument("--md", default="")
    parser.add_argument("--json", default="")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: steadier on a shared machine)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ns = parser.parse_args()
    global DEVICE
    DEVICE = ns.device
    torch.set_num_threads(ns.threads)
    names = [n for n in ns.models.split(",") if n] or list(CASES)
    rows = []
    for name in names:
        try:
            rows.append(bench(name, ns.rounds))
        except Exception as exc:  # noqa: BLE001 (a refusal is a result: its row says so)
            print(f"{name}: {type(exc).__name__}: {str(exc).splitlines()[0]}", flush=True)
            continue
        print(rows[-1], flush=True)
    table = Table(title=f"pf.eager.on(core_aten) step time over plain eager, torch {torch.__version__}")
    cols = ["model", "eager ms", "cold", "warm", "observed (Python mode)", "pass-through mode", "calls/step",
            "ops plain", "ops under mode", "decomposed", "grads vs eager"]
    for c in cols:
        table.add_column(c)
    cells = [[r["model"], f"{r['eager_ms']:.1f}", f"{r['cold']:.1f}x", f"{r['warm']:.2f}x", f"{r['observed']:.2f}x",
              f"{r['pass']:.2f}x", f"{r['calls']:.0f}", str(r["ops_plain"]), str(r["ops_mode"]), str(r["decomposed"]),
              f"{r['grads']:.1e}"]
             for r in rows]
    for row in cells:
        table.add_row(*row)
    Console().print(table)
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(rows, f, indent=1)
    if ns.md:
        with open(ns.md, "w") as f:
            f.write("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols) + "\n")
            for row in cells:
                f.write("| " + " | ".join(row) + " |\n")
            where = torch.cuda.get_device_name() if DEVICE == "cuda" else "CPU"
            f.write(f"\nmedians of {ns.rounds} rounds, torch {torch.__version__}, {where}, "
                    f"{torch.get_num_threads()} CPU threads\n")


if __name__ == "__main__":
    main()
