"""The session's C++ kernel for in-place ops through their twin (``native_registrations.NativeTwin``):
``add_`` (the autograd engine's gradient accumulation, the optimizers' updates) was a trip into
Python on every call, 334 a step of rwkv. It serves the calls whose outcome it does not decide;
the Python kernel the rest, as before (pinned here: a lossy cast refused with eager's text, a
broadcast that does not fit ``self``, a sparse argument)."""

from __future__ import annotations

import shutil

import pytest
import torch

import predispatch_func as pf
from predispatch_func import _torch_compat as tc
from predispatch_func.eager import native_kernels, session_key

CORE = pf.OpSet.core_aten()
aten = torch.ops.aten
NATIVE = tc.PYTHON_FALLBACK_ON_SPARE_KEY and native_kernels.module() is not None
needs_native = pytest.mark.skipif(not NATIVE, reason=f"no C++ kernels here: {native_kernels.why_unavailable}"
                                  if tc.PYTHON_FALLBACK_ON_SPARE_KEY else "torch 2.11/2.12 register Python kernels up front")


def test_the_kernels_build_where_a_compiler_is():
    if not tc.PYTHON_FALLBACK_ON_SPARE_KEY:
        pytest.skip("torch 2.11/2.12: the session registers its Python kernels up front, the C++ ones not at all")
    if not (shutil.which("c++") and shutil.which("ninja")):
        pytest.skip("no C++ compiler or ninja on this machine: the Python kernels serve")
    assert native_kernels.module() is not None, native_kernels.why_unavailable


def _native_for(op):
    registered = session_key._registered  # noqa: SLF001 (the test reads what the session registered)
    return next(n for n in registered.native if n.op is op)


@needs_native
def test_add_in_place_is_served_in_cpp_and_counted():
    a, b = torch.randn(4, 5), torch.randn(4, 5)
    expected = a.clone().add_(b, alpha=0.5).add_(b)
    with pf.eager.on(CORE) as session:
        torch.zeros(1).add_(torch.ones(1))  # the op's first meeting registers its kernel (run in Python)
        native = _native_for(aten.add_.Tensor)
        native._native.take_served(native._index)  # noqa: SLF001
        calls = dict(session.stats.decomposed.items()).get(aten.add_.Tensor, 0)
        got = a.clone()
        got.add_(b, alpha=0.5)
        got.add_(b)
        assert native._native.take_served(native._index) == 2  # noqa: SLF001 (both served in C++)
        got.add_(b)  # counted into the session's stats when it exits
    torch.testing.assert_close(got, expected.add_(b), rtol=0, atol=0)
    assert session.stats.decomposed[aten.add_.Tensor] == calls + 1


@needs_native
def test_what_the_cpp_kernel_leaves_goes_to_the_python_kernel():
    _what_eager_refuses_in_place()


def test_an_in_place_op_that_would_grow_self_is_refused_as_eager_refuses_it():
    """The Python kernel resized ``self`` to the broadcast shape and wrote it (``ones(3).add_(ones(2, 3))``
    returned a 2x3 tensor where eager raises): right for an ``out=`` tensor, not for ``self``."""
    with pf.eager.on(CORE, observe=True):  # the Python path alone
        for call in (lambda: torch.ones(3).add_(torch.ones(2, 3)), lambda: torch.ones(3).lerp_(torch.ones(2, 3), 0.5),
                     lambda: torch.ones(1, 3).masked_fill_(torch.ones(2, 3, dtype=torch.bool), 1.0)):
            with pytest.raises(RuntimeError, match=r"output with shape \[1?,? ?3\] doesn't match the broadcast shape"):
                call()


def _what_eager_refuses_in_place():
    sparse = torch.eye(2).to_sparse()  # made outside: to_sparse is not Core ATen
    with pf.eager.on(CORE):
        # a lossy cast: eager's text
        with pytest.raises(RuntimeError, match="result type Float can't be cast to the desired output type Int"):
            torch.ones(3, dtype=torch.int32).add_(0.8)
        # a broadcast that does not fit self: eager's error, not a silent resize
        with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
            torch.ones(3).add_(torch.ones(2, 3))
        # a sparse argument: lowered by the Python kernel or named unreachable there, never written here
        dense = torch.ones(2, 2)
        try:
            out = dense.add_(sparse)
        except pf.UnsupportedError:
            out = None
    if out is not None:
        torch.testing.assert_close(out, torch.ones(2, 2) + torch.eye(2))


