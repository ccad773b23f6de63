"""The session's own CPU loops for ``where`` and the comparisons (``native/mask_kernels.cpp``).

CPU eager's kernels for both are not vectorised where an operand or the result is bool (on 75k
floats ``where`` 120-300 us, ``le`` 45 us, ``mul`` 12 us), and a decomposed activation's backward
is made of them. The graph replay takes ours for the calls they fit. Neither op rounds, so ours
must equal torch's bit for bit, with torch's dtype, shape and strides: held here over every dtype
they take, special values and numbers, and the calls they must leave to torch's kernel.
"""

from __future__ import annotations

import itertools

import pytest
import torch

import predispatch_func as pf
from predispatch_func import _torch_compat as tc
from predispatch_func.eager import native_kernels

NATIVE = tc.PYTHON_FALLBACK_ON_SPARE_KEY and native_kernels.module() is not None
pytestmark = pytest.mark.skipif(not NATIVE, reason=f"no C++ kernels here: {native_kernels.why_unavailable}"
                                if tc.PYTHON_FALLBACK_ON_SPARE_KEY else "torch 2.11/2.12: no C++ replay")
aten = torch.ops.aten
COMPARISONS = ("eq", "ne", "lt", "le", "gt", "ge")
SPECIAL = [0.0, -0.0, 1.0, -1.0, float("inf"), float("-inf"), float("nan"), 0.1, 1e-45, 3e38, 16777217.0, -2.5]
NUMBERS = [0, 0.0, -0.0, 1, -3, 0.1, float("inf"), float("-inf"), float("nan"), 1e40, -1e40, 1e-45, 16777217,
           2**31, 2**63 - 1, True, False]


def ours(name: str, overload: str, *arguments):
    return native_kernels.module().mask_kernel_result(f"aten::{name}", overload, arguments)


def torchs(name: str, overload: str, *arguments):
    return getattr(getattr(aten, name), overload)(*arguments)


def assert_same(got, expected):
    assert got is not None, "our kernel left a call it fits to torch's"
    assert (got.dtype, got.shape, got.stride()) == (expected.dtype, expected.shape, expected.stride())
    if got.is_floating_point():  # bit for bit: -0.0 is not 0.0, nan is nan
        bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[got.element_size()]
        assert torch.equal(got.view(bits), expected.view(bits))
    else:
        assert torch.equal(got, expected)


def values(dtype: torch.dtype, n: int = 64) -> torch.Tensor:
    generator = torch.Generator().manual_seed(n)
    if dtype.is_floating_point:
        base = torch.randn(n, generator=generator, dtype=torch.float64) * 3
        base[: len(SPECIAL)] = torch.tensor(SPECIAL[:n], dtype=torch.float64)
        return base.to(dtype)
    if dtype == torch.bool:
        return torch.rand(n, generator=generator) > 0.5
    return torch.randint(-5, 5, (n,), generator=generator).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.int32])
@pytest.mark.parametrize("name", COMPARISONS)
def test_a_comparison_with_a_number_is_torchs_bit_for_bit(name, dtype):
    x = values(dtype)
    for number in NUMBERS:
        expected = torchs(name, "Scalar", x, number)
        got = ours(name, "Scalar", x, number)
        fits = dtype.is_floating_point or (isinstance(number, (bool, int)) and
                                            (dtype == torch.int64 or -2**31 <= number < 2**31))
        if fits:
            assert_same(got, expected)
        else:  # a float with an integral tensor, an int32 out of range: torch's kernel
            assert got is None, (name, dtype, number)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.int32])
@pytest.mark.parametrize("name", COMPARISONS)
def test_a_comparison_of_two_tensors_is_torchs_bit_for_bit(name, dtype):
    x, y = values(dtype, 64), values(dtype, 65)[:64]
    y[::3] = x[::3]  # equal values too
    shape = (2, 4, 8)
    x, y = x.reshape(shape), y.reshape(shape)
    for a, b in [(x, y), (x, y[0, 0, 3]), (x[1, 2, 5], y), (x[0, 0, 6], x)]:
        assert_same(ours(name, "Tensor", a, b), torchs(name, "Tensor", a, b))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
                                   torch.int32, torch.int8, torch.uint8, torch.bool])
