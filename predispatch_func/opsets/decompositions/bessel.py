"""Modified Bessel functions ``I0``, ``I1``, ``K0``, ``K1`` and their exponentially scaled forms.

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
_SERIES_TERMS = 100
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
    series = _i_series(torch.where(near, magnitude, torch.zeros_like(x)), order) * torch.exp(
        -torch.where(near, magnitude, torch.zeros_like(x)))
    far = torch.where(near, _full(x, _SERIES_TO * 2), magnitude)
    expansion = _asymptotic_sum(far, order, alternating=True) / torch.sqrt(2 * math.pi * far)
    result = torch.where(near, series, expansion)
    return torch.where(x < 0, -result, result) if order else result


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


def _scaled_k_integral(x: torch.Tensor, order: int) -> torch.Tensor:
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
