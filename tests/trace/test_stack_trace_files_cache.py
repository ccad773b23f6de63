"""The files fx drops from stack traces, kept on disk per torch install: a process that
reads them records the stack traces a process that computes them records, and a file
that is unreadable, malformed or names files that are gone is recomputed, not trusted."""

import json

import pytest
import torch
from torch import nn

from predispatch_func import _torch_compat as tc
from predispatch_func.passes import stack_trace_files
from tests.support.reference import export_checked


def _helper(t):  # not a forward frame: dropped
    return torch.nn.functional.relu(t)


class Nested(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.seq = nn.Sequential(nn.Linear(3, 3), nn.Tanh())

    def forward(self, x):
        return self.seq(_helper(self.lin(x))).cos() * 2


def _stack_traces():
    ep = export_checked(Nested(), (torch.randn(2, 3),))
    return [(str(n.target), n.meta.get("stack_trace")) for n in ep.graph.nodes if n.op == "call_function"]


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("PREDISPATCH_FUNC_CACHE", str(tmp_path))
    stack_trace_files.forget()
    yield tmp_path
    stack_trace_files.forget()


def test_the_file_holds_torchs_set(cache_dir):
    stack_trace_files.dropped_files()
    (path,) = cache_dir.glob("stack-trace-dropped-*.json")
    assert set(json.loads(path.read_text())) == tc.uninteresting_stack_files()


def test_cold_warm_and_no_cache_record_the_same_stack_traces(cache_dir, monkeypatch):
    cold = _stack_traces()
    assert all(trace for _, trace in cold)
    assert stack_trace_files.cache_path().exists()
    stack_trace_files.forget()  # a new process: nothing in memory
    with monkeypatch.context() as m:
        m.setattr(tc, "uninteresting_stack_files", lambda: pytest.fail("computed what the disk holds"))
        assert _stack_traces() == cold
    monkeypatch.setenv("PREDISPATCH_FUNC_CACHE", "")
    stack_trace_files.forget()
    assert stack_trace_files.cache_path() is None
    assert _stack_traces() == cold


@pytest.mark.parametrize("content", ["{not json", "{}", "[]", "[1, 2]", json.dumps(["/no/such/torch/file.py"])])
def test_a_bad_or_stale_file_is_recomputed_not_trusted(cache_dir, content):
    cold = _stack_traces()
    path = stack_trace_files.cache_path()
    path.write_text(content)
    stack_trace_files.forget()
    assert stack_trace_files.dropped_files() == frozenset(tc.uninteresting_stack_files())
    assert _stack_traces() == cold
    assert set(json.loads(path.read_text())) == tc.uninteresting_stack_files()  # and written again


def test_two_torch_installs_keep_two_files(cache_dir, monkeypatch):
    here = stack_trace_files.cache_path()
    monkeypatch.setattr(torch, "__file__", "/elsewhere/site-packages/torch/__init__.py")
    assert stack_trace_files.cache_path() != here
