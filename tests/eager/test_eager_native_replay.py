"""The session's C++ replay of decomposed ops (``native_registrations.NativeReplay``,
``native/graph_replay.cpp``): a cached per-signature kernel run without a trip into Python.

Each call it serves must give what the Python replay gives, bit for bit (the same ops with the
same arguments, in the same order): every check here runs the call served in C++, then the same
call with the C++ replays switched off (the Python replay), and compares."""

from __future__ import annotations

import os

import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db

import predispatch_func as pf
from predispatch_func import _torch_compat as tc
from predispatch_func.eager import native_kernels, native_registrations

CORE = pf.OpSet.core_aten()
aten = torch.ops.aten
NATIVE = tc.PYTHON_FALLBACK_ON_SPARE_KEY and native_kernels.module() is not None
pytestmark = pytest.mark.skipif(not NATIVE, reason=f"no C++ kernels here: {native_kernels.why_unavailable}"
                                if tc.PYTHON_FALLBACK_ON_SPARE_KEY else "torch 2.11/2.12 register Python kernels up front")


def _outputs(value):
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in _outputs(item)]
    return []


def _served_then_python(call, session):
    """(result served in C++, result of the Python replay) of ``call``, after the calls that
    trace it (or replay it from disk) and teach the C++ kernel its program (the first call of
    an op meets the session's key, the next one reaches the C++ kernel)."""
    with session:
        call()
        call()
        served = call()
        native_registrations.set_replay_enabled(False)
        try:
            python = call()
        finally:
            native_registrations.set_replay_enabled(True)
    return served, python


def _bits(t: torch.Tensor) -> torch.Tensor:
    """``t``'s bytes: equal bits, nan payloads and signed zeros included (a sparse tensor's values)."""
    if t.layout is not torch.strided:
        t = t.to_dense()
    return t.resolve_conj().resolve_neg().clone(memory_format=torch.contiguous_format).reshape(-1).view(torch.uint8)


