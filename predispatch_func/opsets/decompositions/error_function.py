"""The error function's relatives: ``erfc``, ``erfcx``, their inverses ``erfinv`` and ``ndtri``.

Core ATen has ``erf``, whose complement ``1 - erf(x)`` keeps its digits only
while ``erfc(x)`` is not small (``x < 3``: a relative error below 1e-11).
Beyond, Laplace's continued fraction for the scaled complement
``erfcx(x) = exp(x²) erfc(x)`` converges fast (Abramowitz and Stegun 7.1.14),
and ``erfc = exp(-x²) erfcx``. The inverses start from Winitzki's closed-form
approximation (good to 2e-3) and take Newton steps on ``erf``, or, in the
tails, on ``log erfc`` through ``erfcx`` (so an argument of 1e-300 keeps its
digits), quadratically to double precision. Narrower floating dtypes are
computed in float64 and rounded once.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from .gamma import in_float64

aten = torch.ops.aten

_CONTINUED_FRACTION_FROM = 3.0
_DEPTH = 40  # terms of the continued fraction: at x = 3 it has converged to an ulp
_NEWTON_STEPS = 5
_TWO_OVER_ROOT_PI = 2 / math.sqrt(math.pi)


def _erfcx_continued_fraction(x: torch.Tensor) -> torch.Tensor:
    """``x >= 3``: ``1 / (sqrt(pi) (x + (1/2) / (x + 1 / (x + (3/2) / (x + ...)))))``, from the bottom."""
    tail = x
    for k in range(_DEPTH, 0, -1):
        tail = x + (k / 2) / tail
    return 1 / (math.sqrt(math.pi) * tail)


def _erfcx(x: torch.Tensor) -> torch.Tensor:
    far = x >= _CONTINUED_FRACTION_FROM
    near = torch.where(far, torch.zeros_like(x), x)
    fraction = _erfcx_continued_fraction(torch.where(far, x, _full(x, _CONTINUED_FRACTION_FROM)))
    return torch.where(far, fraction, torch.exp(near * near) * (1 - torch.erf(near)))


def _erfc(x: torch.Tensor) -> torch.Tensor:
    far = x >= _CONTINUED_FRACTION_FROM
    near = torch.where(far, torch.zeros_like(x), x)
    distant = torch.where(far, x, _full(x, _CONTINUED_FRACTION_FROM))
    return torch.where(far, torch.exp(-distant * distant) * _erfcx_continued_fraction(distant), 1 - torch.erf(near))


def _full(like: torch.Tensor, value: float) -> torch.Tensor:
    return torch.full_like(like, value)


@in_float64
def erfc(x: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isnan(x), x, _erfc(x))


def erfcx(x: torch.Tensor) -> torch.Tensor:
    """inf below about -26.6 (``exp(x²)`` overflows), as the kernel; 0 at +inf. Below 0 the
    kernel takes ``exp(x * x)`` with the square rounded to ``x``'s dtype, and so does this."""
    dtype = x.dtype if x.is_floating_point() else torch.get_default_dtype()
    x = x.to(dtype)
    square = (x * x).to(torch.float64)
    wide = x.to(torch.float64)
    negative = wide < 0
    below = torch.where(negative, wide, torch.zeros_like(wide))
    reflected = torch.exp(torch.where(negative, square, torch.zeros_like(square))) * (1 - torch.erf(below))
    result = torch.where(negative, reflected, _erfcx(torch.where(negative, torch.zeros_like(wide), wide)))
    return torch.where(torch.isnan(wide), wide, result).to(dtype)


def _winitzki(log_one_minus_square: torch.Tensor) -> torch.Tensor:
    """|erfinv(y)| from ``log(1 - y²)``, to 2e-3: Winitzki's approximation, ``a = 0.147``."""
    a = 0.147
    first = 2 / (math.pi * a) + log_one_minus_square / 2
    return torch.sqrt(torch.clamp(torch.sqrt(first * first - log_one_minus_square / a) - first, min=0))


def _erfcinv_upper(c: torch.Tensor) -> torch.Tensor:
    """``x >= 0`` with ``erfc(x) = c``, for ``0 < c <= 1``: Newton on ``log erfc(x) = -x² + log erfcx(x)``."""
    x = _winitzki(torch.log(c) + torch.log(2 - c))
    target = torch.log(c)
    for _ in range(_NEWTON_STEPS):
        scaled = _erfcx(x)
        residual = -x * x + torch.log(scaled) - target
        x = x + residual * (math.sqrt(math.pi) / 2) * scaled  # residual / -(2 / (sqrt(pi) erfcx))
    return x


def _erfinv_central(y: torch.Tensor) -> torch.Tensor:
    """``|y| <= 1/2``: Newton on ``erf(x) = y``."""
    x = torch.sign(y) * _winitzki(torch.log1p(-y * y))
    for _ in range(_NEWTON_STEPS):
        x = x - (torch.erf(x) - y) / (_TWO_OVER_ROOT_PI * torch.exp(-x * x))
    return x


@in_float64
def erfinv(y: torch.Tensor) -> torch.Tensor:
    """``±inf`` at ``±1``, NaN beyond; the tails as ``erfcinv(1 - |y|)`` (exact for ``|y| >= 1/2``)."""
    magnitude = y.abs()
    central = magnitude <= 0.5
    tail = (magnitude > 0.5) & (magnitude < 1)
    small = torch.where(central, y, torch.zeros_like(y))
    upper = _erfcinv_upper(torch.where(tail, 1 - magnitude, _full(y, 0.5)))
    result = torch.where(central, _erfinv_central(small), torch.where(y < 0, -upper, upper))
    result = torch.where(magnitude == 1, torch.where(y > 0, _full(y, math.inf), _full(y, -math.inf)), result)
    return torch.where((magnitude > 1) | torch.isnan(y), _full(y, math.nan), result)


@in_float64
def ndtri(p: torch.Tensor) -> torch.Tensor:
    """The standard normal quantile, ``-sqrt(2) erfcinv(2p)``: the lower tail from ``2p`` itself
    (no ``1 - 2p`` to lose its digits), the upper one by symmetry from ``2 - 2p``."""
    c = 2 * p
    lower = (c > 0) & (c <= 1)
    upper = (c > 1) & (c < 2)
    x = _erfcinv_upper(torch.where(lower, c, torch.where(upper, 2 - c, torch.ones_like(c))))
    result = torch.where(lower, -math.sqrt(2) * x, math.sqrt(2) * x)
    result = torch.where(p == 0, _full(p, -math.inf), torch.where(p == 1, _full(p, math.inf), result))
    return torch.where((p < 0) | (p > 1) | torch.isnan(p), _full(p, math.nan), result)


DECOMPOSITIONS: dict[Any, Callable] = {
    aten.erfc.default: erfc,
    aten.special_erfcx.default: erfcx,
    aten.erfinv.default: erfinv,
    aten.special_ndtri.default: ndtri,
}
