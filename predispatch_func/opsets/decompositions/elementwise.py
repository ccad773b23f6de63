"""Pointwise ops torch decomposes only into prims, restated in Core ATen.

Where a result depends on a floating-point detail (the sign of zero, infinities,
the kernel's order of scaling for ``round(decimals=)``), the restatement follows
the CPU kernel. One thing Core ATen cannot see: the sign bit of a NaN (no op of
the set reinterprets a float's bits), so ``copysign`` and ``signbit`` read a NaN
as positive; ``docs/eager.md`` lists it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

aten = torch.ops.aten


def _floating(x: torch.Tensor) -> torch.Tensor:
    """Integer and bool inputs of a float-valued op promote to the default float dtype."""
    return x if x.is_floating_point() or x.is_complex() else x.to(torch.get_default_dtype())


def exp2(x: torch.Tensor) -> torch.Tensor:
    return torch.pow(2.0, _floating(x))


def _fmax_fmin(pick: Callable) -> Callable:
    def decomposition(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """A NaN loses to a number; two NaNs give NaN."""
        both = pick(a, b)
        return torch.where(torch.isnan(b), torch.where(torch.isnan(a), both, a.to(both.dtype)),
                           torch.where(torch.isnan(a), b.to(both.dtype), both))
    return decomposition


def hypot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``sqrt(a² + b²)`` scaled by the larger magnitude, so it neither overflows nor underflows
    where the result is finite; an infinite side gives inf even against a NaN, as C's hypot."""
    a, b = torch.broadcast_tensors(a, b)
    dtype = torch.result_type(a, b)
    a, b = a.abs().to(dtype), b.abs().to(dtype)
    large, small = torch.maximum(a, b), torch.minimum(a, b)
    ratio = small / torch.where(large == 0, torch.ones_like(large), large)
    result = large * torch.sqrt(1 + ratio * ratio)
    return torch.where(torch.isinf(a) | torch.isinf(b), torch.full_like(result, math.inf), result)


def signbit(x: torch.Tensor) -> torch.Tensor:
    """Negative, or a negative zero (whose reciprocal is -inf); a NaN reads as positive."""
    if x.dtype == torch.bool:
        return torch.zeros_like(x, dtype=torch.bool)
    if not x.is_floating_point():
        return x < 0
    return (x < 0) | ((x == 0) & (torch.reciprocal(x) < 0))


