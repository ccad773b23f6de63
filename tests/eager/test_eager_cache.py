"""The per-signature kernel cache of ``pf.eager``: traced once, replayed, never the wrong branch."""

import os
import pickle

import pytest
import torch

import predispatch_func as pf
from predispatch_func.eager import cache, mode, persisted_kernels, replay, session_key
from predispatch_func.eager.mode import kernels_for

aten = torch.ops.aten
CORE = pf.OpSet.core_aten()


def _graphs_of(op):
    return dict(kernels_for(CORE).graphs.get(id(op), {}))


def test_second_call_replays_the_traced_kernel():
    x = torch.randn(3, 4)
    with pf.eager.on(CORE) as session:
        first = torch.logit(x.sigmoid(), 1e-3)
        second = torch.logit(x.sigmoid(), 1e-3)
    assert torch.equal(first, second)
    assert session.stats.cache_hits[aten.logit.default] >= 1
    traced = [graph for graph in _graphs_of(aten.logit.default).values() if graph is not cache.UNCACHEABLE]
    assert traced and all(op in CORE for graph in traced for op in cache.ops_of(graph))


def test_scalar_argument_branch_is_never_replayed_for_another_value():
    # rot90's decomposition branches on k: flip+transpose, two flips, transpose+flip, clone
    x = torch.arange(12.0).reshape(3, 4)
    with pf.eager.on(CORE) as session:
        got = [torch.rot90(x, k) for k in (1, 2, 3, 4, 1, 2)]
    for k, value in zip((1, 2, 3, 4, 1, 2), got):
        assert torch.equal(value, torch.rot90(x, k)), k
    codes = {graph.code for graph in _graphs_of(aten.rot90.default).values()}
    assert len(codes) >= 4  # one kernel per branch, each replayed for its own k only
    assert session.stats.cache_hits[aten.rot90.default] >= 2


def test_size_branch_is_keyed_by_size():
    # roll bakes shift % size into its kernel: a kernel traced for size 5 is wrong for size 3
    with pf.eager.on(CORE):
        a = torch.roll(torch.arange(5.0), 4)
        b = torch.roll(torch.arange(3.0), 4)
    assert torch.equal(a, torch.roll(torch.arange(5.0), 4)) and torch.equal(b, torch.roll(torch.arange(3.0), 4))


def test_stride_and_float_value_are_part_of_the_key():
    x = torch.randn(4, 6)
    with pf.eager.on(CORE):
        for t in (x, x.t(), x[:, ::2]):
            for eps in (0.0, -0.0, 1e-3):
                torch.testing.assert_close(torch.logit(t.sigmoid(), eps), torch.logit(t.sigmoid(), eps))
    keys, _ = cache.signature((x,), {}), None
    assert cache.signature((x, 0.0), {})[0] != cache.signature((x, -0.0), {})[0]
    assert cache.signature((x.t(),), {})[0] != keys[0]


def test_one_tensor_passed_twice_is_its_own_signature():
    # traced with (a, a), the kernel has one input: replaying it for (a, b) would compare b with b
    a, b = torch.ones(3), torch.zeros(3)
    with pf.eager.on(CORE):
        same, different = torch.isclose(a, a), torch.isclose(a, b)
    assert same.all() and not different.any()


def test_data_dependent_decomposition_is_not_cached():
    a, b = torch.ones(3), torch.zeros(3)
    # observed: a keyed session leaves allclose to torch's composite kernel (no Python at all)
    with pf.eager.on(CORE, observe=True) as session:
        first, second = torch.allclose(a, a), torch.allclose(a, b)
    assert (first, second) == (True, False)
    assert session.stats.uncached[aten.allclose.default] == 2
    assert all(graph is cache.UNCACHEABLE for graph in _graphs_of(aten.allclose.default).values())


def test_random_decomposition_replays_draw_like_eager():
    x = torch.rand(32)
    torch.manual_seed(0)
    expected = [torch.bernoulli(x) for _ in range(3)] + [torch.rand_like(x) for _ in range(2)]
    torch.manual_seed(0)
    with pf.eager.on(CORE):
        got = [torch.bernoulli(x) for _ in range(3)] + [torch.rand_like(x) for _ in range(2)]
    for g, e in zip(got, expected):
        assert torch.equal(g, e)


def _fresh_process_state():
    """Forget every plan, kernel and registration, as a new process starts."""
    session_key.release()
    mode._kernels_for.cache_clear()


