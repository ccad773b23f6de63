"""Fake dispatch results on disk: a later process seeds torch's cache with what an earlier
one found for the same model, misses (almost) nothing, and traces the same program, node
metadata included; only aten entries of plain values are kept, and a file holding
anything else is not read."""

import io
import json
import os
import pickle
import subprocess
import sys

import torch

from predispatch_func import _torch_compat as tc
from predispatch_func.trace import persisted_fake_dispatch as persisted

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_SCRIPT = """
import json, sys, torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
import predispatch_func as pf

class Net(nn.Module):  # kept composites, a view written in place, batch norm in training, int and bool args
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.norm = nn.LayerNorm(8)
        self.lin = nn.Linear(8, 5)

    def forward(self, x, mask):
        y = torch.relu_(self.bn(self.conv(x)))
        y.transpose(2, 3)[:, :, 0].mul_(2)
        z = self.lin(self.norm(y.flatten(2)[..., :8]))
        return z.masked_fill(mask, 0.5).softmax(-1), y.sum((2, 3), keepdim=True).argmax(1)

torch.manual_seed(0)
model = Net().train()
args = (torch.randn(2, 3, 4, 4), torch.rand(2, 4, 5) > 0.5)
ep = pf.export(model, args)
got = ep.module()(*args)
torch.manual_seed(0)
expected = Net().train()(*args)
assert all(torch.allclose(a, b) for a, b in zip(got, expected))
def described(value):
    if isinstance(value, torch.Tensor):
        return [list(value.shape), list(value.stride()), str(value.dtype), value.storage_offset(),
                value.requires_grad, str(value.device)]
    return [described(v) for v in value] if isinstance(value, (list, tuple)) else repr(value)
metas = [(n.name, str(n.target), described(n.meta.get("val"))) for n in ep.graph.nodes]
print(json.dumps({"code": ep.graph_module.code, "metas": metas, "misses": FakeTensorMode.cache_misses,
                  "hits": FakeTensorMode.cache_hits}))
"""


def _run(cache: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([_ROOT, os.environ.get("PYTHONPATH", "")]),
           "PREDISPATCH_FUNC_CACHE": cache}
    run = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_a_later_process_seeds_the_cache_and_traces_the_same_program(tmp_path):
    first = _run(str(tmp_path))
    files = list(tmp_path.glob("fake-dispatch-*.pkl"))
    assert len(files) == 1  # written at exit
    second = _run(str(tmp_path))
    assert first["misses"] > 20 and second["misses"] <= first["misses"] // 10  # the file answered
    assert second["code"] == first["code"] and second["metas"] == first["metas"]
    off = _run("")  # no cache directory: nothing read or written, the same program
    assert off["misses"] == first["misses"] and off["code"] == first["code"] and off["metas"] == first["metas"]


@torch.library.custom_op("pftest::scaled", mutates_args=())
def _scaled(x: torch.Tensor, by: float) -> torch.Tensor:
    return x * by


@_scaled.register_fake
def _(x, by):
    return torch.empty_like(x)


class UsesACustomOp(torch.nn.Module):
    def forward(self, x):
        return torch.ops.pftest.scaled(x.sin(), 2.0).cos()


def test_only_aten_entries_of_plain_values_are_kept(tmp_path, monkeypatch):
    import predispatch_func as pf

    monkeypatch.setenv("PREDISPATCH_FUNC_CACHE", str(tmp_path))
    persisted.forget()
    try:
        pf.export(UsesACustomOp(), (torch.randn(13, 17),))  # sizes no other test uses: learned here
        persisted.save()
    finally:
        persisted.forget()
    (path,) = tmp_path.glob("fake-dispatch-*.pkl")
    entries = persisted._read(path)
    ops = {str(parts[0]) for parts, _ in entries}
    assert {"aten.sin.default", "aten.cos.default"} <= ops
    assert all(op.startswith("aten.") for op in ops)  # not the user's op: it may change under its name
    with open(path, "rb") as f:
        assert len(_Namespaced(f).load()) == len(entries)  # nothing the reader dropped


