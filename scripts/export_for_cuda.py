"""Export every corpus model for CUDA and write each program in comparable form, to show that a
build machine without a GPU exports the program a GPU host exports.

With a GPU the models and inputs are real CUDA tensors; without one they are fake CUDA
tensors (``FakeTensorMode``: ``model.to_empty(device="cuda")``, inputs moved under the mode),
which needs no GPU. Each model is exported in eval mode in fp32, in train mode, and called
under ``autocast("cuda", bfloat16)``; the text of a program is its signature and the code of
every graph module (top graph and region bodies)::

    python -m scripts.export_for_cuda --out gpu.json            # on the GPU host
    python -m scripts.export_for_cuda --out cpu.json            # on a host without one
    python -m scripts.export_for_cuda --compare gpu.json cpu.json
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import predispatch_func as pf
from predispatch_func.graphs import all_graph_modules
from tests.models.corpus import CASES, UnderAutocast, build

VARIANTS = ("fp32-eval", "fp32-train", "bf16-eval")


def program_text(ep: torch.export.ExportedProgram) -> str:
    parts = [str(ep.graph_signature)]
    parts += [f"# {where}\n{gm.code.strip()}" for where, gm in all_graph_modules(ep.graph_module)]
    return "\n\n".join(parts)


def on_cuda(model: torch.nn.Module, args: tuple, kwargs: dict, fake: bool) -> tuple:
    move = lambda value: torch.utils._pytree.tree_map_only(torch.Tensor, lambda t: t.to("cuda"), value)  # noqa: E731
    if not fake:
        return model.to("cuda"), move(args), move(kwargs)
    with FakeTensorMode(allow_non_fake_inputs=True):
        model = model.to_empty(device="cuda")
        if hasattr(model, "tie_weights"):  # to_empty gives tied parameters separate storages
            model.tie_weights()
        return model, move(args), move(kwargs)


def export_all(names: list[str]) -> dict[str, str]:
    fake = not torch.cuda.is_available()
    programs = {}
    for name in names:
        for variant in VARIANTS:
            model, args, kwargs = build(name, train=variant.endswith("train"))
            model, args, kwargs = on_cuda(model, args, kwargs, fake)
            if variant.startswith("bf16"):
                model = UnderAutocast(model, "cuda")
            try:
                programs[f"{name}/{variant}"] = program_text(pf.export(model, args, kwargs))
            except Exception as exc:  # noqa: BLE001 (a refusal is a result to compare too)
                programs[f"{name}/{variant}"] = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0]}"
            print(f"{name}/{variant}: {programs[f'{name}/{variant}'][:60]!r}", flush=True)
    return programs


def compare(a_path: str, b_path: str) -> int:
    a, b = (json.loads(open(path).read())["programs"] for path in (a_path, b_path))
    same = [k for k in a if k in b and a[k] == b[k]]
    print(f"{len(same)} of {len(a)} programs equal")
    for key in sorted(set(a) | set(b)):
        if a.get(key) != b.get(key):
            print(f"--- {key} differs")
            diff = difflib.unified_diff((a.get(key) or "").splitlines(), (b.get(key) or "").splitlines(),
                                        a_path, b_path, lineterm="", n=1)
            print("\n".join(list(diff)[:40]))
    return 0 if len(same) == len(a) == len(b) else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="write the programs here (JSON: name/variant -> text)")
    parser.add_argument("--models", nargs="*", default=list(CASES))
    parser.add_argument("--compare", nargs=2, metavar=("A", "B"))
    ns = parser.parse_args()
    if ns.compare:
        return compare(*ns.compare)
    programs = export_all(ns.models)
    with open(ns.out, "w") as f:
        json.dump({"torch": torch.__version__, "gpu": torch.cuda.is_available(), "programs": programs}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
