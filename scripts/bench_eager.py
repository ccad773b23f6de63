"""Cost of ``pf.eager.on``: a forward+backward step under the mode against plain eager, CPU
(or ``--device cuda``: the models and inputs on the GPU, each step synchronised).

For every corpus model (train mode, a loss over the floating outputs):

* ``eager``: the plain step, median of ``--rounds``;
* ``cold``: the first step of a session with every cache emptied and no disk
  cache (the kernels registered on the session's key, plans decided, every
  decomposition traced on the way), over the plain step's median;
* ``cold, disk``: the first step of a session in a fresh process (``--cold-child``)
  whose disk cache this run populated (``persisted_kernels``: registrations and
  traced kernels restored, nothing traced), over that process's own plain step;
  timed after a ``gc.collect()``, as a process that has built its model has had one;
* ``warm``: the median step of a session (keyed: the default) with the caches
  full, over plain;
* ``eager, math attention``: the plain step with sdpa on its math path
  (``sdpa_kernel([SDPBackend.MATH])``), over plain: what eager itself costs on a backend
  without fused attention, which is what a session on Core ATen runs (``eager/attention_path.py``);
  the floor of ``warm`` for a model with attention;
* ``observed``: the same under ``observe=True`` (a Python dispatch mode that sees
  every op; what the fast path replaced), over plain;
* ``pass``: the median step under a dispatch mode that only forwards each op,
  over plain: what any Python dispatch mode costs before it decides anything;
* ``calls/step``: calls into our kernels per warm step (ops outside the target,
  each a trip into Python but ``of them in C++``: the in-place ops the session's C++ kernel
  serves, ``native_registrations.NativeTwin``); ``ops plain`` / ``ops under mode``: distinct aten
  ops that reach the backend plainly, and under the (observed) mode; and
  ``decomposed``: distinct ops the backend was spared;
* ``grads``: the largest difference between a plain step's gradients and a
  warm session step's (same inputs, same weights): the mode must equal eager.

Steps are timed in this process's CPU time (``--clock wall`` for wall time): on a
machine shared with other jobs, their load moves wall time by 2x between rounds
and CPU time hardly at all. Rounds alternate plain, keyed, observed and pass-through so drift hits all
alike (``--quick``: plain and keyed only). ``--zoo N`` adds N light models of the
zoo (``tests/models/zoo.py``: torchvision, timm, transformers families beyond the
corpus, round robin over the libraries; a model whose step fails is reported and
the next one taken). Prints a rich table with medians and the worst, and writes
markdown (``--md``) and JSON (``--json``).

Run: python -m scripts.bench_eager [--rounds 7] [--models bert,gpt2] [--zoo 24] [--md docs/eager_bench.md]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import statistics
import subprocess
import sys
import time
import warnings

import torch
from rich.console import Console
from rich.table import Table
from torch.nn.attention import SDPBackend, sdpa_kernel

os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.simplefilter("ignore")

import predispatch_func as pf  # noqa: E402
from predispatch_func import _torch_compat as tc  # noqa: E402
from predispatch_func.eager import mode as eager_mode  # noqa: E402
from predispatch_func.eager import session_key  # noqa: E402
from tests.models.corpus import CASES  # noqa: E402
from tests.models.corpus import build as build_corpus  # noqa: E402

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


CLOCK = time.process_time  # --clock: this process's CPU time (others' load on a shared machine is not ours)


def _timed(fn) -> float:
    _sync()
    start = CLOCK()
    fn()
    _sync()
    return CLOCK() - start


def _grads(model) -> dict:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _largest_difference(a: dict, b: dict) -> float:
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
    return max(((x.double() - b[n].double()).abs().max().item() for n, x in a.items()), default=0.0)


def _cold_caches() -> None:
    """Forget every plan, trace and registration, as in a fresh process."""
    session_key.release()
    eager_mode._kernels_for.cache_clear()  # the traces above autograd too (Kernels.lifted_graphs)


@contextlib.contextmanager
def _no_disk_cache():
    """Kernels made inside start from nothing on disk (they still write what they learn at exit)."""
    before = os.environ.get("PREDISPATCH_FUNC_CACHE")
    os.environ["PREDISPATCH_FUNC_CACHE"] = ""
    try:
        yield
    finally:
        if before is None:
            del os.environ["PREDISPATCH_FUNC_CACHE"]
        else:
            os.environ["PREDISPATCH_FUNC_CACHE"] = before


def build(name: str):
    if name in CASES:
        return build_corpus(name)
    from tests.models.zoo import zoo

    model = next(m for m in zoo() if m.name == name)
    return model.build()


def light_zoo() -> list[str]:
    """The zoo's light models beyond the corpus, round robin over the libraries."""
    from tests.models.zoo import zoo

    corpus = {f"transformers/{name}" for name in CASES}
    by_library: dict[str, list[str]] = {}
    for m in zoo():
        if not m.heavy and not m.train and m.name not in corpus and m.family not in ("detection", "optical-flow"):
            by_library.setdefault(m.library, []).append(m.name)
    lists = list(by_library.values())
    return [names[i] for i in range(max(map(len, lists), default=0)) for names in lists if i < len(names)]


