"""Conformance against PyTorch's own test databases (see tests/conformance).

The default run judges a deterministic sample of every suite; ``-m
conformance`` runs every case through the runner's worker pool (about as long
as ``scripts/conformance.py``). A case passes when ours is ok wherever
torch.export is ok, and ours is never silently wrong where torch.export is
not. Known gaps of the installed torch release (``conformance/known_gaps.json``
lists for each gap the releases it applies to) are strict xfails.
"""

from __future__ import annotations

import json

import pytest

from tests.conformance import SUITES, case_names, sampled_cases
from tests.conformance.judge import judge
from tests.conformance.known_gaps import is_gap, known_gaps
from tests.conformance.runner import load_results, run


def _sample() -> list:
    gaps = known_gaps()
    return [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=gaps[n])) if n in gaps else n
            for n in sampled_cases()]


@pytest.mark.deep
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
        + f"\n{len(closed)} known gap(s) closed on this torch (update known_gaps.json: scripts/conformance.py --write-known-gaps): {closed[:50]}")


def test_torch_release_drops_the_build_tag():
    from tests.conformance import release_key, torch_release

    assert torch_release("2.15.0+cu132") == torch_release("2.15.0+cpu") == torch_release("2.15.0") == "2.15.0"
    assert sorted(["2.15.0", "2.9.1", "2.14.1"], key=release_key) == ["2.9.1", "2.14.1", "2.15.0"]


def test_known_gaps_are_per_torch_release():
    """Updating from one torch's results sets or clears that release only."""
    from tests.conformance import known_gaps as kg

    ok, err, wrong = {"status": "ok"}, {"status": "error", "signature": "E"}, {"status": "wrong", "detail": "d"}
    gaps = {"a": {"reason": "why a", "torch": ["2.13.0", "2.15.0"]},
            "b": {"reason": "why b", "torch": ["2.13.0"]},
            "c": {"reason": "why c", "torch": ["2.15.0"]}}
    new = kg.update(gaps, {"a": (ok, ok), "b": (wrong, err), "c": (ok, ok), "d": (err, ok)}, "2.15.0")
    assert new == {"a": {"reason": "why a", "torch": ["2.13.0"]},
                   "b": {"reason": "why b", "torch": ["2.13.0", "2.15.0"]},
                   "d": {"reason": "ours error: E", "torch": ["2.15.0"]}}
    assert gaps["a"]["torch"] == ["2.13.0", "2.15.0"]  # not changed in place
