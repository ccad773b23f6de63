"""Caches of the model's own state filled in forward: carried from the trace alone.

A dict that gains an entry computed only from parameters and buffers the program never
writes is carried without running eager (state/state_memos.py). Every neighbour that
is not such a cache (an input in the entry, the entry written again each call, a buffer
the call writes, a random draw, a key that is a tensor, an input's shape) must still go
to the eager judge and end as it did before: carried or refused.
"""

import pytest
import torch
from torch import nn

import predispatch_func.state.python_state as python_state
from predispatch_func.errors import Refusal, UnsupportedError
from tests.state.test_python_state import AttentionBiasCacheByDevice, _exports_and_equals_eager_over_three_calls
from tests.support.reference import export_checked


@pytest.fixture
def judge_calls(monkeypatch):
    calls = []
    judge = python_state.judge_over_calls  # the state guard imports it where it calls it

    def counted(*args, **kwargs):
        calls.append(args[2])
        return judge(*args, **kwargs)
    monkeypatch.setattr(python_state, "judge_over_calls", counted)
    return calls


class Memo(nn.Module):
    """A cache keyed by ``key(x)`` holding ``entry(self, x)`` on a miss."""

    def __init__(self, entry, key=lambda x: str(x.device)):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, 4))
        self.register_buffer("steps", torch.zeros(4, 4))
        self.entry, self.key = entry, key
        self.cache = {}

    def forward(self, x):
        key = self.key(x)
        if key not in self.cache:
            self.cache[key] = self.entry(self, x)
        return x @ self.cache[key]


def test_cache_of_a_gathered_parameter_is_carried_without_running_eager(judge_calls):
    model = AttentionBiasCacheByDevice().eval()
    _exports_and_equals_eager_over_three_calls(model, (torch.randn(2, 3, 4),), grads=False)
    assert judge_calls == []
    assert model.bias_cache == {}


def test_cache_of_parameters_and_buffers_under_a_tuple_key_is_carried_without_running_eager(judge_calls):
    with torch.no_grad():
        model = Memo(lambda m, x: (m.weight.t() * 2 + m.steps).softmax(-1), key=lambda x: ("cpu", 1))
    _exports_and_equals_eager_over_three_calls(model, (torch.randn(3, 4),), grads=False)
    assert judge_calls == []
    assert model.cache == {}


def _still_judged(model, args, judge_calls):
    """Exported as before this shortcut existed: the judge decides."""
    try:
        _exports_and_equals_eager_over_three_calls(model, args, grads=False)
        outcome = "carried"
    except UnsupportedError as e:
        assert e.kind is Refusal.PYTHON_STATE_CHANGED
        outcome = "refused"
    assert [w.name for w in judge_calls[0]] == ["cache"]
    return outcome


def test_cache_of_an_input_goes_to_the_judge_which_refuses_it(judge_calls):
    assert _still_judged(Memo(lambda m, x: x.t() @ m.weight), (torch.randn(4, 4),), judge_calls) == "refused"


def test_cache_entry_written_in_place_on_every_call_goes_to_the_judge(judge_calls):
    class Accumulates(Memo):
        def forward(self, x):
            self.cache.setdefault("k", self.weight.detach().clone())
            self.cache["k"].add_(1)
            return x @ self.cache["k"]
    assert _still_judged(Accumulates(None), (torch.randn(3, 4),), judge_calls) == "refused"


def test_cache_of_a_buffer_the_call_writes_goes_to_the_judge(judge_calls):
    class WritesBuffer(Memo):
        def forward(self, x):
            out = super().forward(x)
            self.steps.add_(1)
            return out
    model = WritesBuffer(lambda m, x: m.steps + m.weight.detach())
    assert _still_judged(model, (torch.randn(3, 4),), judge_calls) == "refused"


def test_cache_of_a_random_draw_goes_to_the_judge(judge_calls):
    model = Memo(lambda m, x: m.weight.detach() + torch.randn(4, 4))
    _still_judged(model, (torch.randn(3, 4),), judge_calls)


def test_cache_of_a_dynamic_input_size_goes_to_the_judge(judge_calls):
    """A size the program takes as a symbol reaches the entry from a user input: eager's
    entry holds the first call's size (the judge, over equal shapes, carries it)."""
    model = Memo(lambda m, x: m.weight.detach() * x.shape[0])
    x = torch.randn(3, 4)
    export_checked(model, (x,), dynamic_shapes=({0: torch.export.Dim("n", min=2)},), check_grads=False)
    assert [w.name for w in judge_calls[0]] == ["cache"]


def test_cache_of_a_static_input_size_is_carried_without_running_eager(judge_calls):
    """A static size is a constant of the program, as it is of every eager call it accepts."""
    _exports_and_equals_eager_over_three_calls(Memo(lambda m, x: m.weight.detach() * x.shape[0]),
                                               (torch.randn(3, 4),), grads=False)
    assert judge_calls == []