def _target(name: str) -> pf.OpSet:
    target = CORE | pf.OpSet.from_names(EXTRA[name]) if name in EXTRA else CORE
    if DEVICE == "cuda":  # sdpa's fused CUDA kernels have no decomposition: a GPU backend has them
        target = target | pf.OpSet.from_names(CUDA_ATTENTION)
    return target


def cold_child(name: str) -> None:
    """In a fresh process: plain steps, then the first step of a session, printed as JSON."""
    model, args, kwargs = build(name)
    model.train()
    step = lambda: _step(model, args, kwargs)  # noqa: E731
    step()
    step()
    plain = [_timed(step) for _ in range(5)]
    target = _target(name)
    gc.collect()
    start = CLOCK()
    session = pf.eager.on(target)
    with session:
        step()
    cold = CLOCK() - start
    misses = sum(n for _, n in session.stats.cache_misses.items())
    print(json.dumps({"plain": statistics.median(plain), "cold": cold, "misses": misses}))


def _cold_in_fresh_process(name: str, threads: int) -> dict:
    command = [sys.executable, "-m", "scripts.bench_eager", "--cold-child", name, "--threads", str(threads),
               "--clock", "cpu" if CLOCK is time.process_time else "wall"]
    done = subprocess.run(command, capture_output=True, text=True, check=False,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"cold child failed: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(lines[-1])


def bench(name: str, rounds: int, quick: bool = False, threads: int = 1) -> dict:
    model, args, kwargs = build(name)
    model.train().to(DEVICE)
    move = lambda value: tc.pytree.tree_map_only(torch.Tensor, lambda t: t.to(DEVICE), value)  # noqa: E731
    args, kwargs = move(args), move(kwargs)
    target = _target(name)
    step = lambda: _step(model, args, kwargs)  # noqa: E731
    step()  # warm torch itself (allocator, lazy inits) before anything is timed
    passing = PassThrough()
    with passing:
        step()
    _cold_caches()
    with _no_disk_cache():
        session = pf.eager.on(target)
        with session:
            cold = _timed(step)
    assert session.keyed
    persisted = getattr(eager_mode.kernels_for(target), "persisted", None)  # None: a checkout before the disk cache
    if persisted is not None:
        persisted.save()  # what this process writes at its exit, now: the child reads it
    observed = pf.eager.on(target, observe=True)
    with observed:
        step()
    plain, warm, seen, through, math = [], [], [], [], []
    calls_before = sum(n for _, n in session.stats.decomposed.items())
    cpp_before = sum(n for _, n in getattr(session.stats, "served_in_cpp", {}).items())
    for _ in range(rounds):
        plain.append(_timed(step))
        with session:
            warm.append(_timed(step))
        with sdpa_kernel([SDPBackend.MATH]):  # what a backend without fused attention runs
            math.append(_timed(step))
        if not quick:
            with observed:
                seen.append(_timed(step))
            with PassThrough():
                through.append(_timed(step))
    calls = (sum(n for _, n in session.stats.decomposed.items()) - calls_before) / rounds
    cpp = (sum(n for _, n in getattr(session.stats, "served_in_cpp", {}).items()) - cpp_before) / rounds
    torch.manual_seed(0)  # dropout draws alike in both (the session draws as eager does)
    step()
    plain_grads = _grads(model)
    torch.manual_seed(0)
    with session:
        step()
    grads = _largest_difference(plain_grads, _grads(model))
    base = statistics.median(plain)
    fresh = _cold_in_fresh_process(name, threads) if DEVICE == "cpu" and persisted is not None else None
    return {"model": name, "eager_ms": 1e3 * base, "cold": cold / base,
            "cold_disk": fresh["cold"] / fresh["plain"] if fresh else float("nan"),
            "cold_disk_misses": fresh["misses"] if fresh else -1,
            "warm": statistics.median(warm) / base, "warm_spread": (min(warm) / base, max(warm) / base),
            "eager_math": statistics.median(math) / base,
            "observed": statistics.median(seen) / base if seen else float("nan"),
            "pass": statistics.median(through) / base if through else float("nan"),
            "calls": calls, "calls_in_cpp": cpp, "grads": grads,
            "ops_plain": len({op for op in passing.ops if getattr(op, "namespace", None) == "aten"}),
            "ops_mode": len({op for op in observed.stats.reached if getattr(op, "namespace", None) == "aten"}),
            "decomposed": len(observed.stats.decomposed)}


def _commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False,
                          cwd=os.path.dirname(os.path.abspath(__file__)))
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True,
                           check=False, cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    return (done.stdout.strip() or "unknown") + ("+changes" if dirty else "")


