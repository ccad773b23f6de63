"""Every differentiable OpInfo of torch's ``op_db`` as a training step: where ours falls short of
torch's own joint paths.

Each op's first ``--samples`` samples (``--dtype``, float64 by default so that a difference is a
bug, not rounding): the sample's floating tensors that require grad become parameters of a module
calling the op; ``loss = sum over floating outputs of (out * w).sum()`` with a fixed ramp ``w``
(so every output element's gradient differs), over what the OpInfo's own gradient checks compare
(``output_process_fn_grad``: singular vectors only up to their signs). Per sample, two runs:

* ``plain``: ``pf.export_joint`` then ``pf.verify_joint`` over 2 steps; if ours does not pass,
  torch's ``aot_export_joint_with_descriptors`` on the same step, its parameter gradients against
  eager's (allclose 1e-5);
* ``core_aten``: the same with ``target=pf.OpSet.core_aten()``; torch's reference is
  ``_export_forward_backward`` (which lowers to Core ATen), right only if its graph is in Core ATen
  (it keeps what it cannot lower; we refuse that, naming the op).

``--region autocast`` calls the op inside ``torch.autocast("cpu", dtype=torch.bfloat16)`` (run it
with ``--dtype float32``: autocast leaves float64 alone), ``--region nested_grad`` inside
``torch.no_grad()`` then ``torch.enable_grad()``: the op's forward in a region HOP, its backward
what eager's autograd computes there. Ours is compared with eager only (torch's joint paths bake
regions; ``torch`` is still reported).

A sample is *short* when ours is refused or wrong and torch's path is right: the list this
script exists for. One line per sample that is not right for us, then a summary. ``--shard i/n``
splits the ops between processes.

Run: python -m scripts.joint_opinfo [--ops add,mul] [--samples 2] [--dtype float64]
     [--region autocast|nested_grad] [--shard 0/2] [--json out.json]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import traceback
import warnings
from collections import Counter
from typing import Any

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.simplefilter("ignore")

import predispatch_func as pf  # noqa: E402
from predispatch_func.opsets import Lowering  # noqa: E402
from scripts.joint_compare import eager_grads, forward_backward, with_descriptors  # noqa: E402
from tests.conformance.case import seeded  # noqa: E402
from tests.joint.opinfo_steps import OnParameters, differentiable_ops, ramp_loss, samples  # noqa: E402


def one(name: str, sample: Any, target: Any, region: str = "") -> dict[str, Any]:
    args, kwargs = (sample.input, *sample.args), dict(sample.kwargs)
    model = OnParameters(_in_region(_call_of(name), region), args, kwargs, sample.output_process_fn_grad)
    if not list(model.parameters()):
        return {"status": "not applicable", "detail": "no differentiable input"}
    inputs = tuple(model.inputs)
    try:
        with seeded(name):
            twin = copy.deepcopy(model)
            for _ in range(2):  # as verify_joint's two steps (sgn's ZeroTensor gradient cannot accumulate)
                ramp_loss(twin(*inputs)).backward()
    except Exception as exc:  # noqa: BLE001
        return {"status": "not applicable", "detail": f"eager cannot step: {type(exc).__name__}: {str(exc)[:120]}"}
    result: dict[str, Any] = {}
    try:
        ep = pf.export_joint(copy.deepcopy(model), inputs, loss_fn=ramp_loss, target=target)
    except Exception as exc:  # noqa: BLE001 (a report line per sample)
        result.update(status="refused", detail=f"{type(exc).__name__}: {str(exc)[:300]}",
                      trace=traceback.format_exc()[-1500:])
    else:
        try:
            report = pf.verify_joint(ep, model, inputs, loss_fn=ramp_loss, calls=2, target=target)
        except Exception as exc:  # noqa: BLE001
            result.update(status="verify crashed", detail=f"{type(exc).__name__}: {str(exc)[:300]}",
                          trace=traceback.format_exc()[-1500:])
        else:
            result.update(status="right" if report.ok else "wrong", detail="; ".join(report.problems[:3]))
    if result["status"] != "right":
        result["torch"] = _torch(model, inputs, target)
    return result


def _torch(model: torch.nn.Module, inputs: tuple, target: Any) -> str:
    """Whether torch's joint path gets the parameter gradients right; under a target, its path to
    Core ATen, which counts as right only if its graph is in the target."""
    try:
        expected = eager_grads(model, inputs, {}, ramp_loss)
        run = forward_backward if target is not None else with_descriptors
        facts, again = run(model, inputs, {}, ramp_loss, expected)
        outside = Lowering(target).outside(again().graph_module) if target is not None else []
    except Exception as exc:  # noqa: BLE001
        return f"refused: {type(exc).__name__}: {str(exc)[:150]}"
    if outside:
        return f"outside the target: {sorted({str(node.target) for _, node in outside})[:3]}"
    return "right" if facts["grads_right"] else "wrong"


_OPS: dict[str, Any] = {}


def _in_region(fn: Any, region: str) -> Any:
    """``fn`` called inside the region ``region`` names ("" for none)."""
    if not region:
        return fn

    def called_in_region(*args: Any, **kwargs: Any) -> Any:
        if region == "autocast":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return fn(*args, **kwargs)
        with torch.no_grad(), torch.enable_grad():
            return fn(*args, **kwargs)
    return called_in_region


def _call_of(name: str) -> Any:
    return _OPS[name].op


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ops", default="")
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--dtype", default="float64")
    parser.add_argument("--shard", default="0/1")
    parser.add_argument("--skip-target", action="store_true")
    parser.add_argument("--region", choices=("", "autocast", "nested_grad"), default="")
    parser.add_argument("--json")
    opts = parser.parse_args()
    _OPS.update(differentiable_ops())
    names = sorted(_OPS) if not opts.ops else opts.ops.split(",")
    index, count = map(int, opts.shard.split("/"))
    names = names[index::count]
    dtype = getattr(torch, opts.dtype)
    runs = {"plain": None} if opts.skip_target else {"plain": None, "core_aten": pf.OpSet.core_aten()}
    results: dict[str, Any] = {}
    tally: dict[str, Counter] = {run: Counter() for run in runs}
    for name in names:
        op = _OPS[name]
        if dtype not in op.supported_backward_dtypes("cpu"):
            continue
        try:
            drawn = samples(op, dtype, opts.samples, name)
        except Exception as exc:  # noqa: BLE001
            print(f"{name}: samples failed: {type(exc).__name__}: {exc}", flush=True)
            continue
        for i, sample in enumerate(drawn):
            for run, target in runs.items():
                key = f"{name}/{i}/{run}"
                try:
                    r = one(name, sample, target, opts.region)
                except Exception as exc:  # noqa: BLE001 (the harness itself: reported, never hidden)
                    r = {"status": "harness error", "detail": f"{type(exc).__name__}: {exc}"}
                results[key] = r
                short = r["status"] not in ("right", "not applicable") and r.get("torch") == "right"
                tally[run][r["status"] + (" (torch right: SHORT)" if short else "")] += 1
                if r["status"] not in ("right", "not applicable"):
                    print(f"{key}: {r['status']}{' SHORT' if short else ''}: {r['detail'][:250]} "
                          f"[torch: {r.get('torch')}]", flush=True)
    for run, counts in tally.items():
        print(f"{run}: " + ", ".join(f"{n} {s}" for s, n in counts.most_common()))
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(results, f, indent=1, default=str)


if __name__ == "__main__":
    main()
