"""Cases where we are known to fall short of torch.export, and why, per torch release.

``known_gaps.json`` maps a case name to ``{"reason": ..., "torch": [releases]}``:
the torch releases (``2.15.0``, no local build tag) on which the case is a gap
(torch.export is ok and we are not, or we are silently wrong and torch.export
is not). ``python -m scripts.conformance --write-known-gaps`` updates it from
the results of the interpreter's torch: it adds or removes that release for the
cases that run judged, and leaves other releases and cases alone. Tests mark
the installed torch's gaps ``xfail(strict=True)``: a gap that closes fails the
test until the file is updated.
"""

from __future__ import annotations

import functools
import json
import os

from . import release_key, torch_release

PATH = os.path.join(os.path.dirname(__file__), "known_gaps.json")

# A phrase of our outcome's detail -> why; the rest fall back to the outcome itself.
_REASONS = {
    "in-place metadata change (shape/stride) of a graph input":
        "an in-place metadata change of an input to a symbolic layout, or of a parameter: refused "
        "(docs/limits.md)",
    "output: requires_grad is True in eager, False in program":
        "eager marks the result of an in-place comparison (eq_, gt_, ...) written into a float "
        "tensor as requiring grad (with a zero gradient) when another operand does; ours does not",
    "requires_grad is False in eager, True in program":
        "resize_as_ of a buffer to an operand that requires grad: eager's buffer does not require grad",
    "Cannot access data pointer of Tensor":
        "the forward reassigns a Python attribute to new tensors; export leaves tracing tensors "
        "there (the Python-state guard now refuses it)",
    "silu does not support automatic differentiation for outputs with complex dtype":
        "torch bug: eager's silu_ differentiates a complex input without conjugation (its gradient is "
        "grad * f'(z), PyTorch's convention is grad * conj(f'(z))) while silu refuses complex autograd; "
        "the functional program runs silu, which raises torch's clear error",
    "draws from the global RNG after the model called torch.":
        "a random op after OpInfo's wrapper_set_seed (torch.manual_seed in forward) is refused "
        "(RNG_STATE_SET); torch.export's program matches eager here only because the sample draws "
        "nothing (rrelu of positive inputs), and would draw from the caller's RNG otherwise",
    "derivative for aten::":
        "a functional kernel without a derivative, so the program cannot train through it",
    "its data is not allocated yet":
        "tensor_split with a tensor of indices reads its data while tracing",
}


def is_gap(ours: dict, torch_: dict) -> bool:
    if ours["status"] == "n/a" or torch_["status"] == "n/a":
        return False
    return (torch_["status"] == "ok" and ours["status"] != "ok") or (
        ours["status"] == "wrong" and torch_["status"] != "wrong")


def reason(ours: dict, case: str = "") -> str:
    detail = ours.get("detail", "")
    if "/inplace_view/" in case and "input grads" in detail and "logical_" in case:
        return ("eager passes a gradient of 1 through logical_not_/and_/or_/xor_ written into a view "
                "(an autograd quirk: the ops are not differentiable); ours passes 0")
    for phrase, why in _REASONS.items():
        if phrase in detail:
            return why
    return f"ours {ours['status']}: {ours.get('signature') or detail}"


def entries() -> dict[str, dict]:
    """The whole file: case name -> ``{"reason": str, "torch": [release, ...]}``."""
    if not os.path.exists(PATH):
        return {}
    with open(PATH) as f:
        return json.load(f)


def write_entries(gaps: dict[str, dict]) -> None:
    gaps = {c: {"reason": e["reason"], "torch": sorted(set(e["torch"]), key=release_key)}
            for c, e in sorted(gaps.items()) if e["torch"]}
    lines = [f"{json.dumps(c)}: {json.dumps(e)}" for c, e in gaps.items()]  # one gap a line
    with open(PATH, "w") as f:
        f.write("{\n" + ",\n".join(lines) + ("\n" if lines else "") + "}\n")


def update(gaps: dict[str, dict], judged: dict[str, tuple[dict, dict]], release: str) -> dict[str, dict]:
    """``gaps`` with ``release`` set or cleared for every case of ``judged``
    (case -> (ours, torch.export) outcomes on that release); an entry's reason
    is kept, a new entry's comes from ``reason``."""
    gaps = {c: {"reason": e["reason"], "torch": list(e["torch"])} for c, e in gaps.items()}
    for case, (ours, theirs) in judged.items():
        entry = gaps.get(case)
        if is_gap(ours, theirs):
            if entry is None:
                entry = gaps[case] = {"reason": reason(ours, case), "torch": []}
            if release not in entry["torch"]:
                entry["torch"].append(release)
        elif entry is not None and release in entry["torch"]:
            entry["torch"].remove(release)
    return {c: e for c, e in gaps.items() if e["torch"]}


@functools.cache
def known_gaps(release: str | None = None) -> dict[str, str]:
    """Case name -> reason, for the gaps of ``release`` (default: the installed torch)."""
    release = release or torch_release()
    return {c: e["reason"] for c, e in entries().items() if release in e["torch"]}
