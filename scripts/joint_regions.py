"""The region and extension catalogue (the models the tests of tests/regions/ and tests/hops/ export)
as training steps.

Runs those test files in-process with ``export_checked`` wrapped so every (model, args, kwargs)
they export is recorded; then each recorded model goes through ``export_joint`` with
``loss = sum of every floating output's sum`` and ``verify_joint`` over 2 steps. Counts: how
many have a region HOP, how many keep them in the joint program (same region calls as the
forward program), how many equal eager, how many are refused (and why).

Run: python -m scripts.joint_regions [tests/regions/test_regions.py ...]
"""

from __future__ import annotations

import copy
import importlib
import sys
import warnings
from collections import Counter
from typing import Any

import pytest

import predispatch_func as pf
from predispatch_func.graphs import all_graph_modules
from predispatch_func.regions.ops import REGION_HOPS
from scripts.joint_catalogue import total, with_grad

warnings.simplefilter("ignore")
FILES = ["tests/regions/test_regions.py", "tests/hops/test_autograd_function.py", "tests/hops/test_hooks.py",
         "tests/hops/test_torch_hops.py", "tests/hops/test_extensions.py"]


def harvest(files: list[str]) -> list[tuple[str, Any, tuple, dict]]:
    found: list[tuple[str, Any, tuple, dict]] = []
    for path in files:
        module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
        original = module.export_checked

        def recording(model, args, kwargs=None, *a, _orig=original, _path=path, **k):
            found.append((f"{_path}:{sys._getframe(1).f_code.co_name}", copy.deepcopy(model), copy.deepcopy(args),
                          copy.deepcopy(kwargs or {})))
            return _orig(model, args, kwargs, *a, **k)
        module.export_checked = recording
    pytest.main(["-q", "-p", "no:cacheprovider", "-x", "--no-header", "-o", "addopts=", *files])
    return found


def regions_of(ep: Any) -> list[tuple]:
    return [tuple(n.args[:1] if n.target.__name__ == "pf_grad_region" else n.args[:3])
            for _, gm in all_graph_modules(ep.graph_module) for n in gm.graph.nodes if n.target in REGION_HOPS]


def judge(model: Any, args: tuple, kwargs: dict) -> tuple[bool, str]:
    forward = pf.export(copy.deepcopy(model), args, kwargs)
    has_regions = bool(regions_of(forward))
    g_args, g_kwargs = with_grad((args, kwargs))
    try:
        probe = copy.deepcopy(model)
        total(probe(*copy.deepcopy(g_args), **copy.deepcopy(g_kwargs))).backward()
    except (RuntimeError, AttributeError, TypeError):
        g_args, g_kwargs = args, kwargs
        try:
            probe = copy.deepcopy(model)
            total(probe(*copy.deepcopy(g_args), **copy.deepcopy(g_kwargs))).backward()
        except (RuntimeError, AttributeError, TypeError):
            return has_regions, "eager cannot train it"
    try:
        ep = pf.export_joint(copy.deepcopy(model), g_args, g_kwargs, loss_fn=total)
    except Exception as exc:  # noqa: BLE001 (a report line)
        return has_regions, f"refused: {type(exc).__name__}: {str(exc).splitlines()[0][:140]}"
    kept = regions_of(ep) == regions_of(forward)
    report = pf.verify_joint(ep, model, g_args, g_kwargs, loss_fn=total, calls=2)
    verdict = "OK" if report.ok else f"WRONG {report.problems[:2]}"
    return has_regions, verdict + ("" if kept else " (regions differ from the forward's)")


def main() -> None:
    files = sys.argv[1:] or FILES
    found = harvest(files)
    counts: Counter[str] = Counter()
    for where, model, args, kwargs in found:
        try:
            has_regions, verdict = judge(model, args, kwargs)
        except Exception as exc:  # noqa: BLE001
            has_regions, verdict = False, f"forward failed: {type(exc).__name__}"
        counts[("regions " if has_regions else "") + verdict.split(":")[0].split(" ")[0]] += 1
        print(f"{where:70s} regions={int(has_regions)} {verdict}", flush=True)
    print(dict(counts))


if __name__ == "__main__":
    main()
