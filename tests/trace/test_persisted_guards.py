"""The composite guard's static verdicts on disk: a later process takes them instead of
re-running decompositions, and the program it traces is the one a cold process traces."""

import json
import os

import pytest
import torch
from torch import nn

import predispatch_func as pf
from predispatch_func.disk_cache import torch_build
from predispatch_func.trace import composite_policy
from tests.support.reference import export_checked


class Composites(nn.Module):
    """aten composites the guard checks (layer_norm, flatten, ...) and an in-place op
    through a view, whose write the program must keep."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.norm = nn.LayerNorm(4)

    def forward(self, x):
        y = self.norm(self.lin(x)).softmax(-1)
        z = x.reshape(2, 6)
        z.add_(1)
        return y.flatten(), z


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("PREDISPATCH_FUNC_CACHE", str(tmp_path))
    composite_policy._STATIC_GUARDS.forget()
    yield tmp_path
    composite_policy._STATIC_GUARDS.forget()


def _program(model, args):
    ep = export_checked(model, args)
    return ep.graph_module.code


def test_a_later_process_takes_the_verdicts_from_disk_and_traces_the_same_program(cache_dir, monkeypatch):
    model, args = Composites(), (torch.randn(3, 4),)
    cold = _program(model, args)
    composite_policy._STATIC_GUARDS.save()
    saved = json.loads(next(cache_dir.glob("composite-guards-*.json")).read_text())
    assert any("aten.layer_norm" in key for key in saved), sorted(saved)

    composite_policy._STATIC_GUARDS.forget()  # a new process: nothing in memory

    def no_decomposition(*args, **kwargs):
        raise AssertionError("the guard ran a decomposition its disk cache holds")
    monkeypatch.setattr(composite_policy, "_run_decomposition_and_watch", no_decomposition)
    assert _program(model, args) == cold


def test_an_unreadable_cache_file_is_ignored(cache_dir):
    model, args = Composites(), (torch.randn(3, 4),)
    cold = _program(model, args)
    composite_policy._STATIC_GUARDS.save()
    path = next(cache_dir.glob("composite-guards-*.json"))
    path.write_text("{not json")
    composite_policy._STATIC_GUARDS.forget()
    assert _program(model, args) == cold


def test_a_users_own_composite_is_never_kept_on_disk(cache_dir):
    """A user's composite may change between runs under the same name: memory only."""
    lib = torch.library.Library("pf_persisted_guards", "FRAGMENT")
    lib.define("scale(Tensor x) -> Tensor")
    lib.impl("scale", lambda x: x * 2, "CompositeImplicitAutograd")

    class UsesIt(nn.Module):
        def forward(self, x):
            return torch.ops.pf_persisted_guards.scale(x) + 1

    ep = pf.export(UsesIt(), (torch.randn(3),))
    assert torch.equal(ep.module()(torch.ones(3)), torch.full((3,), 3.0))
    composite_policy._STATIC_GUARDS.save()
    for path in cache_dir.glob("composite-guards-*.json"):
        assert not any("pf_persisted_guards" in key for key in json.loads(path.read_text()))


def test_an_empty_cache_setting_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("PREDISPATCH_FUNC_CACHE", "")
    composite_policy._STATIC_GUARDS.forget()
    try:
        _program(Composites(), (torch.randn(3, 4),))
        composite_policy._STATIC_GUARDS.save()
        assert composite_policy._STATIC_GUARDS.path() is None
    finally:
        composite_policy._STATIC_GUARDS.forget()


def test_the_verdict_files_of_a_torch_build_are_bounded_to_those_used_last(cache_dir):
    """One file per code version: writing keeps the 8 used last, the one written among them;
    another torch build's files stay."""
    old = [cache_dir / f"composite-guards-{torch_build()}-{i:08x}.json" for i in range(12)]
    for i, path in enumerate(old):
        path.write_text("{}")
        os.utime(path, ns=(10**18 + i * 10**9, 10**18 + i * 10**9))
    other = cache_dir / "composite-guards-0.0.0-unknown-00000000.json"
    other.write_text("{}")
    os.utime(other, ns=(10**18, 10**18))
    export_checked(Composites(), (torch.randn(3, 4),))
    composite_policy._STATIC_GUARDS.save()
    written = composite_policy._STATIC_GUARDS.path()
    left = set(cache_dir.glob(f"composite-guards-{torch_build()}-*.json"))
    assert len(left) == 8 and written in left and left - {written} == set(old[-7:])
    assert other.exists()