def copysign(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    magnitude = _floating(a).abs()
    if not b.is_floating_point():
        b = b.to(magnitude.dtype)
    dtype = torch.result_type(magnitude, b)
    magnitude = magnitude.to(dtype)
    result = torch.where(signbit(b), -magnitude, magnitude)
    if b.requires_grad:  # eager's gradient in b is a zero tensor, not None (an optimizer skips None)
        result = torch.where(torch.zeros((), dtype=torch.bool, device=result.device), b, result)
    return result


def angle(x: torch.Tensor) -> torch.Tensor:
    """Real input: pi below zero, 0 otherwise, NaN kept (complex input: atan2 of its parts,
    which needs ``view_as_real``, itself outside Core ATen)."""
    if x.is_complex():
        return NotImplemented
    x = _floating(x)
    return torch.where(torch.isnan(x), x, torch.where(x < 0, torch.full_like(x, math.pi), torch.zeros_like(x)))


def round_decimals(x: torch.Tensor, *, decimals: int) -> torch.Tensor:
    """As the CPU kernel: scale by 10^|decimals| (dividing for negative decimals), round half
    to even, scale back."""
    if decimals >= 0:
        scale = 10.0 ** decimals
        return torch.round(x * scale) / scale
    scale = 10.0 ** -decimals
    return torch.round(x / scale) * scale


def _bits(dtype: torch.dtype) -> int:
    return torch.iinfo(dtype).bits


def bitwise_left_shift(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a * 2**b``, wrapping as the shift does (the product is taken in the dtype, modulo
    2^bits); a shift by a negative amount or by the width or more gives 0, as the kernel."""
    dtype = torch.result_type(a, b)
    a, b = a.to(dtype), b.to(dtype)
    out_of_range = (b < 0) | (b >= _bits(dtype))
    power = torch.pow(torch.full_like(b, 2), torch.where(out_of_range, torch.zeros_like(b), b))
    return torch.where(out_of_range, torch.zeros_like(a * power), a * power)


def bitwise_right_shift(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Arithmetic shift: floor division by ``2**b``; shifting by the width less one or more
    (or a negative amount) leaves only the sign: -1 for a negative signed value, else 0."""
    dtype = torch.result_type(a, b)
    a, b = a.to(dtype), b.to(dtype)
    signed = dtype.is_signed
    widest = _bits(dtype) - (1 if signed else 0)  # 2**widest does not fit a signed dtype
    out_of_range = (b < 0) | (b >= widest)
    power = torch.pow(torch.full_like(b, 2), torch.where(out_of_range, torch.zeros_like(b), b))
    shifted = torch.div(a, power, rounding_mode="floor")
    sign_only = torch.where(a < 0, torch.full_like(a, -1), torch.zeros_like(a)) if signed else torch.zeros_like(a)
    return torch.where(out_of_range, sign_only, shifted)


def _euclid_steps(dtype: torch.dtype) -> int:
    """Euclid's algorithm needs fewer steps than the Fibonacci number exceeding the largest
    value has index (93 for 64 bits): a fixed count, so a trace holds for every value."""
    largest, steps, (low, high) = torch.iinfo(dtype).max, 0, (1, 1)
    while high <= largest:
        low, high, steps = high, low + high, steps + 1
    return steps + 2


def gcd(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    dtype = torch.result_type(a, b)
    a, b = torch.broadcast_tensors(a.to(dtype).abs(), b.to(dtype).abs())
    for _ in range(_euclid_steps(dtype)):
        done = a == 0
        remainder = torch.remainder(b, torch.where(done, torch.ones_like(a), a))
        a, b = torch.where(done, a, remainder), torch.where(done, b, a)
    return b


def lcm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    dtype = torch.result_type(a, b)
    a, b = a.to(dtype), b.to(dtype)
    divisor = gcd(a, b)
    zero = divisor == 0
    quotient = torch.div(a, torch.where(zero, torch.ones_like(divisor), divisor), rounding_mode="trunc")
    return torch.where(zero, torch.zeros_like(divisor), (quotient * b).abs())


def frexp(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x = mantissa * 2**exponent`` with ``0.5 <= |mantissa| < 1``: the exponent from ``log2``,
    corrected by one where its rounding crossed a power of two, the scaling by ``2**-exponent``
    done in two halves so neither overflows (a subnormal ``x`` needs ``2**1074``); zero, an
    infinity and NaN keep their value with exponent 0, as C's frexp."""
    finite = torch.isfinite(x) & (x != 0)
    magnitude = torch.where(finite, x.abs(), torch.ones_like(x))
    exponent = torch.floor(torch.log2(magnitude)) + 1
    mantissa = _scaled_by_power_of_two(magnitude, -exponent)
    exponent = exponent + (mantissa >= 1).to(x.dtype) - (mantissa < 0.5).to(x.dtype)
    mantissa = _scaled_by_power_of_two(torch.where(finite, x, torch.ones_like(x)), -exponent)
    return (torch.where(finite, mantissa, x),
            torch.where(finite, exponent, torch.zeros_like(exponent)).to(torch.int32))


def _scaled_by_power_of_two(x: torch.Tensor, power: torch.Tensor) -> torch.Tensor:
    """``x * 2**power``, exact, for powers whose halves are representable."""
    half = torch.trunc(power / 2)
    return x * torch.pow(2.0, half).to(x.dtype) * torch.pow(2.0, power - half).to(x.dtype)


def nextafter(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The neighbour of ``a`` towards ``b``: ``a`` plus or minus one unit in its last place, taken
    from ``frexp``'s exponent (half as much stepping down from a power of two, never less than the
    smallest subnormal); ``b`` where they are equal, NaN with a NaN, the largest finite number
    stepping in from an infinity, a zero signed as ``a`` stepping down to it, as C's nextafter."""
    dtype = torch.result_type(a, b)
    a, b = torch.broadcast_tensors(a.to(dtype), b.to(dtype))
    info = torch.finfo(dtype)
    stored_bits = round(-math.log2(info.eps))  # of the mantissa, the leading one aside
    digits = stored_bits + 1
    finite = torch.isfinite(a) & (a != 0)
    mantissa, exponent = frexp(torch.where(finite, a, torch.ones_like(a)))
    exponent = exponent.to(dtype)
    away = (b > a) == (a > 0)  # the step grows |a|
    down_from_power = ~away & (mantissa.abs() == 0.5)
    step = torch.pow(2.0, exponent - digits - down_from_power.to(dtype)).to(dtype)
    smallest = info.smallest_normal * 2.0 ** -stored_bits
    step = torch.clamp(step, min=smallest)
    result = torch.where(b > a, a + step, a - step)
    result = torch.where(result == 0, a * 0, result)  # keeps a's sign of zero
    from_zero = torch.where(b > a, torch.full_like(a, smallest), torch.full_like(a, -smallest))
    result = torch.where(a == 0, from_zero, result)
    result = torch.where(torch.isinf(a), torch.where(a > 0, torch.full_like(a, info.max), torch.full_like(a, -info.max)),
                         result)
    result = torch.where(a == b, b, result)
    return torch.where(torch.isnan(a) | torch.isnan(b), torch.full_like(a, math.nan), result)


def hardshrink_backward(grad_out: torch.Tensor, x: torch.Tensor, lambd: Any) -> torch.Tensor:
    """The gradient passes where the input is outside [-lambd, lambd] (both shrinks alike)."""
    inside = (x >= -lambd) & (x <= lambd)
    return torch.where(inside, torch.zeros_like(grad_out), grad_out)


DECOMPOSITIONS: dict[Any, Callable] = {
    aten.exp2.default: exp2,
    aten.fmax.default: _fmax_fmin(torch.maximum),
    aten.fmin.default: _fmax_fmin(torch.minimum),
    aten.hypot.default: hypot,
    aten.signbit.default: signbit,
    aten.copysign.Tensor: copysign,
    aten.angle.default: angle,
    aten.round.decimals: round_decimals,
    aten.bitwise_left_shift.Tensor: bitwise_left_shift,
    aten.bitwise_right_shift.Tensor: bitwise_right_shift,
    aten.gcd.default: gcd,
    aten.lcm.default: lcm,
    aten.frexp.Tensor: frexp,
    aten.nextafter.default: nextafter,
    aten.hardshrink_backward.default: hardshrink_backward,
    aten.softshrink_backward.default: hardshrink_backward,
}


def addbmm(x: torch.Tensor, batch1: torch.Tensor, batch2: torch.Tensor, *, beta: Any = 1,
           alpha: Any = 1) -> torch.Tensor:
    """``beta * x + alpha * sum_i batch1[i] @ batch2[i]``, accumulated batch by batch as the
    kernel's ``addmm_`` loop does (so float32 rounds alike); ``beta == 0`` ignores ``x``."""
    shape = torch.broadcast_shapes(x.shape, (batch1.size(1), batch2.size(2)))
    out = torch.zeros(shape, dtype=x.dtype, device=x.device) if beta == 0 else \
        (x if beta == 1 else x * beta).expand(shape)
    for i in range(batch1.size(0)):
        product = batch1[i] @ batch2[i]
        out = out + (product if alpha == 1 else product * alpha)
    return out.clone() if batch1.size(0) == 0 else out


DECOMPOSITIONS[aten.addbmm.default] = addbmm


def var_mean(x: torch.Tensor, dim: Any = None, *, correction: Any = None, keepdim: bool = False) -> tuple:
    """Variance and mean; torch decomposes it only into prims. Batch norm's decompositions call
    it: eager's CPU ``native_batch_norm`` (``pf.eager``) and CUDA's training batch norm
    (``_batch_norm_with_update``), so every ``target=core_aten`` training program of a model
    with ``BatchNorm`` on the GPU was refused."""
    every = dim if dim is not None else list(range(x.dim()))
    return aten.var.correction(x, dim, correction=correction, keepdim=keepdim), aten.mean.dim(x, every, keepdim)


DECOMPOSITIONS[aten.var_mean.correction] = var_mean



_BATCH_NORM_WITH_UPDATE = getattr(aten, "_batch_norm_with_update_functional", None)


def batch_norm_with_update_functional(input: torch.Tensor, weight: Any, bias: Any, running_mean: torch.Tensor,
                                      running_var: torch.Tensor, momentum: float, eps: float) -> Any:
    """CUDA's training batch norm as the Core ATen op CPU's already is,
    ``_native_batch_norm_legit_functional``: one node, as on CPU, whose running statistics
    autograd leaves alone (eager's kernel writes them outside autograd). torch's decomposition
    spelled the statistics out from the batch mean and variance, which require grad, so a
    joint program under ``core_aten`` wrote buffers carrying the step's history (refused: every
    training BatchNorm on the GPU) and the GPU's program differed from the CPU's. The fourth
    result, cuDNN's reserve space, is read only by cuDNN's backward, which autograd (above
    this program) never calls: empty, as for ``cudnn_batch_norm`` (trace/composite_policy.py)."""
    from ... import _torch_compat as tc

    core = tc.resolve_overload("aten", "_native_batch_norm_legit_functional.default")
    if core is None:
        return NotImplemented
    out, mean, rstd, new_mean, new_var = core(
        input, weight, bias, running_mean, running_var, True, momentum, eps)
    return out, mean, rstd, input.new_empty((0,), dtype=torch.uint8), new_mean, new_var


if _BATCH_NORM_WITH_UPDATE is not None:
    DECOMPOSITIONS[_BATCH_NORM_WITH_UPDATE.default] = batch_norm_with_update_functional
