"""Snapshots of joint programs, to show a change to ``export_joint`` (a speed-up) leaves
every program as it was.

Per program: the code of every graph (top level and region bodies), each node's recorded
metadata (``val`` layout, ``stack_trace``, ``nn_module_stack``, ``source_fn_stack``,
``torch_fn``, ``custom``; ``stack_trace`` only as whether it is there and the user's last
line, so the checkout's path does not matter; not ``seq_nr``: autograd's counter goes on across
exports, and the forward export records -1 on a process's first ops), the graph signature, and what
the backward recomputes. Programs: the tests/joint cases and the tests/models corpus (train
mode, loss ``mean(first float output ** 2)``), plain; a few also with ``AdamW`` and with
``target=OpSet.core_aten()``.

Run: python -m scripts.joint_snapshot --save DIR      (before the change)
     python -m scripts.joint_snapshot --check DIR     (after: prints each difference, exit 1 if any)
     [--models a,b] [--plain-only]
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.simplefilter("ignore")

import predispatch_func as pf  # noqa: E402
from predispatch_func.graphs import all_graph_modules  # noqa: E402
from scripts.joint_corpus import first_float_loss  # noqa: E402
from tests.joint.cases import CASES as JOINT_CASES  # noqa: E402
from tests.models.corpus import CASES as CORPUS  # noqa: E402
from tests.models.corpus import build  # noqa: E402

META_KEYS = ("nn_module_stack", "source_fn_stack", "torch_fn", "custom")
REPOSITORY = str(Path(__file__).resolve().parents[1])
WITH_SETTINGS = ("plain_mlp", "issue_41_repro", "autocast_bf16_block", "small_cnn", "distilbert", "gpt2", "llama")


def _val(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"{value.dtype} {tuple(value.shape)} {tuple(value.stride())} grad={value.requires_grad}"
    if isinstance(value, (tuple, list)):
        return "(" + ", ".join(_val(v) for v in value) + ")"
    return repr(value)


def _stack(trace: Any) -> str:
    if not trace:
        return "-"
    lines = [line.strip() for line in str(trace).splitlines() if line.strip().startswith("File ")]
    return lines[-1].split("/")[-1] if lines else "?"


def snapshot(ep: Any) -> str:
    parts = [str(ep.graph_signature), f"recomputed: {getattr(ep, 'recomputed_in_backward', None)}"]
    for name, gm in all_graph_modules(ep.graph_module):
        parts.append(f"== graph {name or '<top>'}\n{gm.code}")
        for node in gm.graph.nodes:
            meta = {k: str(node.meta[k]) for k in META_KEYS if k in node.meta}
            parts.append(f"{node.name}: val={_val(node.meta.get('val'))} stack={_stack(node.meta.get('stack_trace'))} "
                         f"{json.dumps(meta, sort_keys=True)}")
    return "\n".join(parts) + "\n"


def programs(names: list[str], plain_only: bool) -> dict[str, Any]:
    """Setting name -> a thunk exporting it."""
    out: dict[str, Any] = {}
    for name in names:
        settings: dict[str, dict[str, Any]] = {"plain": {}}
        if not plain_only and name in WITH_SETTINGS:
            settings["adamw"] = {"optimizer": "adamw"}
            settings["core_aten"] = {"target": pf.OpSet.core_aten()}
        for setting, options in settings.items():
            out[f"{name}.{setting}"] = (name, options)
    return out


def export_one(name: str, options: dict[str, Any]) -> Any:
    if name in JOINT_CASES:
        model, args, kwargs, loss_fn = JOINT_CASES[name].build()
    else:
        model, args, kwargs = build(name, train=True)
        loss_fn = first_float_loss
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3) if options.get("optimizer") == "adamw" else None
    torch.manual_seed(0)
    return pf.export_joint(model, args, kwargs, loss_fn=loss_fn, optimizer=optimizer, target=options.get("target"))


def main() -> None:
    parser = argparse.ArgumentParser()
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--save")
    mode.add_argument("--check")
    parser.add_argument("--models", default=",".join([*JOINT_CASES, *CORPUS]))
    parser.add_argument("--plain-only", action="store_true")
    opts = parser.parse_args()
    folder = Path(opts.save or opts.check)
    folder.mkdir(parents=True, exist_ok=True)
    differences = 0
    for key, (name, options) in programs(opts.models.split(","), opts.plain_only).items():
        try:
            text = snapshot(export_one(name, options))
        except Exception as exc:  # noqa: BLE001 (a refusal is part of the snapshot)
            text = f"error: {type(exc).__name__}: {exc}\n"
        text = text.replace(REPOSITORY, "<repository>")  # the checkout's path does not matter
        path = folder / f"{key}.txt"
        if opts.save:
            path.write_text(text)
            print(key, "saved", flush=True)
            continue
        before = path.read_text() if path.exists() else ""
        if before == text:
            print(key, "same", flush=True)
            continue
        differences += 1
        print(key, "DIFFERS", flush=True)
        sys.stdout.writelines(list(difflib.unified_diff(before.splitlines(True), text.splitlines(True),
                                                        "before", "after", n=1))[:60])
    if opts.check:
        print(f"{differences} program(s) differ")
        sys.exit(1 if differences else 0)


if __name__ == "__main__":
    main()
