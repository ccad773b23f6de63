"""Joint programs three ways, on the corpus and the joint cases: ours, torch's
``_export_forward_backward`` and ``aot_export_joint_with_descriptors``, in one process.

Per model and exporter: gradients right (each parameter's gradient against the reference's
``loss.backward()``, fp32, allclose 1e-5), mutable nodes in any graph, region HOP calls,
kept composites in the forward (``linear``, ``layer_norm``, ``softmax``, ``gelu``,
``scaled_dot_product_attention``, ``group_norm`` nodes), eager's backward ops kept
(``*_backward`` nodes), and export time: a warm-up round, then ``--rounds`` rounds with the
exporters alternating, the median per exporter and the median per-round ratio ours/torch's.
The loss: the model's first output (joint cases) or ``mean(first float output ** 2)`` (corpus).

Run: python -m scripts.joint_compare [--models gpt2,bert] [--rounds 3] [--json out.json]
     [--exporters ours,joint_with_descriptors]
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch.export.graph_signature import InputKind, OutputKind

os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.simplefilter("ignore")

import predispatch_func as pf  # noqa: E402
from predispatch_func import _torch_compat as tc  # noqa: E402
from predispatch_func.graphs import all_graph_modules  # noqa: E402
from predispatch_func.verify import mutable_target_reason  # noqa: E402
from scripts.joint_corpus import first_float_loss  # noqa: E402
from tests.joint.cases import CASES as JOINT_CASES  # noqa: E402
from tests.models.corpus import CASES as CORPUS  # noqa: E402
from tests.models.corpus import build  # noqa: E402

COMPOSITES = ("aten.linear.default", "aten.layer_norm.default", "aten.softmax.int", "aten.gelu.default",
              "aten.scaled_dot_product_attention.default", "aten.group_norm.default")
REGIONS = ("pf_grad_region", "pf_autocast_region", "wrap_with_set_grad_enabled", "wrap_with_autocast")


class LossOf(torch.nn.Module):
    """The model with its loss, for torch's entry points (which take one module)."""

    def __init__(self, model: torch.nn.Module, loss_fn: Callable[..., Any] | None):
        super().__init__()
        self.model, self.loss_fn = model, loss_fn

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        out = self.model(*args, **kwargs)
        if self.loss_fn is not None:
            return self.loss_fn(out)
        return out[0] if isinstance(out, (tuple, list)) else out


def model_case(name: str) -> tuple[torch.nn.Module, tuple, dict, Any]:
    if name in JOINT_CASES:
        return JOINT_CASES[name].build()
    model, args, kwargs = build(name, train=True)
    return model, args, kwargs, first_float_loss


def eager_grads(model, args, kwargs, loss_fn) -> dict[str, torch.Tensor | None]:
    eager = copy.deepcopy(model)
    torch.manual_seed(0)  # each program's check draws from the same seed (dropout)
    out = eager(*copy.deepcopy(args), **copy.deepcopy(kwargs))
    loss = loss_fn(out) if loss_fn is not None else (out[0] if isinstance(out, (tuple, list)) else out)
    loss.backward()
    return {n: p.grad for n, p in eager.named_parameters()}


def graph_facts(gm: torch.fx.GraphModule) -> dict[str, int]:
    nodes = [n for _, g in all_graph_modules(gm) for n in g.graph.nodes if n.op == "call_function"]
    names = [str(n.target) if not hasattr(n.target, "__name__") or "aten" in str(n.target)
             else getattr(n.target, "__name__", str(n.target)) for n in nodes]
    return {"mutable": sum(1 for n in nodes if mutable_target_reason(n.target)),
            "regions": sum(1 for s in names if s in REGIONS),
            "composites": sum(1 for s in names if s in COMPOSITES),
            "backward_ops": sum(1 for s in names if s.startswith("aten.") and "_backward" in s)}


