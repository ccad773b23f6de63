"""Cases where we are known to fall short of torch.export, and why.

``known_gaps.json`` maps a case name to the reason; it is written by
``python scripts/conformance.py --write-known-gaps`` from a full run's results
(a case is a gap when torch.export is ok and we are not, or we are silently
wrong and torch.export is not). Tests mark these ``xfail(strict=True)``: a gap
that closes fails the test until the file is regenerated.
"""

from __future__ import annotations

import functools
import json
import os

PATH = os.path.join(os.path.dirname(__file__), "known_gaps.json")

# A phrase of our outcome's detail -> why; the rest fall back to the outcome itself.
_REASONS = {
    "in-place metadata change (shape/stride) of a graph input":
        "an in-place metadata change of an input to a symbolic layout, or of a parameter: refused "
        "(README, known limits)",
    "output: requires_grad is True in eager, False in program":
        "eager marks the result of an in-place comparison (eq_, gt_, ...) written into a float "
        "tensor as requiring grad (with a zero gradient) when another operand does; ours does not",
    "requires_grad is False in eager, True in program":
        "resize_as_ of a buffer to an operand that requires grad: eager's buffer does not require grad",
    "Cannot access data pointer of Tensor":
        "the forward reassigns a Python attribute to new tensors; export leaves tracing tensors "
        "there (issue 15: the Python-state guard)",
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


@functools.cache
def known_gaps() -> dict[str, str]:
    if not os.path.exists(PATH):
        return {}
    with open(PATH) as f:
        return json.load(f)