class _Namespaced(pickle.Unpickler):
    def persistent_load(self, pid):
        # getattr, never packet.__getattr__: that makes a new OpOverload object and caches it in
        # torch.ops over the one every table of the process holds (an OpSet then misses the op)
        return getattr(getattr(getattr(torch.ops, pid[0]), pid[1]), pid[2])


class _Calls:
    """An object whose unpickling would call a function: a file must not run code."""

    def __reduce__(self):
        return (print, ("a file ran code",))


def test_a_file_holding_anything_else_is_not_read(tmp_path, capsys):
    path = tmp_path / "fake-dispatch-x.pkl"
    path.write_bytes(pickle.dumps([(("x",), _Calls())]))
    assert persisted._read(path) == []
    buffer = io.BytesIO()
    persisted._Pickler(buffer).dump([((torch.ops.aten.sin.default, torch.float32), _Calls())])
    path.write_bytes(buffer.getvalue())
    assert persisted._read(path) == []
    assert "ran code" not in capsys.readouterr().out
    path.write_bytes(b"not a pickle")
    assert persisted._read(path) == []
    buffer = io.BytesIO()
    persisted._Pickler(buffer).dump([((torch.ops.pftest.scaled.default, torch.float32), None)])
    path.write_bytes(buffer.getvalue())
    assert persisted._read(path) == []  # another namespace: refused by the reader too
    from torch._subclasses.fake_tensor import _DispatchCacheBypassEntry

    buffer = io.BytesIO()
    persisted._Pickler(buffer).dump([((torch.ops.aten.sin.default,), _DispatchCacheBypassEntry("kept")),
                                     ((torch.ops.aten.cos.default,), _DispatchCacheBypassEntry(5)),
                                     ((torch.ops.aten.tan.default,), ("not", "an entry"))])
    path.write_bytes(buffer.getvalue())
    assert [str(parts[0]) for parts, _ in persisted._read(path)] == ["aten.sin.default"]  # ill-formed dropped


def test_entries_round_trip_to_keys_torch_finds(tmp_path):
    """torch's own entries, written and read back, are found under keys made in this process
    (equal and hashed alike) with equal results: what seeding relies on."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        x = mode.from_tensor(torch.randn(4, 6))
        (x.transpose(0, 1) @ x).relu().sum(0, keepdim=True)
    # the ops as torch.ops resolves them now (a process may hold older objects of the same op:
    # their entries are not found under today's, in torch's own cache either)
    ran = {torch.ops.aten.mm.default, torch.ops.aten.relu.default, torch.ops.aten.sum.dim_IntList,
           torch.ops.aten.transpose.int}
    cache = tc.fake_dispatch_cache()
    items = [(parts, v) for k, v in cache.items()
             if (parts := tc.fake_dispatch_key_parts(k))[0] in ran and persisted._persistable(parts)
             and persisted._plain_entry(v)]
    assert {str(parts[0]) for parts, _ in items} >= {"aten.mm.default", "aten.relu.default"}
    path = tmp_path / "fake-dispatch-round-trip.pkl"
    assert persisted._write(path, items)
    read = persisted._read(path)
    assert len(read) == len(items)
    for parts, entry in read:
        key = tc.fake_dispatch_key(parts)
        assert key in cache and cache[key] == entry


def test_a_process_reads_a_models_file_once(tmp_path, monkeypatch):
    """Warm exports of a model whose file was read learn nothing new: the file is not read again
    (it was, on every export, while nothing was learned: 10-40 ms each)."""
    import predispatch_func as pf

    monkeypatch.setenv("PREDISPATCH_FUNC_CACHE", str(tmp_path))
    persisted.forget()
    model, args = UsesACustomOp(), (torch.randn(11, 19),)
    try:
        pf.export(model, args)
        persisted.save()
        persisted.forget()
        reads = []
        real_read = persisted._read
        monkeypatch.setattr(persisted, "_read", lambda path: reads.append(path) or real_read(path))
        for _ in range(3):
            pf.export(model, args)
    finally:
        persisted.forget()
    assert len(reads) == 1 and reads[0].name.startswith("fake-dispatch-")
