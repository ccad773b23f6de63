"""``pf.verify(..., calls=N)`` replays N calls in a row with the state each side keeps, so a
one-time effect of the first call shows; and verify compares a model it cannot deep-copy
(a cache holding a tensor with autograd history) instead of raising."""

import pytest
import torch

import predispatch_func as pf
from tests.support.reference import export_checked


class OneTimeRescale(torch.nn.Module):
    """transformers' RWKV in eval: weights rescaled in place on the first call, then a flag."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)
        self.rescaled = False

    def forward(self, x):
        if not self.rescaled:
            with torch.no_grad():
                self.lin.weight.div_(2)
            self.rescaled = True
        return self.lin(x)


class Counter(torch.nn.Module):
    """A buffer the program carries: every call adds one, on both sides."""

    def __init__(self):
        super().__init__()
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls.add_(1)
        return x * self.calls


def test_one_time_rescale_is_refused_by_default():
    with pytest.raises(pf.UnsupportedError, match="rescaled"):
        pf.export(OneTimeRescale(), (torch.randn(2, 3),))


def test_calls_shows_what_a_single_replay_cannot():
    model, x = OneTimeRescale(), torch.randn(2, 3)
    with pytest.warns(UserWarning, match="rescaled"):
        ep = pf.export(model, (x,), python_state="warn")
    assert pf.verify(ep, model, (x,)).ok  # the first call: the program is eager's
    report = pf.verify(ep, model, (x,), calls=3)
    assert not report.ok
    assert report.problems[0].startswith("call 2: output: values differ"), report
    assert not any(p.startswith("call 1:") for p in report.problems)
    assert "3 calls in a row, state carried" in report.checked
    assert not model.rescaled and model.lin.weight.grad is None  # verify copies the model


def test_state_the_program_carries_is_equal_over_calls():
    model, x = Counter(), torch.randn(2, 3)
    ep = export_checked(model, (x,))
    report = pf.verify(ep, model, (x,), calls=4, raise_on_failure=True)
    assert "buffers and parameters" in report.checked and report.ok
    assert float(model.calls) == 0.0


def test_calls_must_be_positive():
    model, x = Counter(), torch.randn(2, 3)
    with pytest.raises(ValueError, match="calls must be at least 1"):
        pf.verify(pf.export(model, (x,)), model, (x,), calls=0)


class CachedProduct(torch.nn.Module):
    """timm LeViT's attention_bias_cache: a tensor with autograd history kept on the module."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)
        self.cache = {}

    def forward(self, x):
        if "w" not in self.cache:
            self.cache["w"] = self.lin.weight * 2
        return x @ self.cache["w"]


def test_verify_compares_a_model_holding_a_tensor_with_history():
    model, x = CachedProduct(), torch.randn(2, 3)
    model(x)  # an eager call first, as a user would: the cache now has grad history
    ep = pf.export(model, (x,))  # forward writes nothing now: it reads the cache
    report = pf.verify(ep, model, (x,), calls=2)
    assert report.ok, report
    assert any("copied without their autograd history: cache.w" in c for c in report.checked), report.checked
    assert model.cache["w"].grad_fn is not None  # the caller's cache is untouched


def test_transformers_rwkv_rescaling_once_is_refused_or_right_over_three_calls():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.RwkvConfig(vocab_size=50, hidden_size=32, num_hidden_layers=4, attention_hidden_size=32,
                                     context_length=16, rescale_every=2)
    model, ids = transformers.RwkvModel(config).eval(), torch.randint(0, 50, (1, 8))
    with pytest.raises(pf.UnsupportedError, match="layers_are_rescaled"):
        pf.export(model, (ids,))
    with pytest.warns(UserWarning):
        ep = pf.export(model, (ids,), python_state="warn")
    report = pf.verify(ep, model, (ids,), calls=3)
    assert not report.ok and report.problems[0].startswith("call 2:"), report


def test_the_old_names_of_the_reference_replay_still_work():
    # issue 40 renamed the judge "the reference"; pf.replay_against_eager and tests.support.reference stay
    import copy

    import tests.support.reference

    assert tests.support.reference is tests.support.reference
    model, x = torch.nn.Linear(3, 3), torch.randn(2, 3)
    ep = export_checked(model, (x,))
    old = pf.replay_against_eager(copy.deepcopy(ep.module()), model, (x,))
    new = pf.replay_against_reference(copy.deepcopy(ep.module()), model, (x,))
    assert old.problems == new.problems == []
    assert old.checked == new.checked and new.checked