def test_kernels_traced_in_one_process_are_replayed_by_the_next_without_tracing(tmp_path, monkeypatch):
    monkeypatch.setenv("PREDISPATCH_FUNC_CACHE", str(tmp_path))
    x, y = torch.randn(3, 4), torch.randn(4)
    expected = (torch.logit(x.sigmoid(), 1e-3), torch.rot90(x, 3), x.clone().addcmul_(x, y, value=0.5))
    _fresh_process_state()
    try:
        with pf.eager.on(CORE) as first:
            traced = (torch.logit(x.sigmoid(), 1e-3), torch.rot90(x, 3), x.clone().addcmul_(x, y, value=0.5))
            only_first = torch.sinc(x)  # a kernel the next process never asks for
        assert first.stats.cache_misses[aten.logit.default] == 1
        kernels_for(CORE).persisted.save()  # what the process writes at its exit
        assert list(tmp_path.glob("eager-kernels-*.pkl"))
        _fresh_process_state()
        kernels = kernels_for(CORE)  # the next process reads the file; each op's kernels stay pickled
        assert id(aten.logit.default) not in kernels.graphs and kernels.persisted.holds("kernels", aten.logit.default)
        restored = dict(kernels.kernels_of(aten.logit.default))  # until the op is first asked for:
        assert restored and all(kernel.saved is not None for kernel in restored.values())  # compiled code too
        # read as written until called: a file holds every model's kernels, a process calls few
        assert all(kernel._constants is None and kernel._code_object is None for kernel in restored.values())

        def no_compiling(*args, **kwargs):
            raise AssertionError("a kernel restored from disk was compiled again")
        with monkeypatch.context() as patch, pf.eager.on(CORE) as second:
            patch.setattr(replay, "compile", no_compiling, raising=False)
            replayed = (torch.logit(x.sigmoid(), 1e-3), torch.rot90(x, 3), x.clone().addcmul_(x, y, value=0.5))
        assert len(second.stats.cache_misses) == 0, second.stats.cache_misses
        assert second.stats.cache_hits[aten.logit.default] == 1 and second.stats.cache_hits[aten.rot90.default] == 1
        for value, again, want in zip(traced, replayed, expected):
            assert torch.equal(value, again)  # the same kernel, traced or restored
            torch.testing.assert_close(value, want)
        # the registrations came from disk: no plan was decided for an op the session never met
        assert id(aten.hypot.default) not in kernels_for(CORE).plans
        assert kernels_for(CORE).persisted.holds("kernels", aten.sinc.default)  # never asked: never unpickled
        kernels_for(CORE).persisted.save()  # written back as it was read
        _fresh_process_state()
        with pf.eager.on(CORE) as third:
            again = torch.sinc(x)
        assert torch.equal(again, only_first)
        assert third.stats.cache_hits[aten.sinc.default] == 1 and len(third.stats.cache_misses) == 0
    finally:
        _fresh_process_state()


def test_a_changed_file_is_a_new_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PREDISPATCH_FUNC_CACHE", str(tmp_path))
    names = sorted(CORE.names())
    assert persisted_kernels.fingerprint(names) != persisted_kernels.fingerprint(names[1:])
    source = tmp_path / "lowering.py"
    source.write_text("A = 1\n")
    original = persisted_kernels._code
    files = original()  # the code the kernels depend on: eager/, opsets/ (nested too), _torch_compat/
    assert any(os.sep + os.path.join("opsets", "decompositions") + os.sep in f for f in files)
    assert any(f.endswith(os.path.join("eager", "keyed_kernels.py")) for f in files)
    # and the C++ replay's sources, whose keys the file keeps with each program
    assert any(f.endswith(os.path.join("eager", "native", "graph_replay.cpp")) for f in files)
    assert all(f.endswith((".py", ".cpp", ".h")) for f in files) and len(set(files)) == len(files)
    monkeypatch.setattr(persisted_kernels, "_code", lambda: [*original(), source])
    before = persisted_kernels.fingerprint(names)
    assert before != _fingerprint_of(names, original)  # a file more
    source.write_text("A = 2\n")  # the same size, written later
    os.utime(source, ns=(source.stat().st_atime_ns, source.stat().st_mtime_ns + 1000))
    assert persisted_kernels.fingerprint(names) != before
    source.write_text("A = 22\n")
    assert persisted_kernels.fingerprint(names) != before


def _fingerprint_of(names, code):
    monkeypatch = pytest.MonkeyPatch()
    with monkeypatch.context() as patch:
        patch.setattr(persisted_kernels, "_code", code)
        return persisted_kernels.fingerprint(names)