def _close(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return (a is None) == (b is None) or (a is not None and not a.any()) or (b is not None and not b.any())
    return a.shape == b.shape and torch.allclose(a.float(), b.float(), rtol=1e-5, atol=1e-5)


def ours(model, args, kwargs, loss_fn, expected) -> tuple[dict, Callable[[], Any]]:
    def run():
        return pf.export_joint(copy.deepcopy(model), args, kwargs, loss_fn=loss_fn)
    ep = run()
    step = ep.module()
    torch.manual_seed(0)
    step(*copy.deepcopy(args), **copy.deepcopy(kwargs))
    right = all(_close(expected[n], step.get_parameter(n).grad) for n in expected)
    return {"grads_right": right, **graph_facts(ep.graph_module)}, run


def forward_backward(model, args, kwargs, loss_fn, expected) -> tuple[dict, Callable[[], Any]]:
    def run():
        return tc.torch_export_forward_backward(torch.export.export(LossOf(copy.deepcopy(model), loss_fn), args,
                                                                    kwargs))
    ep = run()
    state = {**ep.state_dict, **ep.constants}
    users = iter(tc.pytree.tree_leaves((args, kwargs)))
    flat = [state[s.target] if s.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)
            else next(users) for s in ep.graph_signature.input_specs]
    torch.manual_seed(0)
    with torch.no_grad():
        outs = ep.graph_module(*[t.detach().clone() if isinstance(t, torch.Tensor) else t for t in flat])
    got = {s.target.removeprefix("model."): v for s, v in zip(ep.graph_signature.output_specs, outs)
           if s.kind is OutputKind.GRADIENT_TO_PARAMETER}
    right = all(_close(expected[n], got.get(n)) for n in expected)
    return {"grads_right": right, **graph_facts(ep.graph_module)}, run


def with_descriptors(model, args, kwargs, loss_fn, expected) -> tuple[dict, Callable[[], Any]]:
    def run():
        return tc.torch_aot_export_joint_with_descriptors(LossOf(copy.deepcopy(model), loss_fn), args, kwargs)
    gm = run()
    wrapped = LossOf(copy.deepcopy(model), loss_fn)
    params = dict(wrapped.named_parameters())
    buffers = dict(wrapped.named_buffers())
    users = tc.pytree.tree_leaves((args, kwargs))
    primals, tangents = [], []
    for n in gm.graph.nodes:
        if n.op != "placeholder":
            continue
        desc = n.meta.get("desc")
        kind = type(desc).__name__
        if kind == "ParamAOTInput":
            primals.append(params[desc.target].detach())
        elif kind == "BufferAOTInput":
            primals.append(buffers[desc.target].detach().clone())
        elif kind == "PlainAOTInput":
            primals.append(users[desc.idx])
        elif kind == "TangentAOTInput":
            tangents.append(torch.ones((), dtype=torch.float32))
        else:
            raise RuntimeError(f"unknown input descriptor {desc!r}")
    torch.manual_seed(0)
    with torch.no_grad():
        outs = _FlatOutputs(gm).flat(*primals, *tangents)
    got = {}
    for desc, value in zip(gm.graph.output_node().meta["desc"], outs):
        if type(desc).__name__ == "GradAOTOutput" and type(desc.grad_of).__name__ == "ParamAOTInput":
            got[desc.grad_of.target.removeprefix("model.")] = value
    right = all(_close(expected[n], got.get(n)) for n in expected)
    return {"grads_right": right, **graph_facts(gm)}, run


class _FlatOutputs(torch.fx.Interpreter):
    """The graph's outputs as its output node lists them (the descriptors' order), before unflattening."""

    def flat(self, *args: Any) -> list[Any]:
        self.run(*args)
        return self._flat

    def output(self, target: Any, args: Any, kwargs: Any) -> Any:
        self._flat = list(args[0])
        return super().output(target, args, kwargs)


EXPORTERS = {"ours": ours, "export_forward_backward": forward_backward, "joint_with_descriptors": with_descriptors}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default=",".join([*JOINT_CASES, *CORPUS]))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--exporters", default=",".join(EXPORTERS),
                        help="which exporters to run (the timing of ours alone is paired with each)")
    parser.add_argument("--json")
    opts = parser.parse_args()
    results: dict[str, Any] = {}
    for name in opts.models.split(","):
        model, args, kwargs, loss_fn = model_case(name)
        expected = eager_grads(model, args, kwargs, loss_fn)
        row: dict[str, Any] = {}
        runs: dict[str, Callable[[], Any]] = {}
        for exporter in opts.exporters.split(","):
            check = EXPORTERS[exporter]
            try:
                row[exporter], runs[exporter] = check(model, args, kwargs, loss_fn, expected)
            except Exception as exc:  # noqa: BLE001 (one cell of the table)
                row[exporter] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
        times: dict[str, list[float]] = {e: [] for e in runs}
        for _ in range(opts.rounds):
            for exporter, run in runs.items():
                gc.collect()
                start = time.perf_counter()
                run()
                times[exporter].append(time.perf_counter() - start)
        for exporter in runs:
            row[exporter]["seconds"] = round(statistics.median(times[exporter]), 3)
            if exporter != "ours" and "ours" in times:
                row[exporter]["ours_ratio"] = round(statistics.median(
                    [a / b for a, b in zip(times["ours"], times[exporter])]), 2)
        results[name] = row
        print(name, json.dumps(row), flush=True)
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