def test_where_is_torchs_bit_for_bit(dtype):
    shape = (3, 5, 7)
    cond = values(torch.bool, 105).reshape(shape)
    a, b = values(dtype, 105).reshape(shape), values(dtype, 106)[:105].reshape(shape)
    zero = torch.zeros((), dtype=dtype)
    for c, x, y in itertools.product([cond, cond[1, 2, 3]], [a, zero], [b, zero]):
        if c.dim() == x.dim() == y.dim() == 0:
            continue
        assert_same(ours("where", "self", c, x, y), torchs("where", "self", c, x, y))


def test_where_reads_any_nonzero_byte_as_true():
    cond = torch.tensor([0, 1, 2, 255], dtype=torch.uint8).view(torch.bool)
    a, b = torch.ones(4), torch.zeros(4)
    assert_same(ours("where", "self", cond, a, b), torchs("where", "self", cond, a, b))


def test_large_tensors_split_over_threads_give_the_same_result():
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        x = torch.randn(2, 48, 28, 28)
        x.view(-1)[::7] = 0.0
        grad = torch.randn_like(x)
        mask = ours("le", "Scalar", x, 0)
        assert_same(mask, x <= 0)
        assert_same(ours("where", "self", mask, torch.zeros(()), grad), torch.where(mask, torch.zeros(()), grad))
        empty = torch.empty(0, 3)
        assert_same(ours("lt", "Scalar", empty, 1.0), empty < 1.0)
    finally:
        torch.set_num_threads(threads)


def test_what_the_loops_do_not_fit_is_left_to_torchs_kernel():
    x, y = torch.randn(4, 6), torch.randn(4, 6)
    cond = x > 0
    left = [
        ("le", "Tensor", x.t(), y.t()),  # not contiguous
        ("le", "Tensor", x, y[:1]),  # a broadcast of more than one element
        ("le", "Tensor", x, y.double()),  # two dtypes: torch promotes
        ("le", "Scalar", x.half(), 0.5),  # a dtype without a loop here
        ("le", "Scalar", x.long(), 0.5),  # a float number with an integral tensor
        ("le", "Tensor", x[0, 0], y[0, 0]),  # no tensor with a shape
        ("eq", "Scalar", torch.randn(3, dtype=torch.complex64), 1),
        ("le", "Scalar", x.to("meta"), 0),
        ("where", "self", cond, x, y.double()),  # torch promotes
        ("where", "self", cond, x.t(), y.t()),
        ("where", "self", cond.int(), x, y),  # a condition that is not bool
        ("where", "self", cond, torch.randn(4, 6, dtype=torch.complex64), torch.randn(4, 6, dtype=torch.complex64)),
        ("where", "self", cond[0, 0], x[0, 0], y[0, 0]),
    ]
    for name, overload, *arguments in left:
        assert ours(name, overload, *arguments) is None, (name, overload, [a.shape for a in arguments])

    def batched(v):  # a functorch wrapper: its memory is not its own
        assert ours("le", "Scalar", v, 0) is None
        assert ours("where", "self", v > 0, v, torch.zeros(())) is None
        return v

    torch.func.vmap(batched)(x)


def test_the_replay_serves_an_activations_backward_with_them_and_matches_eager():
    """ReLU's, ReLU6's and hardswish's backward are comparisons and a ``where`` in Core ATen:
    a session's step takes our loops (counted) and its gradients are eager's bit for bit."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16), torch.nn.ReLU6(),
                                torch.nn.Linear(16, 16), torch.nn.Hardswish(), torch.nn.Linear(16, 1))
    x = torch.randn(32, 8)

    def grads():
        model.zero_grad(set_to_none=True)
        model(x).pow(2).mean().backward()
        return [p.grad.clone() for p in model.parameters()]

    expected = grads()
    module = native_kernels.module()
    with pf.eager.on(pf.OpSet.core_aten()):
        grads()  # first calls: traced, their programs handed to the replay
        module.take_mask_kernel_calls()
        got = grads()
    assert module.take_mask_kernel_calls() >= 3
    for g, e in zip(got, expected):
        assert_same(g, e)


def test_with_the_loops_off_the_replay_runs_torchs_kernels_with_the_same_result():
    module = native_kernels.module()
    x = torch.randn(64, 8)
    expected = torch.where(x <= 0, torch.zeros(()), x)
    module.set_mask_kernels_enabled(False)
    try:
        module.take_mask_kernel_calls()
        assert ours("le", "Scalar", x, 0) is None
        assert module.take_mask_kernel_calls() == 0
    finally:
        module.set_mask_kernels_enabled(True)
    assert_same(ours("where", "self", x <= 0, torch.zeros(()), x), expected)
    assert module.take_mask_kernel_calls() == 1
