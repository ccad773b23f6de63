"""Bessel functions: ``J0``, ``J1``, ``Y0``, ``Y1``, spherical ``j0``, and the modified ``I0``,
``I1``, ``K0``, ``K1`` with their exponentially scaled forms.

(``J`` and ``Y``: below.) The modified ones:
Written from Abramowitz and Stegun 9.6 and 9.7: ``I`` by its power series
(every term positive, so no digits cancel) up to ``_SERIES_TO``, and beyond by
the asymptotic expansion ``e^x / sqrt(2 pi x) sum_k (-1)^k a_k(nu) / x^k``;
``K`` by its series with harmonic numbers up to 2, by the trapezoidal rule on
``K_nu(x) = int_0^inf exp(-x cosh t) cosh(nu t) dt`` (an integrand that decays
doubly exponentially, for which the rule converges exponentially in the step)
up to ``_ASYMPTOTIC_FROM``, and by the asymptotic expansion
``sqrt(pi / 2x) e^-x sum_k a_k(nu) / x^k`` beyond. Edge values (the sign of
zero, infinities, NaN where the kernels give it) follow the CPU kernels.
Computed in float64, rounded once to narrower dtypes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from .gamma import in_float64

aten = torch.ops.aten

_SERIES_TO = 40.0
_SERIES_TERMS = 60  # at |x| = 40 the terms fall below an ulp of the sum after 53
_ASYMPTOTIC_TERMS = 24
_K_SERIES_TO = 2.0
_ASYMPTOTIC_FROM = 50.0
_STEP = 0.1
_NODES = 75  # t up to 7.5: x cosh t > 900 for x > 2, far past exp's underflow
_EULER_GAMMA = 0.5772156649015329


def _full(like: torch.Tensor, value: float) -> torch.Tensor:
    return torch.full_like(like, value)


def _asymptotic_sum(x: torch.Tensor, order: int, alternating: bool) -> torch.Tensor:
    """``sum_k (±1)^k a_k(nu) / x^k``, ``a_k = prod_{j<=k} (4 nu² - (2j - 1)²) / (k! 8^k)``."""
    total, term = torch.ones_like(x), torch.ones_like(x)
    mu = 4 * order * order
    for k in range(1, _ASYMPTOTIC_TERMS + 1):
        term = term * ((mu - (2 * k - 1) ** 2) / (k * 8)) / x
        total = total + (-term if alternating and k % 2 else term)
    return total


def _i_series(x: torch.Tensor, order: int) -> torch.Tensor:
    """``(x/2)^nu sum_k (x²/4)^k / (k! (k + nu)!)``, nu = 0 or 1."""
    quarter_square = x * x / 4
    term = x / 2 if order else torch.ones_like(x)
    total = term
    for k in range(1, _SERIES_TERMS + 1):
        term = term * quarter_square / (k * (k + order))
        total = total + term
    return total


def _scaled_i(x: torch.Tensor, order: int) -> torch.Tensor:
    """``exp(-|x|) I_nu(x)`` for finite x: the series near 0, the expansion far out; I1 is odd."""
    magnitude = x.abs()
    near = magnitude <= _SERIES_TO
    # I1's series in x itself (odd, the same values): through |x| its derivative at 0 was 0, not 1/2
    series = _i_series(torch.where(near, x if order else magnitude, torch.zeros_like(x)), order) * torch.exp(
        -torch.where(near, magnitude, torch.zeros_like(x)))
    far = torch.where(near, _full(x, _SERIES_TO * 2), magnitude)
    expansion = _asymptotic_sum(far, order, alternating=True) / torch.sqrt(2 * math.pi * far)
    if order:
        expansion = torch.where(x < 0, -expansion, expansion)
    return torch.where(near, series, expansion)


def _i(order: int, scaled: bool) -> Callable[[torch.Tensor], torch.Tensor]:
    def bessel(x: torch.Tensor) -> torch.Tensor:
        finite = torch.isfinite(x)
        safe = torch.where(finite, x, torch.zeros_like(x))
        value = _scaled_i(safe, order)
        if not scaled:  # exp(|x|) overflows past about 713 (I grows as e^x / sqrt(x)): inf, as the kernel
            value = value * torch.exp(safe.abs())
        infinite = (_full(x, 0.0) if scaled else _full(x, math.nan))
        if scaled and order:
            infinite = torch.where(x < 0, -infinite, infinite)
        return torch.where(finite, value, torch.where(torch.isnan(x), x, infinite))
    bessel.__name__ = f"{'scaled_' if scaled else ''}bessel_i{order}"
    bessel.__doc__ = f"I{order}{' times exp(-|x|)' if scaled else ''}; at ±inf as the kernel."
    return in_float64(bessel)


def _harmonic(k: int) -> float:
    return math.fsum(1 / j for j in range(1, k + 1))


def _k_series(x: torch.Tensor, order: int) -> torch.Tensor:
    """0 < x <= 2 (A&S 9.6.13 and 9.6.11): ``K0 = -(log(x/2) + gamma) I0 + sum (x²/4)^k / k!² H_k``,
    ``K1 = 1/x + log(x/2) I1 - (x/4) sum (x²/4)^k / (k! (k+1)!) (psi(k+1) + psi(k+2))``."""
    quarter_square = x * x / 4
    log_half = torch.log(x / 2)
    if order == 0:
        total, term = torch.zeros_like(x), torch.ones_like(x)
        for k in range(1, 30):
            term = term * quarter_square / (k * k)
            total = total + term * _harmonic(k)
        return -(log_half + _EULER_GAMMA) * _i_series(x, 0) + total
    total, term = torch.zeros_like(x), torch.ones_like(x)
    for k in range(0, 30):
        if k:
            term = term * quarter_square / (k * (k + 1))
        digammas = 2 * _harmonic(k) + 1 / (k + 1) - 2 * _EULER_GAMMA  # psi(k+1) + psi(k+2)
        total = total + term * digammas
    return 1 / x + log_half * _i_series(x, 1) - (x / 4) * total


def _scaled_k_integral(x: torch.Tensor, order: float) -> torch.Tensor:
    """``exp(x) K_nu(x) = int_0^inf exp(-x (cosh t - 1)) cosh(nu t) dt`` by the trapezoidal rule."""
    total = 0.5 * torch.ones_like(x)  # t = 0, half weight
    for j in range(1, _NODES + 1):
        t = j * _STEP
        total = total + torch.exp(-x * (math.cosh(t) - 1)) * (math.cosh(order * t) if order else 1.0)
    return total * _STEP


def _scaled_k(x: torch.Tensor, order: int) -> torch.Tensor:
    """``exp(x) K_nu(x)`` for finite x > 0."""
    low = x <= _K_SERIES_TO
    high = x > _ASYMPTOTIC_FROM
    small = torch.where(low, x, torch.ones_like(x))
    series = _k_series(small, order) * torch.exp(small)
    middle = _scaled_k_integral(torch.where(low | high, _full(x, _K_SERIES_TO * 2), x), order)
    large = torch.where(high, x, _full(x, _ASYMPTOTIC_FROM * 2))
    expansion = torch.sqrt(math.pi / (2 * large)) * _asymptotic_sum(large, order, alternating=False)
    return torch.where(low, series, torch.where(high, expansion, middle))


def _k(order: int, scaled: bool) -> Callable[[torch.Tensor], torch.Tensor]:
    def bessel(x: torch.Tensor) -> torch.Tensor:
        usable = (x > 0) & torch.isfinite(x)
        safe = torch.where(usable, x, torch.ones_like(x))
        value = _scaled_k(safe, order)
        if not scaled:
            value = value * torch.exp(-safe)
        result = torch.where(usable, value, torch.where(x == math.inf, torch.zeros_like(x), _full(x, math.nan)))
        return torch.where(x == 0, _full(x, math.inf), result)
    bessel.__name__ = f"{'scaled_' if scaled else ''}bessel_k{order}"
    bessel.__doc__ = f"K{order}{' times exp(x)' if scaled else ''}: inf at 0, NaN below, 0 at inf."
    return in_float64(bessel)


DECOMPOSITIONS: dict[Any, Callable] = {
    aten.i0.default: _i(0, scaled=False),
    aten.special_i0e.default: _i(0, scaled=True),
    aten.special_i1.default: _i(1, scaled=False),
    aten.special_i1e.default: _i(1, scaled=True),
    aten.special_modified_bessel_i0.default: _i(0, scaled=False),
    aten.special_modified_bessel_i1.default: _i(1, scaled=False),
    aten.special_modified_bessel_k0.default: _k(0, scaled=False),
    aten.special_modified_bessel_k1.default: _k(1, scaled=False),
    aten.special_scaled_modified_bessel_k0.default: _k(0, scaled=True),
    aten.special_scaled_modified_bessel_k1.default: _k(1, scaled=True),
}


# --- Bessel functions of the first and second kind, orders 0 and 1 ----------------------------------
#
# Near the origin (|x| <= _NEAR) from Bessel's integral ``J_m(x) = (1/pi) int_0^pi cos(m t - x sin t) dt``:
# the integrand is periodic and even, so the trapezoidal rule on ``_INTERVALS`` steps is exact for every
# Fourier mode below twice that, and ``J_0 ... J_M`` come out of one matrix product; ``Y`` from Neumann's
# series (A&S 9.1.88) ``Y0 = (2/pi)(log(x/2) + gamma) J0 - (4/pi) sum_k (-1)^k J_2k / k``, and ``Y1 = -Y0'``.
# Far out, Hankel's expansion (A&S 9.2.5-10) with the phase ``x - (2m + 1) pi / 4`` taken as the kernel's.

_NEAR = 25.0
_INTERVALS = 128
_NEUMANN_TERMS = 40


def _bessel_j_orders(x: torch.Tensor, orders: int) -> torch.Tensor:
    """``J_0(x) ... J_{orders-1}(x)`` along a new last dimension, for moderate |x|."""
    step = math.pi / _INTERVALS
    nodes = torch.arange(_INTERVALS + 1, dtype=x.dtype, device=x.device) * step
    weights = torch.full((_INTERVALS + 1,), 1.0, dtype=x.dtype, device=x.device)
    weights[0] = weights[-1] = 0.5
    phase = x.unsqueeze(-1) * torch.sin(nodes)  # (..., nodes)
    order = torch.arange(orders, dtype=x.dtype, device=x.device)
    angle = nodes.unsqueeze(-1) * order  # (nodes, orders)
    weighted = weights.unsqueeze(-1) * (step / math.pi)
    return torch.cos(phase) @ (torch.cos(angle) * weighted) + torch.sin(phase) @ (torch.sin(angle) * weighted)


def _j_series(x: torch.Tensor, order: int) -> torch.Tensor:
    """|x| <= 1: ``(x/2)^m sum_k (-x²/4)^k / (k! (k + m)!)``, exact in relative terms near 0 (the
    quadrature's error is absolute, some 1e-17)."""
    quarter_square = -x * x / 4
    term = torch.ones_like(x)
    total = term
    for k in range(1, 12):
        term = term * quarter_square / (k * (k + order))
        total = total + term
    return x / 2 * total if order else total  # x / 2 first keeps the sign of a zero


def _hankel(x: torch.Tensor, order: int, second_kind: bool, dtype: torch.dtype) -> torch.Tensor:
    """Hankel's expansion for x > 0 large: ``sqrt(2 / (pi x)) (P cos(chi) - Q sin(chi))`` (J),
    ``(P sin(chi) + Q cos(chi))`` (Y); the phase ``chi`` rounded to the input's ``dtype``, as the
    kernel computes it (a float32 argument of 1e5 moves it by up to 4e-3)."""
    mu = 4 * order * order
    p, q = torch.ones_like(x), torch.zeros_like(x)
    term = torch.ones_like(x)
    for k in range(1, _ASYMPTOTIC_TERMS + 1):
        term = term * ((mu - (2 * k - 1) ** 2) / (k * 8)) / x
        sign = -1.0 if (k // 2) % 2 else 1.0  # a_k: Q takes k = 1, 3, 5... alternating; P takes k = 2, 4...
        if k % 2:
            q = q + sign * term
        else:
            p = p + sign * term
    chi = (x.to(dtype) - (2 * order + 1) * (math.pi / 4)).to(x.dtype)
    amplitude = torch.sqrt(2 / (math.pi * x))
    if second_kind:
        return amplitude * (p * torch.sin(chi) + q * torch.cos(chi))
    return amplitude * (p * torch.cos(chi) - q * torch.sin(chi))


def _bessel_near_and_far(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    near = x.abs() <= _NEAR
    return near, torch.where(near, x, torch.zeros_like(x)), torch.where(near, _full(x, _NEAR * 2), x.abs())


def _in_float64_with_dtype(function: Callable[[torch.Tensor, torch.dtype], torch.Tensor]) -> Callable:
    """As ``in_float64``, telling ``function`` the dtype its result is rounded to."""
    def evaluated(x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype if x.is_floating_point() else torch.get_default_dtype()
        return function(x.to(torch.float64), dtype).to(dtype)
    evaluated.__name__ = evaluated.__qualname__ = function.__name__
    evaluated.__doc__ = function.__doc__
    return evaluated


def _j(order: int) -> Callable[[torch.Tensor], torch.Tensor]:
    def bessel(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        near, close, far = _bessel_near_and_far(torch.where(torch.isfinite(x), x, torch.zeros_like(x)))
        direct = torch.where(close.abs() <= 1, _j_series(torch.where(close.abs() <= 1, close, torch.zeros_like(x)), order),
                             _bessel_j_orders(close, order + 1)[..., order])
        expansion = _hankel(far, order, second_kind=False, dtype=dtype)
        if order:
            expansion = torch.where(x < 0, -expansion, expansion)
        result = torch.where(near, direct, expansion)
        return torch.where(torch.isfinite(x), result, _full(x, math.nan))
    bessel.__name__ = f"bessel_j{order}"
    bessel.__doc__ = f"J{order}: Bessel's integral near 0, Hankel's expansion far out; NaN at ±inf, as the kernel."
    return _in_float64_with_dtype(bessel)


def _y(order: int) -> Callable[[torch.Tensor], torch.Tensor]:
    def bessel(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        usable = (x > 0) & torch.isfinite(x)
        safe = torch.where(usable, x, torch.ones_like(x))
        near, close, far = _bessel_near_and_far(safe)
        close = torch.where(near, close, torch.ones_like(x))
        j = _bessel_j_orders(close, 2 * _NEUMANN_TERMS + 2)
        k = torch.arange(1, _NEUMANN_TERMS + 1, dtype=x.dtype, device=x.device)
        alternating = torch.where(k % 2 == 0, 1.0, -1.0).to(x.dtype) / k
        logarithm = torch.log(close / 2) + _EULER_GAMMA
        if order == 0:
            direct = (2 / math.pi) * logarithm * j[..., 0] - (4 / math.pi) * (j[..., 2::2][..., :_NEUMANN_TERMS]
                                                                            * alternating).sum(-1)
        else:
            odd_below, odd_above = j[..., 1:2 * _NEUMANN_TERMS:2], j[..., 3:2 * _NEUMANN_TERMS + 2:2]
            direct = (2 / math.pi) * (logarithm * j[..., 1] - j[..., 0] / close) + (2 / math.pi) * (
                (odd_below - odd_above) * alternating).sum(-1)
        result = torch.where(near, direct, _hankel(far, order, second_kind=True, dtype=dtype))
        result = torch.where(usable, result, torch.where(x == 0, _full(x, -math.inf), _full(x, math.nan)))
        return result
    bessel.__name__ = f"bessel_y{order}"
    bessel.__doc__ = f"Y{order}: Neumann's series near 0, Hankel's expansion far out; -inf at 0, NaN below and at inf."
    return _in_float64_with_dtype(bessel)


@in_float64
def spherical_bessel_j0(x: torch.Tensor) -> torch.Tensor:
    """``sin(x) / x``: 1 at 0, 0 at ±inf, as the kernel."""
    safe = torch.where((x == 0) | torch.isinf(x), torch.ones_like(x), x)
    result = torch.sin(safe) / safe
    return torch.where(x == 0, torch.ones_like(x), torch.where(torch.isinf(x), torch.zeros_like(x), result))


DECOMPOSITIONS.update({
    aten.special_bessel_j0.default: _j(0),
    aten.special_bessel_j1.default: _j(1),
    aten.special_bessel_y0.default: _y(0),
    aten.special_bessel_y1.default: _y(1),
    aten.special_spherical_bessel_j0.default: spherical_bessel_j0,
})


# --- Airy's Ai (DLMF 9.4, 9.6, 9.7) ------------------------------------------------------------

_AI_0, _AI_PRIME_0 = 0.355028053887817239260, -0.258819403792806798405  # Ai(0), Ai'(0)
_AIRY_SERIES_TERMS = 40  # at |x| = 8 the terms fall below an ulp of the sum after 25
_AIRY_OSCILLATING_FROM = -8.0  # zeta >= 15: the expansion's smallest term is below 1e-13
_AIRY_DECAYING_FROM = 2.0  # zeta >= 1.9: the trapezoidal rule's nodes reach exp's underflow
_AIRY_EXPANSION_FROM = 8.0  # zeta >= 15: the expansion's smallest term is below 1e-13


def _airy_series(x: torch.Tensor) -> torch.Tensor:
    """Maclaurin: ``Ai(0) f(x) + Ai'(0) g(x)`` with ``f = sum 1 4 7 ... (3k-2) x^3k / (3k)!`` and
    ``g = sum 2 5 8 ... (3k-1) x^(3k+1) / (3k+1)!``; digits cancel only for x > 0, where it is
    used up to 2 (losing under 50 ulps)."""
    cube = x * x * x
    f_term, g_term = torch.ones_like(x), x
    f, g = f_term, g_term
    for k in range(1, _AIRY_SERIES_TERMS):
        f_term = f_term * cube / ((3 * k - 1) * (3 * k))
        g_term = g_term * cube / ((3 * k) * (3 * k + 1))
        f, g = f + f_term, g + g_term
    return _AI_0 * f + _AI_PRIME_0 * g


def _airy_u(count: int) -> list[float]:
    """DLMF 9.7.2: ``u_k = (2k+1)(2k+3)...(6k-1) / (216^k k!)``."""
    u = [1.0]
    for k in range(1, count):
        u.append(u[-1] * (6 * k - 5) * (6 * k - 3) * (6 * k - 1) / ((2 * k - 1) * 216 * k))
    return u


def _airy_oscillating(x: torch.Tensor) -> torch.Tensor:
    """DLMF 9.7.9, for x = -z well below 0: ``(cos(zeta - pi/4) P + sin(zeta - pi/4) Q) /
    (sqrt(pi) z^(1/4))``, ``zeta = 2/3 z^(3/2)``, P and Q the alternating even and odd parts of
    ``sum u_k / zeta^k``."""
    z = -x
    zeta = 2 / 3 * z * torch.sqrt(z)
    inverse = 1 / zeta
    even, odd = torch.zeros_like(x), torch.zeros_like(x)
    for k, u in reversed(list(enumerate(_airy_u(24)))):  # Horner's rule in 1/zeta^2, from the smallest term
        sign = -1.0 if (k // 2) % 2 else 1.0
        if k % 2 == 0:
            even = even * inverse * inverse + sign * u
        else:
            odd = odd * inverse * inverse + sign * u
    odd = odd * inverse
    phase = zeta - math.pi / 4
    return (torch.cos(phase) * even + torch.sin(phase) * odd) / (math.sqrt(math.pi) * torch.sqrt(torch.sqrt(z)))


def _airy_decaying(x: torch.Tensor) -> torch.Tensor:
    """DLMF 9.6.1: ``Ai(x) = sqrt(x / 3) K_{1/3}(zeta) / pi``, ``K`` by the trapezoidal rule on
    its integral (scaled by ``exp(zeta)``, then unscaled); from x = 8 on, where the integrand's
    peak narrows below the rule's step, DLMF 9.7.5: ``exp(-zeta) / (2 sqrt(pi) x^(1/4)) sum
    (-1)^k u_k / zeta^k``."""
    zeta = 2 / 3 * x * torch.sqrt(x)
    integral = torch.sqrt(x / 3) * _scaled_k_integral(zeta, 1 / 3) / math.pi
    inverse = 1 / zeta
    total = torch.zeros_like(x)
    for k, u in reversed(list(enumerate(_airy_u(24)))):
        total = total * inverse + (-u if k % 2 else u)
    expansion = total / (2 * math.sqrt(math.pi) * torch.sqrt(torch.sqrt(x)))
    return torch.where(x >= _AIRY_EXPANSION_FROM, expansion, integral) * torch.exp(-zeta)


def _airy_ai(x: torch.Tensor) -> torch.Tensor:
    """Ai in float64: the series between -8 and 2, the oscillating expansion below, the integral
    above; infinities give NaN, as the kernel's."""
    oscillating = x < _AIRY_OSCILLATING_FROM
    decaying = x > _AIRY_DECAYING_FROM
    middle = torch.where(oscillating | decaying, torch.zeros_like(x), x)
    result = torch.where(oscillating, _airy_oscillating(torch.where(oscillating, x, _full(x, -10.0))),
                         torch.where(decaying, _airy_decaying(torch.where(decaying, x, _full(x, 3.0))),
                                     _airy_series(middle)))
    return torch.where(torch.isinf(x), _full(x, math.nan), result)


DECOMPOSITIONS[aten.special_airy_ai.default] = in_float64(_airy_ai)