@needs_native
def test_training_with_the_cpp_kernel_equals_eager():
    def steps(model):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        for _ in range(3):
            optimizer.zero_grad()
            x = torch.linspace(-1, 1, 12).reshape(3, 4)
            (model(x).pow(2).sum() + model(x * 2).sum()).backward()  # two uses: gradients accumulate
            optimizer.step()
        return [p.detach() for p in model.parameters()]

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    reference = [p.detach().clone() for p in model.parameters()]
    expected = steps(model)
    with torch.no_grad():
        for p, r in zip(model.parameters(), reference):
            p.copy_(r)
    with pf.eager.on(CORE) as session:
        got = steps(model)
    torch.testing.assert_close(got, expected)
    assert session.stats.decomposed[aten.add_.Tensor] > 0


OVERLAPS = {  # a write whose input shares part of the destination: eager refuses, by its rule
    "shifted": (lambda: (lambda x: x[1:].add_(x[:-1]))(torch.arange(5.0)), "refused"),
    "shifted, mul_": (lambda: (lambda x: x[1:].mul_(x[:-1]))(torch.arange(1.0, 6.0)), "refused"),
    "transposed": (lambda: (lambda x: x.add_(x.t()))(torch.arange(9.0).reshape(3, 3)), "refused"),
    "out= shifted": (lambda: (lambda x: torch.add(x[:-1], 1, out=x[1:]))(torch.arange(5.0)), "refused"),
    "itself": (lambda: (lambda x: x.add_(x))(torch.arange(5.0)), [0.0, 2.0, 4.0, 6.0, 8.0]),
    "a strided read": (lambda: (lambda x: x[:3].add_(x[::2]))(torch.arange(6.0)), None),  # eager's "too hard"
}


@pytest.mark.parametrize("observe", [False, True], ids=["keyed", "observed"])
@pytest.mark.parametrize("name", list(OVERLAPS))
def test_a_write_from_a_partly_shared_input_is_refused_as_eager_refuses_it(name, observe):
    """The twin computed from the old values and ``copy_`` wrote them: ``x[1:].add_(x[:-1])`` gave
    [1, 3, 5, 7] where eager raises. Both kernels (C++ and Python) and the general path check it."""
    call, outcome = OVERLAPS[name]
    with pf.eager.on(CORE, observe=observe):
        for _warm in range(2):  # the first meeting (Python), then the registered kernel
            if outcome == "refused":
                with pytest.raises(RuntimeError, match="some elements of the input tensor and the written-to tensor"):
                    call()
            else:
                expected = call()  # eager's, with the session's kernels: compared below
    if outcome not in ("refused", None):
        assert expected.tolist() == outcome
    if outcome is None:
        with pf.eager.on(CORE, observe=observe):
            got = call()
        assert torch.equal(got, call())


@needs_native
def test_an_in_place_op_whose_twin_is_lowered_is_served_in_cpp_too():
    # silu_'s twin silu is outside Core ATen: the C++ kernel calls it through the key (its own
    # kernel lowers it) and writes the result; masked_fill_ likewise
    x = torch.linspace(-3, 3, 12).reshape(3, 4)
    mask = x > 1
    expected = (torch.nn.functional.silu(x.clone(), inplace=True), x.clone().masked_fill_(mask, 0.5))
    with pf.eager.on(CORE) as session:
        for _ in range(2):  # the first meeting runs in Python
            got = (torch.nn.functional.silu(x.clone(), inplace=True), x.clone().masked_fill_(mask, 0.5))
    torch.testing.assert_close(got, expected)
    # (both calls where an earlier test of the process met the op: its kernel is registered already)
    assert session.stats.served_in_cpp[aten.silu_.default] >= 1
    assert session.stats.served_in_cpp[aten.masked_fill_.Scalar] >= 1
    assert session.stats.decomposed[aten.silu.default] == 2  # the twin, lowered each time


def test_a_lock_left_by_a_dead_build_is_cleared_and_a_live_one_kept(tmp_path):
    import os
    import time

    lock = tmp_path / "lock"
    lock.write_text("")
    native_kernels.clear_stale_lock(tmp_path)
    assert lock.exists()  # a build may be running
    old = time.time() - native_kernels.STALE_AFTER_S - 5
    os.utime(lock, (old, old))
    native_kernels.clear_stale_lock(tmp_path)
    assert not lock.exists()
    native_kernels.clear_stale_lock(tmp_path)  # nothing there: nothing to do


OUT_CALLS = {  # out= of the result's dtype and shape: served in C++
    "mm.out (mixtral's grouped matmuls)": (aten.mm.out, lambda a, b, out: torch.mm(a, b, out=out), (3, 5)),
    "add.out": (aten.add.out, lambda a, b, out: torch.add(a[:, :3], b.t()[:3, :3], alpha=2, out=out), (3, 3)),
    "cat.out (a list of tensors)": (aten.cat.out, lambda a, b, out: torch.cat([a, b.t()], 0, out=out), (8, 4)),
    "sum.IntList_out": (aten.sum.IntList_out, lambda a, b, out: torch.sum(a, 1, out=out), (3,)),
    "out= a transposed view": (aten.mm.out, lambda a, b, out: torch.mm(a, b, out=out.t()), (5, 3)),
}


