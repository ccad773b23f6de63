"""Joint (training) programs of the tests/models corpus against the reference's training steps.

For every corpus model in train mode (dropout 0): ``export_joint`` with a loss over the
model's first floating output (``mean(x.float() ** 2)``), ``verify_joint`` over 2 steps;
the same with ``target=OpSet.core_aten()`` (where float32 differs, judged again in float64:
equal there means summation order, not a wrong lowering; and each gradient's distance to the
float64 truth set against eager's own float32 distance: ``pf.verify_joint(judge_float64=True)``); with ``AdamW`` and with ``SGD(momentum=0.9)``,
3 steps (parameters and optimizer state compared). Prints one line per model and a
summary, and writes JSON with ``--json``.

``--zoo``: the light models of tests/models/zoo.py instead (torchvision, timm, transformers; as
built there: eval mode, or train mode where the zoo trains them), those not in the corpus: the
plain joint program and, unless ``--skip-target``, the same with ``target=core_aten``.

``--custom-op-decompositions``: the target carries the decompositions a user would give for
transformers' MoE custom op (``OpSet.with_decompositions``), so the MoE models lower too.

Run: python -m scripts.joint_corpus [--models gpt2,bert] [--json out.json] [--skip-target] [--skip-optim] [--zoo]
     [--device cuda] [--custom-op-decompositions]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import time
import traceback
import warnings
from typing import Any

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.simplefilter("ignore")

import predispatch_func as pf  # noqa: E402
from predispatch_func import _torch_compat as tc  # noqa: E402
from tests.models.corpus import CASES, build  # noqa: E402


def first_float_loss(out: Any) -> torch.Tensor:
    leaf = next(t for t in tc.pytree.tree_leaves(out)
                if isinstance(t, torch.Tensor) and t.dtype.is_floating_point)
    return leaf.float().pow(2).mean()


ZOO: dict[str, Any] = {}


DEVICE = "cpu"


def one(name: str, *, target: Any = None, optimizer: Any = None, calls: int = 2) -> dict[str, Any]:
    try:
        model, args, kwargs = ZOO[name].build() if name in ZOO else build(name, train=True)
        if DEVICE != "cpu":
            model = model.to(DEVICE)
            args, kwargs = tc.pytree.tree_map_only(torch.Tensor, lambda t: t.to(DEVICE), (args, kwargs))
    except Exception as exc:  # noqa: BLE001 (a zoo model this transformers release cannot build)
        return {"ok": False, "stage": "build", "error": f"{type(exc).__name__}: {str(exc)[:200]}"}
    reference = copy.deepcopy(model)
    opt = optimizer(model.parameters()) if optimizer is not None else None
    start = time.perf_counter()
    try:
        ep = pf.export_joint(model, args, kwargs, loss_fn=first_float_loss, target=target, optimizer=opt)
    except Exception as exc:  # noqa: BLE001 (a report line per model)
        if not _eager_steps(reference, args, kwargs):
            return {"ok": False, "stage": "eager", "error": f"eager cannot run a training step either; export: "
                    f"{type(exc).__name__}: {str(exc)[:200]}"}
        return {"ok": False, "stage": "export", "error": f"{type(exc).__name__}: {str(exc)[:600]}",
                "trace": traceback.format_exc()[-2000:]}
    seconds = time.perf_counter() - start
    try:
        report = pf.verify_joint(ep, reference, args, kwargs, loss_fn=first_float_loss, optimizer=opt,
                                 calls=calls, target=target,
                                 judge_float64=target is not None and optimizer is None and DEVICE == "cpu",
                                 **({"rtol": 1e-3, "atol": 1e-4} if DEVICE != "cpu" else {}))
    except RuntimeError as exc:  # eager's own step failed (a model that cannot train twice in a row)
        return {"ok": False, "stage": "eager", "error": f"eager failed: {str(exc)[:200]}"}
    result = {"ok": report.ok, "stage": "verify", "seconds": round(seconds, 2), "problems": report.problems[:5],
              "recomputed": len(getattr(ep, "recomputed_in_backward", ()))}
    judged = report.rounding
    if judged is not None:  # pf.verify_joint(judge_float64=True): a float32 difference judged
        result["float64_ok"] = judged.equal_in_float64 or "; ".join(judged.float64_problems[:2])
        result["float64_distance"] = {"median_ratio": round(judged.median_ratio, 2),
                                      "worst_ratio": round(judged.worst_ratio, 2), "rounding": judged.rounding,
                                      "worst": judged.worst}
    return result


def _eager_steps(model: torch.nn.Module, args: tuple, kwargs: dict) -> bool:
    """Whether eager itself runs a training step of ``model`` (on a copy)."""
    try:
        first_float_loss(copy.deepcopy(model)(*args, **kwargs)).backward()
    except Exception:  # noqa: BLE001
        return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default=",".join(CASES))
    parser.add_argument("--json")
    parser.add_argument("--skip-target", action="store_true")
    parser.add_argument("--skip-optim", action="store_true")
    parser.add_argument("--zoo", action="store_true")
    parser.add_argument("--custom-op-decompositions", action="store_true",
                        help="core_aten with the user's decompositions of transformers' custom ops "
                        "(tests/models/custom_op_decompositions.py), as a user lowering MoE models gives them")
    parser.add_argument("--device", default="cpu", help="cuda: run with deterministic kernels, compared at "
                        "rtol 1e-3, atol 1e-4, as the CUDA zoo is")
    parser.add_argument("--no-tf32", action="store_true", help="cuda: convolutions and matmuls in full float32 "
                        "(cuDNN's default TF32 puts eager's own float32 gradients far from the float64 truth, so a "
                        "lowering's rounding shows as a difference)")
    opts = parser.parse_args()
    if opts.no_tf32:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    global DEVICE
    DEVICE = opts.device
    if DEVICE != "cpu":  # eager's own noise (atomics) would hide ours: deterministic kernels, as tests/cuda
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
    if opts.zoo:
        from tests.models.zoo import zoo

        ZOO.update({m.name: m for m in zoo() if not m.heavy and m.name.split("/")[-1] not in CASES})
        if opts.models == ",".join(CASES):
            opts.models = ",".join(ZOO)
        opts.skip_optim = True
    runs: dict[str, Any] = {"plain": {}}
    if not opts.skip_target:
        target = pf.OpSet.core_aten()
        if opts.custom_op_decompositions:
            from tests.models.custom_op_decompositions import transformers_decompositions

            target = target.with_decompositions(transformers_decompositions())
        runs["core_aten"] = {"target": target}
    if not opts.skip_optim:
        runs["adamw"] = {"optimizer": lambda ps: torch.optim.AdamW(ps, lr=1e-3), "calls": 3}
        runs["sgd_momentum"] = {"optimizer": lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9), "calls": 3}
    results: dict[str, dict[str, Any]] = {}
    for name in opts.models.split(","):
        results[name] = {}
        for run, settings in runs.items():
            results[name][run] = one(name, **settings)
            r = results[name][run]
            f64 = f" [float64: {'equal' if r['float64_ok'] is True else r['float64_ok']}]" if "float64_ok" in r else ""
            if isinstance(r.get("float64_distance"), dict):
                d = r["float64_distance"]
                f64 += (f" [error to float64, ours/eager's: median {d['median_ratio']}, worst {d['worst_ratio']} "
                        f"({d['worst']}){': rounding' if d['rounding'] else ''}]")
            print(f"{name:12s} {run:12s} {'OK' if r['ok'] else 'FAIL'} {r.get('seconds', '')} "
                  f"{'' if r['ok'] else (r.get('error') or r.get('problems'))}{f64}", flush=True)
    for run in runs:
        ok = sum(results[n][run]["ok"] for n in results)
        eager = sum(results[n][run]["stage"] == "eager" for n in results)
        refused = sum(results[n][run]["stage"] == "export" for n in results)
        unbuilt = sum(results[n][run]["stage"] == "build" for n in results)
        rounding = sum(results[n][run].get("float64_ok") is True for n in results)
        judged = sum(isinstance(d := results[n][run].get("float64_distance"), dict) and d["rounding"] for n in results)
        print(f"{run}: {ok}/{len(results)} right, {refused} refused, {eager} eager itself failed, "
              f"{unbuilt} not built here, {len(results) - ok - refused - eager - unbuilt} differ "
              f"({rounding} of them equal in float64: summation order; {judged} judged rounding by "
              f"pf.verify_joint(judge_float64=True))")
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(results, f, indent=1, default=str)


if __name__ == "__main__":
    main()
