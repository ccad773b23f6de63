"""The edge-case catalogue (tests/support/cases_core.py) as training steps: every case through
``export_joint`` with ``loss = sum of every floating output's sum``, ``verify_joint`` over 2 steps
(float inputs require grad, as ``pf.verify`` replays them). Prints one line per case, then how
many have regions and how many are right; with ``--regions-only`` just the cases whose forward
program has a region HOP.

Run: python -m scripts.joint_catalogue [--regions-only]
"""

from __future__ import annotations

import argparse
import copy
import warnings
from typing import Any

import torch

import predispatch_func as pf
from predispatch_func import _torch_compat as tc
from predispatch_func.graphs import all_graph_modules
from predispatch_func.regions.ops import REGION_HOPS
from tests.support.cases_core import CASES

warnings.simplefilter("ignore")


def total(out: Any) -> torch.Tensor:
    leaves = [t for t in tc.pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.dtype.is_floating_point]
    return sum(t.sum() for t in leaves)  # type: ignore[return-value]


def with_grad(value: Any) -> Any:
    return tc.pytree.tree_map_only(torch.Tensor, lambda t: t.detach().clone().requires_grad_(
        t.dtype.is_floating_point), value)


def run_case(name: str) -> tuple[int, str]:
    model, args, kwargs = CASES[name].build()
    regions = sum(1 for _, gm in all_graph_modules(pf.export(copy.deepcopy(model), args, kwargs).graph_module)
                  for n in gm.graph.nodes if n.target in REGION_HOPS)
    reference = copy.deepcopy(model)
    for attempt in (with_grad, lambda v: v):  # eager refuses some in-place writes to leaves that require grad
        g_args, g_kwargs = attempt((args, kwargs))
        try:
            probe = copy.deepcopy(model)
            total(probe(*copy.deepcopy(g_args), **copy.deepcopy(g_kwargs))).backward()
            break
        except RuntimeError:
            continue
    else:
        return regions, "eager itself cannot train this case"
    try:
        ep = pf.export_joint(model, g_args, g_kwargs, loss_fn=total)
    except Exception as exc:  # noqa: BLE001 (a report line)
        return regions, f"refused: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    report = pf.verify_joint(ep, reference, g_args, g_kwargs, loss_fn=total, calls=2)
    return regions, "OK" if report.ok else f"WRONG: {report.problems[:2]}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--regions-only", action="store_true")
    opts = parser.parse_args()
    results = {}
    for name, case in CASES.items():
        if not case.check_values:
            continue
        try:
            results[name] = run_case(name)
        except Exception as exc:  # noqa: BLE001
            results[name] = (0, f"forward export failed: {type(exc).__name__}: {str(exc)[:120]}")
        regions, verdict = results[name]
        if regions or not opts.regions_only:
            print(f"{name:55s} regions={regions} {verdict}", flush=True)
    chosen = {n: r for n, r in results.items() if r[0] or not opts.regions_only}
    print(f"{sum(v == 'OK' for _, v in chosen.values())}/{len(chosen)} right, "
          f"{sum(v.startswith('refused') for _, v in chosen.values())} refused, "
          f"{sum(v.startswith('WRONG') for _, v in chosen.values())} wrong; "
          f"{sum(1 for r, _ in chosen.values() if r)} with regions")


if __name__ == "__main__":
    main()