@needs_native
@pytest.mark.parametrize("name", list(OUT_CALLS))
def test_an_out_op_whose_twin_takes_its_arguments_is_served_in_cpp(name):
    op, call, shape = OUT_CALLS[name]
    a, b = torch.randn(3, 4), torch.randn(4, 5)
    expected = call(a, b, torch.empty(shape))
    with pf.eager.on(CORE) as session:
        for _ in range(3):  # the first meeting runs in Python
            out = torch.empty(shape)
            got = call(a, b, out)
    assert session.stats.served_in_cpp[op] >= 2  # (3 where an earlier test met the op)
    assert torch.equal(got, expected) or name.startswith("mm") or name.startswith("out="), (got, expected)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)  # (mm: the same CPU kernel, maybe another blocking)


OUT_LEFT_TO_PYTHON = {  # what eager decides about out= itself: the Python kernel, eager's outcome
    "a resize": (lambda: torch.mm(torch.ones(2, 3), torch.ones(3, 2), out=torch.empty(0)), [[3.0, 3.0], [3.0, 3.0]]),
    "an out of another dtype eager refuses": (
        lambda: torch.mm(torch.ones(2, 3), torch.ones(3, 2), out=torch.empty(2, 2, dtype=torch.float64)),
        "Expected out tensor to have dtype"),
    "a sum computed in out's dtype": (
        lambda: torch.sum(torch.tensor([[1, 2], [3, 4]], dtype=torch.int32), 1, out=torch.empty(2, dtype=torch.int32)),
        [3, 7]),
    "a sum of floats into int64, computed in int64": (
        lambda: torch.sum(torch.tensor([[0.6, 1.6], [2.3, 0.3]]), 1, out=torch.empty(2, dtype=torch.int64)), [1, 2]),
}


@pytest.mark.parametrize("name", list(OUT_LEFT_TO_PYTHON))
def test_what_eager_decides_about_out_goes_to_the_python_kernel(name):
    call, outcome = OUT_LEFT_TO_PYTHON[name]
    if isinstance(outcome, str):  # eager's own words
        with pytest.raises(RuntimeError, match=outcome):
            call()
    else:
        assert call().tolist() == outcome
    with pf.eager.on(CORE):
        for _ in range(3):  # the first meeting, then the C++ kernel's calls
            if isinstance(outcome, str):
                with pytest.raises(RuntimeError, match=outcome):
                    call()
            else:
                assert call().tolist() == outcome


def _key_off_calls():
    """Ops of Core ATen a session runs with its key off (their inner calls are a backend's
    business): composite CPU kernels, and CPU kernels calling ops outside Core ATen."""
    x = torch.randn(3, 5, requires_grad=True)
    image = torch.randn(2, 3, 6, 6, requires_grad=True)
    conv = torch.nn.Conv2d(3, 4, 3)
    norm = torch.nn.LayerNorm(5)
    return {
        "aten::sum.dim_IntList": lambda: x.sum(1),
        "aten::mean.dim": lambda: x.mean(0),
        "aten::native_layer_norm_backward": lambda: torch.autograd.grad(norm(x).pow(2).sum(), (x, norm.weight)),
        "aten::sort": lambda: x.detach().sort(1),
        "aten::convolution": lambda: torch.autograd.grad(conv(image).sum(), (image, conv.weight, conv.bias)),
    }


@needs_native
@pytest.mark.parametrize("name", list(_key_off_calls()))
def test_target_ops_whose_inner_calls_are_the_backends_run_with_the_key_off_in_cpp(name):
    # what session_key._as_backend_kernel did in Python, one trip a call (some thirty a bert step)
    torch.manual_seed(0)
    call = _key_off_calls()[name]
    expected = call()
    with pf.eager.on(CORE) as session:
        call()  # the first meeting registers the C++ kernel (this call runs in Python)
        native = next(n for n in session_key._registered.native if n.op.name() == name)  # noqa: SLF001
        assert type(native).__name__ == "NativeKeyOff"
        native._native.take_served(native._index)  # noqa: SLF001
        got = call()
        assert native._native.take_served(native._index) >= 1  # noqa: SLF001 (served in C++)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    inner = {"aten::sum.dim_IntList": "fill_", "aten::mean.dim": "div_", "aten::sort": "sort.stable"}.get(name)
    if inner:  # the op's inner calls stayed the backend's: the session never saw them
        assert not [op for op in session.stats.decomposed if inner in str(op)]


