"""Conformance against PyTorch's own test databases (see tests/conformance).

The default run judges a deterministic sample of every suite; ``-m
conformance`` runs every case through the runner's worker pool (about as long
as ``scripts/conformance.py``). A case passes when ours is ok wherever
torch.export is ok, and ours is never silently wrong where torch.export is
not. Known gaps (``conformance/known_gaps.json``) are strict xfails.
"""

from __future__ import annotations

import json

import pytest
from conformance import SUITES, case_names, sampled_cases
from conformance.judge import judge
from conformance.known_gaps import is_gap, known_gaps
from conformance.runner import load_results, run


def _sample() -> list:
    gaps = known_gaps()
    return [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=gaps[n])) if n in gaps else n
            for n in sampled_cases()]


@pytest.mark.parametrize("name", _sample())
def test_sampled_case(name):
    theirs = judge(name, "torch").__dict__
    ours = judge(name, "ours").__dict__
    if ours["status"] == "n/a" and theirs["status"] == "n/a":
        pytest.skip(f"not a case: {ours['detail']}")
    assert not is_gap(ours, theirs), f"ours {ours}\ntorch.export {theirs}"


@pytest.mark.conformance
def test_every_case(tmp_path):
    """Every case, run by the script's worker pool (crashes and hangs contained)."""
    results_path = tmp_path / "results.jsonl"
    names = [n for s in SUITES for n in case_names(s)]
    with open(results_path, "a") as f:
        run([(n, e) for n in names for e in ("ours", "torch")], workers=2, timeout=120,
            sink=lambda r: f.write(json.dumps(r) + "\n"))
    results = load_results(str(results_path))
    gaps = known_gaps()
    new_gaps, closed = [], []
    for n in names:
        ours, theirs = results[(n, "ours")], results[(n, "torch")]
        if is_gap(ours, theirs) and n not in gaps:
            new_gaps.append(f"{n}: ours {ours['status']} ({ours['signature'] or ours['detail']}), "
                            f"torch.export {theirs['status']}")
        elif n in gaps and not is_gap(ours, theirs):
            closed.append(n)
    assert not new_gaps and not closed, (
        f"{len(new_gaps)} new gap(s):\n" + "\n".join(new_gaps[:50])
        + f"\n{len(closed)} known gap(s) closed (regenerate known_gaps.json): {closed[:50]}")
