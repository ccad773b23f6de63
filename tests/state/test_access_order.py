"""Judging Python state by access order: an attribute each call sets before reading it.

Such a write cannot carry anything from one call to the next, so the judge runs
two live calls and no replica (:mod:`predispatch_func.state.access_order`).
Each carried case is replayed against the reference over three calls; each read the
hooks could miss (``vars(self)``, ``getattr``, ``__dict__``) is shown to fall
back to the full judge, which refuses the stale value.
"""

import re

import pytest
import torch
from torch import nn

import predispatch_func as pf
from predispatch_func.state.access_order import AccessOrder
from tests.support.reference import assert_same_caller_state, caller_state, export_checked, replay_calls

_HOOKS = ("__getattribute__", "__setattr__", "__delattr__")


class StoresItsPyramidEachCall(nn.Module):
    """torchvision raft: the pyramid is rebuilt and stored each call, then read."""

    calls: list = []  # every eager and traced forward, on the class (a copy shares it)

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 2, 1)
        self.pyramid = [torch.tensor(0.0)]

    def forward(self, x):
        type(self).calls.append(type(self) is StoresItsPyramidEachCall)
        self.pyramid = [self.conv(x)]
        self.pyramid.append(nn.functional.avg_pool2d(self.pyramid[0], 2))
        return sum(level.sum() for level in self.pyramid)


def _exports_and_equals_eager_over_three_calls(model, args):
    before = caller_state(model, args)
    ep = export_checked(model, args)
    assert_same_caller_state(before, caller_state(model, args), "export")
    replay_calls(ep, model, args, calls=3)


def test_value_set_before_read_each_call_is_judged_by_two_eager_calls_and_carried():
    model, x = StoresItsPyramidEachCall(), torch.randn(1, 2, 4, 4)
    StoresItsPyramidEachCall.calls = []
    pf.export(model, (x,))
    # the trace, then two live calls; the full judge makes four eager calls besides the trace
    assert StoresItsPyramidEachCall.calls == [True, True, True]
    assert all(hook not in vars(StoresItsPyramidEachCall) for hook in _HOOKS)
    _exports_and_equals_eager_over_three_calls(model, (x,))


class CachesThroughVars(nn.Module):
    """A stale cache read through ``vars(self)``: no attribute hook sees that read."""

    def forward(self, x):
        cached = vars(self).get("cache")
        self.cache = x.mean(0) if cached is None else cached
        return x - self.cache


class CachesThroughGetattr(nn.Module):
    def forward(self, x):
        self.cache = getattr(self, "cache", None)
        if self.cache is None:
            self.cache = x.mean(0)
        return x - self.cache


class CachesThroughDict(nn.Module):
    def forward(self, x):
        if "cache" not in self.__dict__:
            self.cache = x.mean(0)
        return x - self.cache


@pytest.mark.parametrize("model", [CachesThroughVars(), CachesThroughGetattr(), CachesThroughDict()],
                         ids=lambda m: type(m).__name__)
def test_a_stale_cache_read_before_it_is_set_is_still_refused(model):
    with pytest.raises(pf.UnsupportedError, match=r"attribute 'cache'[\s\S]*later eager calls read it"):
        pf.export(model, (torch.randn(2, 3),))
    assert "cache" not in vars(model)


class StoresARandomDrawEachCall(nn.Module):
    """Set before it is read, but each call stores a new draw: eager keeps changing it."""

    def forward(self, x):
        self.noise = torch.rand(())
        return x * 2


def test_a_value_set_first_that_changes_every_call_is_still_refused_as_drifting():
    with pytest.raises(pf.UnsupportedError, match=r"attribute 'noise'[\s\S]*changes again on a second "
                       "identical call"):
        pf.export(StoresARandomDrawEachCall(), (torch.randn(3),))


class Base(nn.Module):
    def forward(self, x):
        self.scale = 2.0
        return x * self.scale


class Derived(Base):
    def __init__(self):
        super().__init__()
        self.inner = Base()

    def forward(self, x):
        self.shift = 1.0
        return self.inner(x) + self.shift


def test_a_module_and_its_submodule_of_a_base_class_are_both_watched_and_both_classes_restored():
    model = Derived()
    _exports_and_equals_eager_over_three_calls(model, (torch.randn(3),))
    order = AccessOrder.of(model, [("", "shift"), ("inner", "scale")])
    assert order is not None
    with order.recording():
        model(torch.randn(3))
    assert not order.read_before_written
    assert all(hook not in vars(cls) for cls in (Base, Derived) for hook in _HOOKS)
    del model.shift, model.inner.scale


class RaisesOnTheSecondCall(nn.Module):
    def forward(self, x):
        self.seen = getattr(type(self), "count", 0)
        type(self).count = self.seen + 1
        if self.seen == 2:  # the trace was call 0, the judge's first call 1
            raise RuntimeError("second eager call")
        return x + 1


def test_the_class_is_restored_when_a_judged_call_raises():
    model = RaisesOnTheSecondCall()
    RaisesOnTheSecondCall.count = 0
    with pytest.raises(pf.UnsupportedError, match=re.escape("eager could not be run to judge it (RuntimeError: "
                                                            "second eager call)")):
        pf.export(model, (torch.randn(3),))
    assert all(hook not in vars(RaisesOnTheSecondCall) for hook in _HOOKS)


def test_a_read_before_the_first_set_is_seen_and_a_read_after_it_is_not():
    class ReadsThenSets(nn.Module):
        def forward(self, x):
            self.before = getattr(self, "after", None)
            self.after = x
            return self.after

    model = ReadsThenSets()
    reads_first = AccessOrder.of(model, [("", "after")])
    sets_first = AccessOrder.of(model, [("", "before")])
    assert reads_first is not None and sets_first is not None
    with reads_first.recording():
        model(torch.randn(2))
    with sets_first.recording():
        model(torch.randn(2))
    assert reads_first.read_before_written and not sets_first.read_before_written


class SetsAFlagOnItsFirstCall(nn.Module):
    """Reads its flag before setting it: the full judge, which goes on from the access-order
    attempt's call instead of making that call again on a new copy."""

    calls = 0

    def __init__(self):
        super().__init__()
        self.ready = False

    def forward(self, x):
        type(self).calls += 1
        if not self.ready:
            self.ready = True
        return x * 2


def test_a_read_first_is_judged_by_the_full_judge_going_on_from_the_first_call():
    model, x = SetsAFlagOnItsFirstCall(), torch.randn(3)
    SetsAFlagOnItsFirstCall.calls = 0
    pf.export(model, (x,))
    # the trace; then live's calls 0, 1 and 2 and call 2's replica (call 0 stands for call 1's)
    assert SetsAFlagOnItsFirstCall.calls == 5
    assert model.ready is False
    _exports_and_equals_eager_over_three_calls(model, (x,))
