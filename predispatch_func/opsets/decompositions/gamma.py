"""The gamma family: ``lgamma``, ``digamma``, ``polygamma``, Hurwitz's ``zeta`` and the
regularized incomplete gamma functions ``igamma``, ``igammac``.

Written from the textbook formulas (Abramowitz and Stegun 6.1, 6.3, 6.4, 23.2):
for an argument below ``_SHIFT`` the recurrence ``f(z) = f(z + 1) - ...`` moves
it up by ``_SHIFT``, where Stirling's (or de Moivre's) asymptotic series with
Bernoulli numbers is accurate to a few ulps; negative arguments go through the
reflection formulas, with ``sin`` and ``tan`` of ``pi * x`` taken on ``x``
reduced by whole periods so large arguments keep their digits. ``zeta`` is
Euler-Maclaurin summation, as eager's kernel: a direct sum up to an argument
above 9, then the integral and the Bernoulli tail. A non-positive ``q`` (which
``polygamma`` of a negative argument meets) needs as many direct terms as
``9 - q``: that count is read from the data, so ``zeta`` and ``polygamma`` of
order 2 and more are ``reads_data`` decompositions. Edge values (poles,
infinities, signed zeros) follow the CPU kernels. Narrower floating dtypes are
computed in float64 and rounded once.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

aten = torch.ops.aten

_SHIFT = 10
# B_2, B_4, ..., B_24
_BERNOULLI = (1 / 6, -1 / 30, 1 / 42, -1 / 30, 5 / 66, -691 / 2730, 7 / 6, -3617 / 510, 43867 / 798,
              -174611 / 330, 854513 / 138, -236364091 / 2730)
_INF, _NAN = float("inf"), float("nan")


def in_float64(function: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``function`` evaluated in float64 on floating (integers: default float) tensors, the
    result in the inputs' promoted dtype."""
    def evaluated(*tensors: Any) -> torch.Tensor:
        dtype = torch.result_type(*tensors) if len(tensors) > 1 else tensors[0].dtype
        if not dtype.is_floating_point:
            dtype = torch.get_default_dtype()
        wide = [torch.as_tensor(t).to(torch.float64) for t in tensors]
        return function(*torch.broadcast_tensors(*wide)).to(dtype)
    evaluated.__name__ = evaluated.__qualname__ = function.__name__
    evaluated.__doc__ = function.__doc__
    return evaluated


def _full(like: torch.Tensor, value: float) -> torch.Tensor:
    return torch.full_like(like, value)


def _reduced(x: torch.Tensor, period: float) -> torch.Tensor:
    """``x`` less the nearest multiple of ``period`` (exact in floating point)."""
    return x - period * torch.round(x / period)