def _summary(rows: list[dict], label: str) -> str:
    if not rows:
        return f"{label}: no model ran"
    warm, cold = [r["warm"] for r in rows], [r["cold_disk"] for r in rows]
    worst_warm = max(rows, key=lambda r: r["warm"])
    worst_cold = max(rows, key=lambda r: r["cold_disk"])
    over_math = [r["warm"] / r["eager_math"] for r in rows if "eager_math" in r]
    return (f"{label} ({len(rows)} models): warm median {statistics.median(warm):.2f}x, worst "
            f"{worst_warm['warm']:.2f}x ({worst_warm['model']}); over eager with math attention, median "
            f"{statistics.median(over_math) if over_math else float('nan'):.2f}x; cold with the disk cache median "
            f"{statistics.median(cold):.1f}x, worst {worst_cold['cold_disk']:.1f}x ({worst_cold['model']})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--models", default="", help="comma-separated corpus or zoo names (default: the corpus)")
    parser.add_argument("--zoo", type=int, default=0, help="also this many light zoo models that run")
    parser.add_argument("--quick", action="store_true", help="time plain and keyed only (no observed, pass-through)")
    parser.add_argument("--md", default="")
    parser.add_argument("--json", default="")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: steadier on a shared machine)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--clock", default="cpu", choices=["cpu", "wall"],
                        help="cpu: this process's CPU time (steady on a shared machine; --device cuda takes wall)")
    parser.add_argument("--cold-child", default="", help=argparse.SUPPRESS)
    ns = parser.parse_args()
    global DEVICE, CLOCK
    DEVICE = ns.device
    CLOCK = time.process_time if ns.clock == "cpu" and DEVICE == "cpu" else time.perf_counter
    torch.set_num_threads(ns.threads)
    if ns.cold_child:
        cold_child(ns.cold_child)
        return
    names = [n for n in ns.models.split(",") if n] or ([] if ns.zoo and ns.models == "none" else list(CASES))
    rows, failed = [], []
    zoo_names = light_zoo() if ns.zoo else []
    queue = [*names, *zoo_names]
    zoo_done = 0
    for name in queue:
        if name in zoo_names and zoo_done >= ns.zoo:
            break
        try:
            rows.append(bench(name, ns.rounds, ns.quick, ns.threads))
        except Exception as exc:  # noqa: BLE001 (a refusal is a result: its row says so)
            failed.append(f"{name}: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:300]}")
            print(failed[-1], flush=True)
            continue
        zoo_done += name in zoo_names
        print(rows[-1], flush=True)
        if ns.json:
            with open(ns.json, "w") as f:
                json.dump({"rows": rows, "failed": failed}, f, indent=1)
    table = Table(title=f"pf.eager.on(core_aten) step time over plain eager, torch {torch.__version__}")
    cols = ["model", "eager ms", "eager, math attention", "cold", "cold, disk", "warm", "warm min-max",
            "observed (Python mode)",
            "pass-through mode", "calls/step", "of them in C++", "ops plain", "ops under mode", "decomposed", "grads vs eager"]
    for c in cols:
        table.add_column(c)
    cells = [[r["model"], f"{r['eager_ms']:.1f}", f"{r.get('eager_math', float('nan')):.2f}x", f"{r['cold']:.1f}x", f"{r['cold_disk']:.1f}x", f"{r['warm']:.2f}x",
              f"{r['warm_spread'][0]:.2f}-{r['warm_spread'][1]:.2f}x", f"{r['observed']:.2f}x",
              f"{r['pass']:.2f}x", f"{r['calls']:.0f}", f"{r.get('calls_in_cpp', 0):.0f}", str(r["ops_plain"]), str(r["ops_mode"]), str(r["decomposed"]),
              f"{r['grads']:.1e}"]
             for r in rows]
    for row in cells:
        table.add_row(*row)
    Console().print(table)
    summaries = [_summary([r for r in rows if r["model"] in CASES], "corpus"),
                 _summary([r for r in rows if r["model"] not in CASES], "zoo")]
    for line in summaries + failed:
        print(line)
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump({"rows": rows, "failed": failed}, f, indent=1)
    if ns.md:
        with open(ns.md, "w") as f:
            f.write("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols) + "\n")
            for row in cells:
                f.write("| " + " | ".join(row) + " |\n")
            where = torch.cuda.get_device_name() if DEVICE == "cuda" else "CPU"
            clock = "process CPU time" if CLOCK is time.process_time else "wall time"
            f.write(f"\nmedians of {ns.rounds} rounds ({clock}), torch {torch.__version__}, commit {_commit()}, "
                    f"{where}, {torch.get_num_threads()} CPU threads\n\n")
            for line in summaries:
                f.write(f"- {line}\n")
            for line in failed:
                f.write(f"- did not run: {line}\n")


if __name__ == "__main__":
    main()