def test_compiled_replay_calls_what_the_graph_calls():
    # the replay is the graph written out with each op at its C++ entry point: same ops, same order
    with pf.eager.on(CORE):
        torch.rot90(torch.randn(3, 4), 1)
    for kernel in _graphs_of(aten.rot90.default).values():
        graph_ops = [line.split(" = ")[1].split("(")[0] for line in kernel.code.splitlines()[1:-1]]
        assert len(graph_ops) == len(kernel.ops)
        assert all(op in CORE for op in kernel.ops)


def test_a_process_writing_keeps_what_another_wrote_since_it_read(tmp_path, monkeypatch):
    x = torch.randn(3, 4)
    _fresh_process_state()
    try:
        monkeypatch.setenv("PREDISPATCH_FUNC_CACHE", "")  # the first "process" finds nothing at its start
        with pf.eager.on(CORE):
            torch.rot90(x, 1)
        first = kernels_for(CORE)
        monkeypatch.setenv("PREDISPATCH_FUNC_CACHE", str(tmp_path))
        _fresh_process_state()  # meanwhile a second one traces logit and writes
        with pf.eager.on(CORE):
            torch.logit(x.sigmoid(), 1e-3)
        kernels_for(CORE).persisted.save()
        first.persisted.save()  # the first writes at its exit, after the second
        _fresh_process_state()
        with pf.eager.on(CORE) as later:
            torch.rot90(x, 1)
            torch.logit(x.sigmoid(), 1e-3)
        assert later.stats.cache_hits[aten.rot90.default] == 1 and later.stats.cache_hits[aten.logit.default] == 1
        assert len(later.stats.cache_misses) == 0, later.stats.cache_misses
    finally:
        _fresh_process_state()


def test_a_process_reads_the_kernels_of_the_ops_it_calls_and_no_others(tmp_path, monkeypatch):
    # the file indexes each op's kernels after a header (format 4 on): a process reads the header,
    # then one op's kernels when it first calls the op. Reading the whole file cost 6.6 ms of a
    # small model's first step once it held 4.5 MB (every model and op_db run with the target).
    # One op's kernels spoiled on disk cost only their traces: the others are read as written.
    monkeypatch.setenv("PREDISPATCH_FUNC_CACHE", str(tmp_path))
    x = torch.randn(3, 4)
    _fresh_process_state()
    try:
        with pf.eager.on(CORE):
            torch.rot90(x, 1)
            torch.logit(x.sigmoid(), 1e-3)
        kernels_for(CORE).persisted.save()
        path = kernels_for(CORE).persisted.path()
        opened = persisted_kernels._OpenFile.of(path)  # noqa: SLF001
        assert opened is not None and opened.header["format"] == persisted_kernels._FORMAT  # noqa: SLF001
        offset, length = opened.header["index"]["kernels"]["aten::logit"]
        base = path.stat().st_size - sum(n for _, n in (w for t in opened.header["index"].values() for w in t.values()))
        opened.close()
        with open(path, "r+b") as f:  # logit's kernels overwritten with garbage
            f.seek(base + offset)
            f.write(b"\xff" * length)
        _fresh_process_state()
        with pf.eager.on(CORE) as later:
            rotated = torch.rot90(x, 1)
            assert kernels_for(CORE).persisted.holds("kernels", aten.logit.default)  # not read yet
            logit = torch.logit(x.sigmoid(), 1e-3)
        assert later.stats.cache_hits[aten.rot90.default] == 1
        assert later.stats.cache_misses[aten.logit.default] == 1  # traced again
        assert torch.equal(rotated, torch.rot90(x, 1))
        torch.testing.assert_close(logit, torch.logit(x.sigmoid(), 1e-3))
    finally:
        _fresh_process_state()


def test_a_file_of_an_earlier_format_is_left_for_the_new_one(tmp_path, monkeypatch):
    monkeypatch.setenv("PREDISPATCH_FUNC_CACHE", str(tmp_path))
    _fresh_process_state()
    try:
        path = kernels_for(CORE).persisted.path()
        path.write_bytes(pickle.dumps({"format": 3, "registrations": [("aten::rot90", "DECOMPOSE")]}))
        _fresh_process_state()
        with pf.eager.on(CORE) as session:
            torch.rot90(torch.randn(3, 4), 1)
        assert session.stats.cache_misses[aten.rot90.default] == 1
        assert kernels_for(CORE).persisted.registrations != [("aten::rot90", "DECOMPOSE")]
        kernels_for(CORE).persisted.save()
        opened = persisted_kernels._OpenFile.of(path)  # noqa: SLF001
        assert opened is not None and "aten::rot90" in opened.header["index"]["kernels"]
        opened.close()
    finally:
        _fresh_process_state()