def _shifted(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(``z`` raised by ``_SHIFT`` where it is below it, where it was raised)."""
    small = z < _SHIFT
    return torch.where(small, z + _SHIFT, z), small


def _lgamma_positive(z: torch.Tensor) -> torch.Tensor:
    """z > 0 finite: Stirling's series at ``w >= _SHIFT``, less ``log(z (z+1) ... (z+_SHIFT-1))``."""
    w, small = _shifted(z)
    inverse_square = 1 / (w * w)
    series = torch.zeros_like(w)
    for k in range(len(_BERNOULLI) - 4, 0, -1):  # B_2k / (2k (2k-1) w^(2k-1)), by Horner in 1/w²
        series = (series + _BERNOULLI[k - 1] / (2 * k * (2 * k - 1))) * (inverse_square if k > 1 else 1)
    series = series / w
    stirling = (w - 0.5) * torch.log(w) - w + 0.5 * math.log(2 * math.pi) + series
    base = torch.where(small, z, torch.ones_like(z))
    product = base
    for i in range(1, _SHIFT):
        product = product * (base + i)
    return stirling - torch.where(small, torch.log(product), torch.zeros_like(z))


@in_float64
def lgamma(x: torch.Tensor) -> torch.Tensor:
    """Reflection below 0: ``log(pi / |sin(pi x)|) - lgamma(1 - x)``; inf at the poles and both infinities."""
    positive = (x > 0) & torch.isfinite(x)
    direct = _lgamma_positive(torch.where(positive, x, torch.ones_like(x)))
    negative = torch.where(positive | ~torch.isfinite(x), -_full(x, 0.5), x)
    pole = negative == torch.round(negative)
    sine = torch.sin(math.pi * _reduced(torch.where(pole, -_full(x, 0.5), negative), 2.0)).abs()
    reflected = math.log(math.pi) - torch.log(sine) - _lgamma_positive(1 - negative)
    result = torch.where(positive, direct, torch.where(pole, _full(x, _INF), reflected))
    return torch.where(torch.isinf(x), _full(x, _INF), torch.where(torch.isnan(x), x, result))


def _digamma_positive(z: torch.Tensor) -> torch.Tensor:
    """z > 0 finite: the asymptotic series at ``w >= _SHIFT``, less ``sum 1 / (z + i)``."""
    w, small = _shifted(z)
    inverse_square = 1 / (w * w)
    series = torch.zeros_like(w)
    for k in range(len(_BERNOULLI) - 4, 0, -1):  # B_2k / (2k w^2k)
        series = (series + _BERNOULLI[k - 1] / (2 * k)) * inverse_square
    asymptotic = torch.log(w) - 0.5 / w - series
    base = torch.where(small, z, torch.ones_like(z))
    steps = sum(1 / (base + i) for i in range(_SHIFT))
    return asymptotic - torch.where(small, steps, torch.zeros_like(z))


@in_float64
def digamma(x: torch.Tensor) -> torch.Tensor:
    """Reflection below 0: ``digamma(1 - x) - pi / tan(pi x)``; NaN at negative integers and
    -inf, ``-inf`` at +0 and ``+inf`` at -0, as the kernel."""
    positive = (x > 0) & torch.isfinite(x)
    direct = _digamma_positive(torch.where(positive, x, torch.ones_like(x)))
    negative = torch.where(positive | ~torch.isfinite(x) | (x == 0), -_full(x, 0.5), x)
    tangent = torch.tan(math.pi * _reduced(negative, 1.0))
    reflected = _digamma_positive(1 - negative) - math.pi / torch.where(tangent == 0, torch.ones_like(x), tangent)
    result = torch.where(positive, direct, torch.where(negative == torch.round(negative), _full(x, _NAN), reflected))
    at_zero = torch.where(torch.reciprocal(x) < 0, _full(x, _INF), _full(x, -_INF))
    result = torch.where(x == 0, at_zero, result)
    return torch.where(x == _INF, x, torch.where(torch.isnan(x) | (x == -_INF), _full(x, _NAN), result))


def _trigamma_positive(z: torch.Tensor) -> torch.Tensor:
    w, small = _shifted(z)
    inverse_square = 1 / (w * w)
    series = torch.zeros_like(w)
    for k in range(len(_BERNOULLI) - 4, 0, -1):  # B_2k / w^(2k+1)
        series = (series + _BERNOULLI[k - 1]) * inverse_square
    asymptotic = (1 + 0.5 / w + series) / w
    base = torch.where(small, z, torch.ones_like(z))
    steps = sum(1 / ((base + i) * (base + i)) for i in range(_SHIFT))
    return asymptotic + torch.where(small, steps, torch.zeros_like(z))


def trigamma(x: torch.Tensor) -> torch.Tensor:
    """Below 1/2 by reflection, ``pi² / sin²(pi x) - trigamma(1 - x)``, with ``sin(pi x)`` taken
    in ``x``'s dtype and not reduced, as the kernel (a negative integer gives a large finite
    value, not inf); the derivative is the exact reflection's."""
    dtype = x.dtype if x.is_floating_point() else torch.get_default_dtype()
    # the C library's sin of the product rounded to x's dtype (torch's own float32 sin loses the
    # digits of a tiny result near a multiple of pi)
    narrow_sine = torch.sin((math.pi * x.to(dtype)).to(torch.float64)).to(dtype).to(torch.float64)
    x = x.to(torch.float64)
    low = x < 0.5
    direct = _trigamma_positive(torch.where(low, 1 - x, x))
    sine = torch.sin(math.pi * torch.where(low, x, torch.zeros_like(x) + 0.25))
    exact = torch.where(low, (math.pi * math.pi) / (sine * sine) - direct, direct)
    as_kernel = torch.where(low, (math.pi * math.pi) / (narrow_sine * narrow_sine) - direct, direct)
    finite = torch.isfinite(exact)
    zero_with_exact_derivative = torch.where(finite, exact - exact.detach(), torch.zeros_like(exact))
    return (as_kernel.detach() + zero_with_exact_derivative).to(dtype)


def _zeta_terms(x: torch.Tensor, q: torch.Tensor) -> int:
    """How many direct terms the widest element needs: until ``q + terms > 9``, at least 9
    (eager's loop); read from the data."""
    lowest = float(q.min()) if q.numel() else 1.0
    return max(9, math.floor(9 - lowest) + 1) if lowest <= 0 else 9


@in_float64
def zeta(x: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Hurwitz's zeta ``sum_k (q + k)^-x``: the direct terms, then at ``a = q + terms`` the
    Euler-Maclaurin tail ``a^(1-x) / (x-1) + a^-x / 2 + sum_j B_2j/(2j)! x(x+1)...(x+2j-2) a^(-x-2j+1)``."""
    pole = (q <= 0) & (q == torch.floor(q))
    undefined = (q <= 0) & ~pole & (x != torch.floor(x))
    valid = (x > 1) & ~pole & ~undefined & torch.isfinite(q) & ~torch.isnan(x)
    s = torch.where(valid, x, _full(x, 2.0))
    base = torch.where(valid, q, torch.ones_like(q))
    terms = _zeta_terms(s, base)
    count = torch.where(base > 0, _full(base, 9), torch.maximum(_full(base, 9), torch.floor(9 - base) + 1))
    total = torch.zeros_like(s)
    for k in range(terms):
        total = total + torch.where(count > k, torch.pow(base + k, -s), torch.zeros_like(s))
    a = base + count
    power = torch.pow(a, -s)
    tail = power * a / (s - 1) + 0.5 * power
    rising, falling_power = torch.ones_like(s), power / a
    for j, bernoulli in enumerate(_BERNOULLI, start=1):
        rising = rising * (s + (2 * j - 2)) if j == 1 else rising * (s + (2 * j - 3)) * (s + (2 * j - 2))
        tail = tail + bernoulli / math.factorial(2 * j) * rising * falling_power
        falling_power = falling_power / (a * a)
    result = torch.where(valid, total + tail, _full(x, _NAN))
    result = torch.where(pole | ((x == 1) & ~torch.isnan(q)), _full(x, _INF), result)
    # x = inf: the kernel's sum stops at its first negligible term: 1 at q = 1, inf once a term
    # (q + k with |q + k| < 1) is infinite, NaN where every term is 0 (its tail is inf * 0)
    at_infinity = torch.where(q == 1, torch.ones_like(q), torch.where(q < 1, _full(q, _INF), _full(q, _NAN)))
    return torch.where(x == _INF, at_infinity, result)


zeta.reads_data = True  # type: ignore[attr-defined]


def polygamma(n: int, x: torch.Tensor) -> torch.Tensor:
    """``n = 0``: digamma; ``n = 1``: trigamma; else ``(-1)^(n+1) n! zeta(n + 1, x)``, as the kernel."""
    if n == 0:
        return digamma(x)
    if n == 1:
        return trigamma(x)
    order = torch.full_like(x, n + 1, dtype=torch.float64 if not x.is_floating_point() else x.dtype)
    return (1.0 if n % 2 else -1.0) * float(math.factorial(n)) * zeta(order, x)


polygamma.reads_data = True  # type: ignore[attr-defined]


_INCOMPLETE_LARGEST = 1e7  # beyond, the prefactor's rounding (a log x - x - lgamma(a)) nears 1e-7: declined


def _incomplete_gamma(a: torch.Tensor, x: torch.Tensor, upper: bool) -> Any:
    """Regularized incomplete gamma (A&S 6.5.29, 6.5.31): below ``x = a + 1`` the series
    ``P = x^a e^-x / Gamma(a+1) sum_n x^n / ((a+1)...(a+n))``, above it Legendre's continued
    fraction for ``Q``, the other by complement (each then at least 1/2 or so: no digits lost);
    enough terms for the widest argument (about ``9 sqrt(a)`` near ``x = a``, read from the
    data). Arguments past 1e7 are declined (the kernel's uniform expansion would be needed to
    match). Edges as the kernel: NaN for a negative argument, 0 and 1 at ``x = 0`` and inf."""
    valid = (a > 0) & (x > 0) & torch.isfinite(a) & torch.isfinite(x)
    shape_a = torch.where(valid, a, torch.ones_like(a))
    point = torch.where(valid, x, torch.ones_like(x))
    largest = float(torch.maximum(shape_a, point).max()) if a.numel() else 1.0
    if largest > _INCOMPLETE_LARGEST:
        return NotImplemented
    terms = int(40 + 10 * math.sqrt(largest))
    log_prefactor = shape_a * torch.log(point) - point
    term, total = torch.ones_like(shape_a), torch.ones_like(shape_a)
    for k in range(1, terms):
        term = term * point / (shape_a + k)
        total = total + term
    lower_series = torch.exp(log_prefactor - lgamma(shape_a + 1)) * total
    fraction = point + (2 * terms + 1) - shape_a
    for k in range(terms, 0, -1):
        fraction = point + (2 * k - 1) - shape_a - k * (k - shape_a) / fraction
    upper_fraction = torch.exp(log_prefactor - lgamma(shape_a)) / fraction
    by_series = point < shape_a + 1
    lower = torch.where(by_series, lower_series, 1 - upper_fraction)
    result = torch.where(by_series, 1 - lower_series, upper_fraction) if upper else lower
    full, empty = (torch.zeros_like(a), torch.ones_like(a)) if upper else (torch.ones_like(a), torch.zeros_like(a))
    result = torch.where(valid, result, _full(a, _NAN))
    result = torch.where((a == 0) & (x > 0), full, result)  # x inf included
    result = torch.where((x == 0) & (a > 0), empty, result)
    result = torch.where((x == _INF) & (a > 0) & torch.isfinite(a), full, result)
    result = torch.where((a == _INF) & (x >= 0) & torch.isfinite(x), empty, result)
    return torch.where((a < 0) | (x < 0) | torch.isnan(a) | torch.isnan(x), _full(a, _NAN), result)


def _incomplete(upper: bool) -> Callable:
    def incomplete(a: torch.Tensor, x: torch.Tensor) -> Any:
        dtype = torch.result_type(a, x)
        if not dtype.is_floating_point:
            dtype = torch.get_default_dtype()
        wide_a, wide_x = torch.broadcast_tensors(a.to(torch.float64), x.to(torch.float64))
        result = _incomplete_gamma(wide_a, wide_x, upper)
        return result if result is NotImplemented else result.to(dtype)
    incomplete.__name__ = "igammac" if upper else "igamma"
    incomplete.reads_data = True  # type: ignore[attr-defined]
    return incomplete


DECOMPOSITIONS: dict[Any, Callable] = {
    aten.igamma.default: _incomplete(upper=False),
    aten.igammac.default: _incomplete(upper=True),
    aten.lgamma.default: lgamma,
    aten.digamma.default: digamma,
    aten.polygamma.default: polygamma,
    aten.special_zeta.default: zeta,
}
