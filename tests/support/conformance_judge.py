"""``assert_ok(model, args)``: judge one model as the conformance runner (scripts/conformance.py)
judges a case, for the regressions that runner found.

``conformance.judge.judge_case`` exports with ours, checks the contract, replays against the
reference with gradients (an input written in place is passed as a leaf's ``clone()``, as eager
allows) and requires the caller's model, inputs and RNG state unchanged.
"""

from __future__ import annotations

import torch

from tests.conformance import Case
from tests.conformance.judge import judge_case


def assert_ok(model: torch.nn.Module, args: tuple, kwargs: dict | None = None, **case_kwargs) -> None:
    outcome = judge_case(Case("regression", model, args, kwargs or {}, **case_kwargs), "ours")
    assert outcome.status == "ok", outcome