def test_a_tensor_passed_by_keyword_is_an_input_of_the_trace_and_the_call_is_replayed():
    # sdpa's CPU kernel takes attn_mask keyword-only: it was left a real tensor inside the fake
    # trace, which then failed, and every call ran the decomposition uncached
    q, k, v = (torch.randn(2, 3, 7, 6) for _ in range(3))  # a signature no other test traces
    masks = [torch.randn(1, 3, 7, 7), torch.randn(1, 3, 7, 7)]
    # (called directly: sdpa itself takes its math path in a session, attention_path.py)
    flash = aten._scaled_dot_product_flash_attention_for_cpu.default
    with pf.eager.on(CORE) as session:
        got = [flash(q, k, v, attn_mask=mask)[0] for mask in masks]
    assert session.stats.cache_misses[flash] <= 1 and session.stats.cache_hits[flash] >= 1
    assert flash not in session.stats.uncached
    for mask, value in zip(masks, got):  # the second mask's values, not the traced first one's
        torch.testing.assert_close(value, flash(q, k, v, attn_mask=mask)[0])


def test_traces_above_autograd_are_replayed_by_the_next_process(tmp_path, monkeypatch):
    # weight_norm is decomposed above autograd (eager/above_autograd.py); its trace was kept in
    # memory only, so every new process built torch's whole decomposition table to trace it again
    monkeypatch.setenv("PREDISPATCH_FUNC_CACHE", str(tmp_path))
    conv = torch.nn.utils.parametrizations.weight_norm(torch.nn.Conv1d(3, 4, 3))
    x = torch.randn(2, 3, 7)

    def step():
        conv.zero_grad()
        conv(x).square().sum().backward()
        return [p.grad.clone() for p in conv.parameters()]
    expected = step()
    _fresh_process_state()
    try:
        with pf.eager.on(CORE) as first:
            traced = step()
        assert aten._weight_norm_interface.default in first.stats.above_autograd
        kernels_for(CORE).persisted.save()
        _fresh_process_state()
        with pf.eager.on(CORE) as second:
            replayed = step()
        assert kernels_for(CORE).lifted_graphs[id(aten._weight_norm_interface.default)]
        assert kernels_for(CORE).lowering._core is None  # nothing traced: torch's table never built
        assert len(second.stats.cache_misses) == 0, second.stats.cache_misses
        for value, again, want in zip(traced, replayed, expected):
            assert torch.equal(value, again)
            torch.testing.assert_close(value, want)
    finally:
        _fresh_process_state()


def test_the_kernel_files_of_a_torch_build_are_bounded_to_those_used_last(tmp_path, monkeypatch):
    """A file per target and code version: each upgrade and each new target starts one. Writing
    keeps the 64 used last (read counts as use), the one just written among them, and at most
    256 MB; another torch build's files are left alone."""
    monkeypatch.setenv("PREDISPATCH_FUNC_CACHE", str(tmp_path))
    build = persisted_kernels.torch_build()
    old = [tmp_path / f"eager-kernels-{build}-py311-{i:08x}.pkl" for i in range(70)]
    for i, path in enumerate(old):
        path.write_bytes(b"")
        os.utime(path, ns=(10**18 + i * 10**9, 10**18 + i * 10**9))  # the 70th written last
    other = tmp_path / "eager-kernels-0.0.0-unknown-py311-00000000.pkl"
    other.write_bytes(b"")
    os.utime(other, ns=(10**18, 10**18))
    x = torch.randn(3, 4)
    _fresh_process_state()
    try:
        with pf.eager.on(CORE):
            torch.rot90(x, 1)
        persisted = kernels_for(CORE).persisted
        written = persisted.path()
        persisted_kernels.touch(old[0])  # the oldest, read by a process now
        persisted.save()
        left = set(tmp_path.glob(f"eager-kernels-{build}-*.pkl"))
        assert len(left) == 64 and written in left and old[0] in left
        assert left - {written, old[0]} == set(old[-62:])  # the 62 written last besides
        assert other.exists()
        # the bytes bound: two big files of the newest, and the rest goes
        for path in old[-2:]:
            with open(path, "wb") as f:
                f.truncate(130 << 20)  # sparse: no disk used
        for i, path in enumerate(old[-2:]):
            os.utime(path, ns=(2 * 10**18 + i, 2 * 10**18 + i))
        monkeypatch.setattr(persisted, "_saved_count", -1)  # something new to write
        persisted.save()
        left = set(tmp_path.glob(f"eager-kernels-{build}-*.pkl"))
        assert left == {written, old[-1]}  # the newest big one fits beside it; the next does not, nor any older
    finally:
        _fresh_process_state()
