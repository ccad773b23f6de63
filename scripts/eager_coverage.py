"""op_db coverage of ``pf.eager.on(core_aten)``: every OpInfo against plain eager.

For each OpInfo of torch's ``op_db`` (CPU; float64 where the op supports it,
else its first CPU dtype), up to ``--samples`` sample inputs each:

* forward: the op plainly and under the mode, from the same RNG seed; outputs
  and the inputs afterwards (a write into an input must match) compared;
* the in-place variant, where the OpInfo has one: result and written input;
* backward, where the OpInfo supports autograd and the dtype is floating: the
  gradient of a weighted sum of the floating outputs, compared.

Singular and eigenvectors are unique only up to the sign of each (a phase for complex ones), which
is the library's choice: for the OpInfos returning them (``GAUGE``) the outputs compared, and the
loss differentiated, are what the OpInfo's own gradient check compares (its
``output_process_fn_grad``: ``|U|``, ``U @ Vh``, singular values, ``|V|`` and eigenvalues), the
quantities those signs do not change; everything else about them is compared as it is.

Each op is then ``equal`` (every sample equal), ``sparse`` (it met ops with no
path into Core ATen, on sparse tensors: never lowered, named separately, not
hidden among the strided ones), ``unreachable`` (the mode
named an op with no path into Core ATen: the op it named is recorded; this
list answers "which ops must my backend register beyond Core ATen"), ``wrong``
(a value or gradient differs: must never happen silently) or ``error`` (the
mode raised something else while plain eager ran). Unreachable ops are run
as they are (``on_unreachable="run"``), so every one an OpInfo meets is named
and the rest of its computation is still compared. Samples on which plain
eager itself raises are skipped. Writes ``docs/eager_coverage/torch-<ver>.md``
and ``.json``.

Run: python -m scripts.eager_coverage [--samples 3] [--ops add,logit] [--out docs/eager_coverage]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import time
import warnings

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
warnings.simplefilter("ignore")

import predispatch_func as pf  # noqa: E402
from predispatch_func import _torch_compat as tc  # noqa: E402

CORE = pf.OpSet.core_aten()
RTOL, ATOL = 1e-5, 1e-6
# OpInfos whose outputs hold singular or eigenvectors: compared through output_process_fn_grad
GAUGE = frozenset({"svd", "linalg.svd", "svd_lowrank", "pca_lowrank", "linalg.eigh", "linalg.eig"})


class Timeout(Exception):
    pass


def _alarm(*_):
    raise Timeout()


def _dtype(opinfo) -> torch.dtype | None:
    dtypes = opinfo.supported_dtypes("cpu")
    for wanted in (torch.float64, torch.float32, torch.int64, torch.bool):
        if wanted in dtypes:
            return wanted
    return next(iter(dtypes), None)


def _clone(value):
    if isinstance(value, torch.Tensor):
        return value.detach().clone().requires_grad_(value.requires_grad)
    if isinstance(value, (list, tuple)):
        return type(value)(_clone(v) for v in value)
    if isinstance(value, dict):
        return {k: _clone(v) for k, v in value.items()}
    return value


def _tensors(value) -> list[torch.Tensor]:
    return [t for t in tc.pytree.tree_leaves(value) if isinstance(t, torch.Tensor)]


def _call_inplace(opinfo, sample):
    inp, args, kwargs = _clone((sample.input, sample.args, sample.kwargs))
    torch.manual_seed(0)
    out = opinfo.inplace_variant(inp, *args, **kwargs)
    return out is inp, _tensors((inp, args, kwargs)), None


def _call(opinfo, sample, grad: bool | str):
    if grad == "inplace":
        return _call_inplace(opinfo, sample)
    inp, args, kwargs = _clone((sample.input, sample.args, sample.kwargs))
    leaves = [t for t in _tensors((inp, args, kwargs)) if t.is_floating_point() or t.is_complex()]
    if grad:
        for t in leaves:
            t.requires_grad_(True)
    torch.manual_seed(0)
    out = opinfo.op(inp, *args, **kwargs)
    if opinfo.name in GAUGE:
        out = sample.output_process_fn_grad(out)
    grads = None
    if grad:
        outs = [o for o in _tensors(out) if o.requires_grad and o.is_floating_point()]
        if outs:
            torch.manual_seed(1)
            total = sum((o * torch.rand(o.shape, dtype=o.dtype)).sum() for o in outs)
            grads = torch.autograd.grad(total, leaves, allow_unused=True)
    return out, _tensors((inp, args, kwargs)), grads


def _uninitialised(opinfo) -> bool:
    """Ops whose result is uninitialised memory: only its layout can be compared."""
    return opinfo.name.startswith(("empty", "new_empty"))


def _layout_equal(a, b) -> bool:
    la, lb = _tensors(a), _tensors(b)
    return len(la) == len(lb) and all((x.shape, x.stride(), x.dtype) == (y.shape, y.stride(), y.dtype)
                                      for x, y in zip(la, lb))


def _equal(a, b) -> bool:
    la, lb = tc.pytree.tree_leaves(a), tc.pytree.tree_leaves(b)
    if len(la) != len(lb):
        return False
    for x, y in zip(la, lb):
        if isinstance(x, torch.Tensor) != isinstance(y, torch.Tensor):
            return False
        if isinstance(x, torch.Tensor):
            if x.layout != torch.strided or y.layout != torch.strided:
                x, y = x.to_dense(), y.to_dense()
            if x.shape != y.shape or x.dtype != y.dtype:
                return False
            if x.is_floating_point() and x.element_size() == 1:  # float8: assert_close has no kernels for it
                x, y = x.float(), y.float()
            try:
                torch.testing.assert_close(x.detach(), y.detach(), rtol=RTOL, atol=ATOL, equal_nan=True)
            except AssertionError:
                return False
        elif x is None or isinstance(x, (int, float, bool, complex)):
            if not (x == y or (isinstance(x, float) and x != x and y != y)):
                return False
    return True


def check_op(opinfo, n_samples: int) -> dict:
    dtype = _dtype(opinfo)
    result = {"op": opinfo.name, "variant": opinfo.variant_test_name, "dtype": str(dtype), "samples": 0,
              "skipped": 0, "status": "equal", "detail": ""}
    if dtype is None:
        result.update(status="skipped", detail="no CPU dtype")
        return result
    grad = bool(opinfo.supports_autograd) and (dtype.is_floating_point or dtype.is_complex)
    try:
        samples = list(opinfo.sample_inputs("cpu", dtype, requires_grad=False))[:n_samples]
    except Exception as e:  # noqa: BLE001
        result.update(status="skipped", detail=f"samples: {type(e).__name__}")
        return result
    unreachable: set[str] = set()
    sparse = False
    for sample in samples:
        passes: list = [False, True] if grad else [False]
        if opinfo.inplace_variant is not None:
            passes.append("inplace")
        for with_grad in passes:
            try:
                expected = _call(opinfo, sample, with_grad)
            except Exception:  # noqa: BLE001  (plain eager refuses the sample: nothing to compare)
                result["skipped"] += 1
                continue
            session = pf.eager.on(CORE, on_unreachable="run")
            try:
                with session:
                    got = _call(opinfo, sample, with_grad)
            except Timeout:
                raise
            except Exception as e:  # noqa: BLE001
                result.update(status="error", detail=f"{_pass_name(with_grad)}: "
                              f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
                return result
            unreachable.update(str(op) for op in session.stats.unreachable)
            sparse = sparse or any(t.layout != torch.strided for t in _tensors(got[:2]))
            what = ["output", "inputs after the call", "gradients"]
            same = _layout_equal if _uninitialised(opinfo) else _equal
            for name, a, b in zip(what, got, expected):
                if not same(a, b):
                    result.update(status="wrong", detail=f"{_pass_name(with_grad)}: {name} differ")
                    return result
            result["samples"] += 1
    if unreachable:
        result.update(status="sparse" if sparse else "unreachable", detail=", ".join(sorted(unreachable)))
    elif result["samples"] == 0:
        result.update(status="skipped", detail="plain eager refused every sample")
    return result


def _pass_name(with_grad) -> str:
    return {False: "forward", True: "backward", "inplace": "in-place variant"}[with_grad]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--ops", default="")
    parser.add_argument("--timeout", type=int, default=60, help="seconds per OpInfo")
    parser.add_argument("--out", default=os.path.join(ROOT, "docs", "eager_coverage"))
    ns = parser.parse_args()
    wanted = set(filter(None, ns.ops.split(",")))
    db = [o for o in tc.opinfo_db() if not wanted or o.name in wanted]
    signal.signal(signal.SIGALRM, _alarm)
    results, start = [], time.time()
    for i, opinfo in enumerate(db):
        signal.alarm(ns.timeout)
        try:
            r = check_op(opinfo, ns.samples)
        except Timeout:
            r = {"op": opinfo.name, "variant": opinfo.variant_test_name, "status": "error",
                 "detail": f"timed out after {ns.timeout}s", "samples": 0, "skipped": 0, "dtype": ""}
        finally:
            signal.alarm(0)
        results.append(r)
        if r["status"] not in ("equal", "skipped"):
            print(f"[{i + 1}/{len(db)}] {r['op']}.{r['variant']}: {r['status']} {r['detail']}", flush=True)
    write(results, ns, time.time() - start)


def write(results: list[dict], ns: argparse.Namespace, seconds: float) -> None:
    version = torch.__version__.split("+")[0]
    totals = collections.Counter(r["status"] for r in results)
    unreachable = collections.Counter(op for r in results if r["status"] == "unreachable"
                                      for op in r["detail"].split(", "))
    sparse = collections.Counter(op for r in results if r["status"] == "sparse" for op in r["detail"].split(", "))
    os.makedirs(ns.out, exist_ok=True)
    with open(os.path.join(ns.out, f"torch-{version}.json"), "w") as f:
        json.dump({"torch": version, "samples_per_op": ns.samples, "totals": totals,
                   "unreachable_ops": sorted(unreachable), "sparse_ops": sorted(sparse), "results": results}, f,
                  indent=1)
    lines = [
        f"# `pf.eager.on(core_aten)` against plain eager: op_db, torch {version}",
        "",
        f"Generated by `python -m scripts.eager_coverage --samples {ns.samples}` in {seconds:.0f} s (CPU; "
        f"float64 where supported; at most {ns.samples} samples per OpInfo, forward and, where the OpInfo "
        "supports autograd, backward, and the in-place variant where there is one). Samples plain eager "
        "refuses are skipped. `unreachable`: the OpInfo met an op with no path into Core ATen (listed "
        "below); the values were still compared, with that op run as it is. `sparse`: the same, on sparse "
        "tensors (never lowered: torch's decompositions are written for strided ones), listed separately.",
        "",
        "| status | OpInfos |", "|---|---|",
        *[f"| {k} | {totals.get(k, 0)} |" for k in ("equal", "unreachable", "sparse", "wrong", "error", "skipped")],
        "",
        f"## Unreachable: {len(unreachable)} ops with no path into Core ATen",
        "",
        "What a backend implementing Core ATen must register besides (each op named by the mode, "
        "with how many OpInfos met it):",
        "",
        *[f"- `{op}` ({n})" for op, n in sorted(unreachable.items())],
        "",
        f"## Sparse: {len(sparse)} ops met on sparse tensors, not lowered",
        "",
        *[f"- `{op}` ({n}): " + ", ".join(f"`{r['op']}`" for r in results if r["status"] == "sparse" and op in r["detail"])
          for op, n in sorted(sparse.items())],
        "",
        "## Wrong and error",
        "",
        "| OpInfo | status | detail |", "|---|---|---|",
        *[f"| `{r['op']}{'.' + r['variant'] if r['variant'] else ''}` | {r['status']} | {r['detail']} |"
          for r in results if r["status"] in ("wrong", "error")],
        "",
    ]
    with open(os.path.join(ns.out, f"torch-{version}.md"), "w") as f:
        f.write("\n".join(lines))
    print(dict(totals), f"unreachable ops: {len(unreachable)}")


if __name__ == "__main__":
    main()