def _assert_same_bits(served, python):
    for a, b in zip(_outputs(served), _outputs(python), strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()
        assert torch.equal(_bits(a), _bits(b)), (a, b)


torch.manual_seed(0)
_X, _G = torch.randn(6, 8), torch.randn(6, 8)
_IDX = torch.tensor([0, 3, 5])
CALLS = {
    "hardswish (numbers where the op takes tensors)": (aten.hardswish.default, lambda: torch.nn.functional.hardswish(_X)),
    "gelu_backward": (aten.gelu_backward.default, lambda: aten.gelu_backward(_G, _X)),
    "gelu_backward tanh (a string argument)": (aten.gelu_backward.default,
                                               lambda: aten.gelu_backward(_G, _X, approximate="tanh")),
    "gelu_backward, one tensor twice": (aten.gelu_backward.default, lambda: aten.gelu_backward(_X, _X)),
    "_softmax_backward_data (a dtype argument)": (aten._softmax_backward_data.default,
                                                  lambda: aten._softmax_backward_data(_G, _X.softmax(1), 1, torch.float32)),
    "select_backward (a list of ints)": (aten.select_backward.default, lambda: aten.select_backward(_G[0], [6, 8], 0, 3)),
    "var_mean (two returns)": (aten.var_mean.correction, lambda: torch.var_mean(_X, 1, correction=0)),
    "batch norm backward, one gradient asked (None outputs)": (
        aten.native_batch_norm_backward.default,
        lambda: aten.native_batch_norm_backward(_G.view(2, 3, 8), _X.view(2, 3, 8), None, None, None,
                                                _X.view(2, 3, 8).mean((0, 2)), _X.view(2, 3, 8).var((0, 2)).rsqrt(),
                                                True, 1e-5, [True, False, False])),
    "diag_embed (a list of tensors, factories)": (aten.diag_embed.default, lambda: torch.diag_embed(_X, offset=1)),
    "_unsafe_index (a list of tensors and None)": (aten._unsafe_index.Tensor, lambda: aten._unsafe_index(_X, [None, _IDX])),
    "take": (aten.take.default, lambda: torch.take(_X, _IDX)),
    "a transposed input": (aten.hardswish.default, lambda: torch.nn.functional.hardswish(_X.t())),
    "logit with eps (a float)": (aten.logit.default, lambda: torch.logit(_X.sigmoid(), 1e-3)),
    "logit with eps -0.0": (aten.logit.default, lambda: torch.logit(_X.sigmoid(), -0.0)),
}


@pytest.mark.parametrize("name", list(CALLS))
def test_a_decomposed_call_served_in_cpp_equals_the_python_replay(name):
    op, call = CALLS[name]
    session = pf.eager.on(CORE)
    served, python = _served_then_python(call, session)
    _assert_same_bits(served, python)
    assert session.stats.served_in_cpp[op] >= 1, dict(session.stats.served_in_cpp.items())
    for got, expected in zip(_outputs(served), _outputs(call()), strict=True):  # and eager's values
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_each_signature_gets_its_own_program():
    # rot90 branches on k, roll bakes shift % size in: a program learned for one is wrong for another
    x = torch.arange(12.0).reshape(3, 4)
    with pf.eager.on(CORE) as session:
        got = [torch.rot90(x, k) for k in (1, 2, 3, 4) * 3]
        rolled = [torch.roll(torch.arange(float(n)), 4) for n in (5, 3, 5, 3)]
    for k, value in zip((1, 2, 3, 4) * 3, got):
        assert torch.equal(value, torch.rot90(x, k)), k
    for n, value in zip((5, 3, 5, 3), rolled):
        assert torch.equal(value, torch.roll(torch.arange(float(n)), 4)), n
    assert session.stats.served_in_cpp[aten.rot90.default] >= 4


def test_a_call_has_one_python_signature_whichever_way_it_comes_in():
    # The first call of an op reaches its Python kernel through torch, which leaves out the trailing
    # arguments equal to their defaults; a later one through the C++ kernel's fallback, which gave
    # all of them: another signature, so a second trace of the same call (sdpa's dropout_p=0.0,
    # is_causal=False). Now the fallback leaves them out as torch does.
    n = 5 + os.getpid() % 97  # a shape the disk cache is unlikely to hold (if it does: hits, no miss)
    q, k, v = (torch.randn(1, 2, n, 4) for _ in range(3))
    masks = [torch.randn(1, 2, n, n) for _ in range(3)]
    flash = aten._scaled_dot_product_flash_attention_for_cpu.default
    with pf.eager.on(CORE) as session:
        for mask in masks:
            flash(q, k, v, attn_mask=mask)
    assert session.stats.cache_misses[flash] <= 1 and session.stats.cache_hits[flash] >= 2


def test_a_session_without_its_cache_replays_nothing_in_cpp():
    x = torch.randn(5, 5)
    with pf.eager.on(CORE):  # the program learned
        torch.nn.functional.hardswish(x)
        torch.nn.functional.hardswish(x)
    with pf.eager.on(CORE, use_cache=False) as session:
        got = torch.nn.functional.hardswish(x)
    assert aten.hardswish.default not in session.stats.served_in_cpp
    assert aten.hardswish.default not in session.stats.cache_hits
    torch.testing.assert_close(got, torch.nn.functional.hardswish(x))


def test_a_number_from_cpp_where_the_op_takes_a_tensor_goes_to_the_python_kernel():
    # xlogy.Scalar_Other calls xlogy.Tensor with a wrapped number: the Python kernel makes it a tensor
    # of the dtype eager computes in; the C++ replay cannot key it, so it leaves the call there
    x = torch.rand(4, 4, dtype=torch.float64) + 0.5
    with pf.eager.on(CORE) as session:
        got = [torch.xlogy(x, 2.5) for _ in range(3)]
    assert aten.xlogy.Tensor not in session.stats.served_in_cpp
    for value in got:
        torch.testing.assert_close(value, torch.xlogy(x, 2.5), rtol=0, atol=0)


def _train_steps(native: bool):
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16),
                                torch.nn.Hardswish(), torch.nn.Linear(16, 4), torch.nn.LogSoftmax(-1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = torch.randn(10, 8), torch.randint(0, 4, (10,))
    session = pf.eager.on(CORE)
    with session:
        native_registrations.set_replay_enabled(native)
        try:
            for _ in range(3):
                optimizer.zero_grad()
                torch.nn.functional.nll_loss(model(x), y).backward()  # backward: autograd's threads
                optimizer.step()
        finally:
            native_registrations.set_replay_enabled(True)
    return [p.detach().clone() for p in model.parameters()], session.stats


def test_training_steps_with_replays_in_cpp_equal_the_python_replays():
    served_params, stats = _train_steps(native=True)
    python_params, python_stats = _train_steps(native=False)
    assert sum(n for _, n in stats.served_in_cpp.items()) > sum(n for _, n in python_stats.served_in_cpp.items())
    for a, b in zip(served_params, python_params, strict=True):
        assert torch.equal(a, b)


def _op_db_cases(names: set[str] | None):
    for info in op_db:
        if names is not None and info.name not in names:
            continue
        if torch.float32 not in info.supported_dtypes("cpu") or info.variant_test_name.startswith("rand"):
            continue
        yield pytest.param(info, id=f"{info.name}.{info.variant_test_name}" if info.variant_test_name else info.name)


_QUICK = {"nn.functional.gelu", "nn.functional.hardsigmoid", "nn.functional.elu", "logsumexp", "std", "var_mean",
          "nn.functional.softplus", "addcmul", "lerp", "rot90", "roll", "diag_embed", "nn.functional.glu",
          "nn.functional.pad", "hstack", "trace", "nn.functional.smooth_l1_loss", "nn.functional.mse_loss",
          "nn.functional.binary_cross_entropy", "nn.functional.huber_loss", "nan_to_num", "masked_fill"}


# their results are memory never written: nothing to compare
_UNINITIALIZED = {"empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided", "empty_permuted"}


def _op_db_check(info):
    if info.name in _UNINITIALIZED:
        pytest.skip("uninitialized memory")
    if torch.Tag.nondeterministic_seeded in getattr(getattr(info.op, "_overloadpacket", None), "tags", ()):
        pytest.skip("random")
    grad = info.supports_autograd
    samples = list(info.sample_inputs("cpu", torch.float32, requires_grad=grad))[:4]
    for sample in samples:
        def call(sample=sample):
            """The op's outputs, then (where they carry gradients) the inputs' gradients of their
            sum: the backward's ops run on autograd's threads, through the same kernels."""
            out = info.op(sample.input, *sample.args, **sample.kwargs)
            leaves = [t for t in (sample.input, *sample.args) if isinstance(t, torch.Tensor) and t.requires_grad]
            carried = [o for o in _outputs(out) if o.requires_grad and o.is_floating_point()]
            if not (grad and leaves and carried):
                return [o.detach() for o in _outputs(out)]
            grads = torch.autograd.grad(sum(o.sum() for o in carried), leaves, allow_unused=True)
            return [o.detach() for o in _outputs(out)] + [g for g in grads if g is not None]
        try:
            expected, again = call(), call()
        except Exception:  # noqa: BLE001 (a sample eager refuses is not this test's)
            continue
        if not _outputs(expected) or not all(torch.equal(_bits(a), _bits(b)) for a, b in
                                             zip(_outputs(expected), _outputs(again), strict=True)):
            continue  # nothing to compare, or eager's own results differ between calls (``empty``'s memory)
        session = pf.eager.on(CORE)
        try:
            served, python = _served_then_python(call, session)
        except pf.eager.EagerUnreachableError:
            continue
        _assert_same_bits(served, python)


@pytest.mark.parametrize("info", list(_op_db_cases(_QUICK)))
def test_op_db_samples_served_in_cpp_equal_the_python_replay(info):
    _op_db_check(info)


@pytest.mark.deep
@pytest.mark.parametrize("info", list(_op_db_cases(None)))
def test_every_op_db_sample_served_in_cpp_equals_the_python_replay(info):
    _op_db_check(info)


def test_the_next_process_replays_in_cpp_from_its_first_call(tmp_path, monkeypatch):
    """A program the C++ replay learned is kept on disk with its key (``persisted_kernels``,
    format 5): the next process's replay starts with it, so even the op's first call makes no
    trip into Python (the first call of each decomposed op was a Python replay, plus reading its
    source back into a program: some 3 ms of a small transformer's first step)."""
    from predispatch_func.eager import mode, session_key
    from predispatch_func.eager.mode import kernels_for

    def fresh_process():
        session_key.release()
        mode._kernels_for.cache_clear()  # noqa: SLF001

    monkeypatch.setenv("PREDISPATCH_FUNC_CACHE", str(tmp_path))
    x = torch.randn(3, 4)
    call = lambda: torch.logit(x.sigmoid(), 1e-3)  # noqa: E731
    fresh_process()
    try:
        with pf.eager.on(CORE) as first:
            expected = call()  # traced in Python; the C++ replay learns its program on the next call
            call()
        assert first.stats.served_in_cpp[aten.logit.default] == 1
        kernels_for(CORE).persisted.save()
        fresh_process()
        with pf.eager.on(CORE) as second:
            got = call()
        assert second.stats.served_in_cpp[aten.logit.default] == 1  # its program came from disk
        assert len(second.stats.cache_misses) == 0
        assert torch.equal(got, expected)
    finally:
        fresh_process()