@needs_native
def test_an_empty_out_tensor_is_resized_and_written_in_cpp():
    # pow.Scalar's CPU kernel calls pow.Tensor_Tensor_out with the number wrapped as an int64 0-dim
    # tensor and an empty out: each call went to the Python kernel, and there to the meta check
    # (1.2 ms a call; funnel's step 1.5x plain eager)
    x = torch.linspace(0, 1, 8)
    expected = 10000 ** x
    op = aten.pow.Tensor_Tensor_out
    with pf.eager.on(CORE):
        10000 ** x  # the first meeting registers the C++ kernel (unless an earlier test did)
        native = _native_for(op)
        native._native.take_served(native._index)  # noqa: SLF001
        got = [10000 ** x for _ in range(3)]
        assert native._native.take_served(native._index) == 3  # noqa: SLF001 (all three in C++)
    for value in got:
        torch.testing.assert_close(value, expected, rtol=0, atol=0)


@needs_native
def test_an_empty_out_tensor_is_left_to_python_where_resize_is_not_the_sessions():
    """The C++ kernel resizes an empty out= tensor with the floor's ``resize_``: where the session's
    floor lacks it, the call is the Python kernel's, which names the op unreachable, on every call
    (the C++ kernel serves the first call too, once the key's fallback is C++)."""
    name = "aten.resize_.default"
    for _ in range(2):
        with pytest.raises(pf.eager.EagerUnreachableError, match="resize_"):
            with pf.eager.on(CORE.difference(name), floor=pf.eager.RUNTIME_FLOOR.difference(name)):
                torch.mul(torch.ones(2), 2, out=torch.empty(0))
    session_key.release()  # the next test's target is the default floor's


@needs_native
def test_ops_without_a_kernel_of_ours_are_met_in_cpp(monkeypatch):
    """The key's fallback is C++ (``native/first_meeting.cpp``): an op first reaching the key that
    has no kernel of ours (the target's, a view torch's composite kernel makes) gets its fallthrough
    there, no trip into Python (about 100 us each, 4 ms of a small model's cold step); an op with
    a kernel of ours is met by Python, and the call then reaches that kernel."""
    session_key.release()  # nothing met yet, as in a fresh process
    met_in_python: list[str] = []
    meet = session_key._Registered.meet  # noqa: SLF001

    def recording(self, op):
        met_in_python.append(op.name())
        return meet(self, op)

    monkeypatch.setattr(session_key._Registered, "meet", recording)  # noqa: SLF001
    x = torch.rand(4, 4) * 0.8 + 0.1
    with pf.eager.on(CORE) as session:
        y = torch.mm(x, x).add(1).t().contiguous()
        z = torch.logit(x, 1e-3)
    torch.testing.assert_close(y, torch.mm(x, x).add(1).t().contiguous(), rtol=0, atol=0)
    torch.testing.assert_close(z, torch.logit(x, 1e-3))
    assert session.stats.decomposed[aten.logit.default] == 1
    kind = session_key.kind_of
    assert kind("aten::mm") == kind("aten::add.Tensor") == kind("aten::t") == session_key.THROUGH
    assert kind("aten::logit") == "DECOMPOSE" and "aten::logit" in met_in_python
    assert not {"aten::mm", "aten::add.Tensor", "aten::t", "aten::clone"} & set(met_in_python)
    assert {"aten::mm", "aten::add.Tensor", "aten::logit"} <= set(session_key.registered_ops())
    session_key.release()
    assert not session_key.registered_ops()  # the fallthroughs given in C++ went with the rest


@pytest.mark.parametrize("observe", [False, True], ids=["keyed", "observed"])
def test_addbmm_in_place_grows_self_as_eager_does(observe):
    """``addbmm_`` is eager's out= form writing into ``self``, which it resizes: a ``self`` of one
    element takes the result's shape (the session refused it as a broadcast that does not fit;
    found by rerunning scripts/eager_coverage.py). Every other in-place op refuses it as before."""
    b1, b2 = torch.randn(5, 5, 5, dtype=torch.float64), torch.randn(5, 5, 10, dtype=torch.float64)
    for self_shape in [(1,), (), (5, 10)]:
        start = torch.linspace(-1, 1, int(torch.Size(self_shape).numel()), dtype=torch.float64).reshape(self_shape)
        expected = start.clone().addbmm_(b1, b2, beta=0.6, alpha=0.2)
        with pf.eager.on(CORE, observe=observe):
            got = start.clone()
            returned = got.addbmm_(b1, b2, beta=0.6, alpha=0.2)
        assert returned is got and got.shape == expected.shape
        torch.testing.assert_close(got, expected)
    with pf.eager.on(CORE, observe=observe):
        with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
            torch.ones(3).add_(torch.ones(2, 3))
