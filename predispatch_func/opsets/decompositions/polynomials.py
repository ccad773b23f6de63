"""Orthogonal polynomials of a per-element degree ``n``, as eager's kernels evaluate them.

The degree is a tensor: each element has its own, truncated to an integer (a
negative, infinite or NaN degree gives 0). The kernels run the three-term
recurrence up to each element's degree, stopping early once it is NaN; the
Chebyshev kinds switch to their trigonometric closed form inside ``(-1, 1)``
above a small degree, and the Hermite kinds give NaN above a degree limit (128
for float32, 512 for float64). Each decomposition here takes the same branches
and runs the same recurrence, term for term in the same arithmetic order, on
the whole tensor at once: one step per degree up to the largest degree still
running. That count is read from the data (``n.max()``), as eager's loops read
it, so a trace cannot hold it: these are ``reads_data`` decompositions (pf.eager
runs them uncached; a program cannot hold them, so export names them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

aten = torch.ops.aten


def _operands(x: Any, n: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``x`` in the computation dtype (integers promote to the default float), the integer
    degree (-1 where it is not finite) and, broadcast, both."""
    dtype = torch.result_type(x, n)
    if not dtype.is_floating_point:
        dtype = torch.get_default_dtype()
    x, n = torch.broadcast_tensors(torch.as_tensor(x).to(dtype), torch.as_tensor(n))
    if n.is_floating_point():
        n = torch.where(torch.isfinite(n), n, torch.full_like(n, -1))
    n = n.to(torch.int64)
    return x, n, n.to(dtype)


def _fused(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """``a * b + c`` rounded once, as the kernels' fused multiply-add computes it (float32 and
    narrower: exactly, the product taken in float64; float64 itself: rounded twice, within an ulp)."""
    if a.dtype == torch.float64:
        return a * b + c
    return (a.to(torch.float64) * b.to(torch.float64) + c.to(torch.float64)).to(a.dtype)


def _run_recurrence(n: torch.Tensor, result: torch.Tensor, running: torch.Tensor, p: torch.Tensor,
                    q: torch.Tensor, step: Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor],
                    first: int) -> torch.Tensor:
    """Steps ``k = first, first + 1, ...``, each giving the term of degree ``k + 1 - first + 1``
    from the two before, taken where ``running`` and the degree is reached; stops when no
    running element has a degree left that is not NaN already (eager stops at a NaN)."""
    degree = 2
    while bool((running & (n >= degree) & ~torch.isnan(q)).any()):
        r = step(first + degree - 2, p, q)
        result = torch.where(running & (n == degree), r, result)
        p, q, degree = q, r, degree + 1
    # past a NaN the kernel stops and returns it: NaN stays NaN through the recurrence, so the
    # elements of higher degree get it already where the loop above ran; the rest get it here
    return torch.where(running & (n >= degree) & torch.isnan(q), q, result)


@dataclasses.dataclass(frozen=True)
class _Chebyshev:
    """One Chebyshev kind: its degree-1 term, its values at the ends, its closed form."""

    first: Callable[[torch.Tensor], torch.Tensor]  # the degree-1 term of y
    at_plus: Callable[[torch.Tensor], torch.Tensor]  # value at y = 1, of the degree (as float)
    at_minus: Callable[[torch.Tensor], torch.Tensor]  # value at y = -1
    closed: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]  # (y, x, nf, a)
    above: int  # the closed form inside (-1, 1) from this degree on (exclusive)
    shifted: bool
    reads_data: bool = True

    def __call__(self, x: Any, n: Any) -> torch.Tensor:
        x, n, nf = _operands(x, n)
        y = x + x - 1 if self.shifted else x
        one = torch.ones_like(x)
        if self.shifted:
            at_plus, at_minus = x == 1, x == 0
        else:
            at_plus, at_minus = (x.abs() == 1) & (x > 0), (x.abs() == 1) & ~(x > 0)
        inside = (n > self.above) & (y.abs() < 1)
        q = self.first(y)
        result = torch.where(n == 0, one, q)
        result = torch.where(inside, self.closed(y, x, nf, torch.acos(y)), result)
        result = torch.where(at_plus, self.at_plus(nf), torch.where(at_minus, self.at_minus(nf), result))
        running = ~(at_plus | at_minus | inside) & (n >= 0)
        result = _run_recurrence(n, result, running, one, q, lambda k, p, q: _fused(y + y, q, -p), first=2)
        return torch.where(n < 0, torch.zeros_like(result), result)


def _alternating(nf: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """``(-1)**n * value``."""
    return torch.where(torch.remainder(nf, 2) == 0, value, -value)


def _u_closed(y: torch.Tensor, x: torch.Tensor, nf: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    sine = torch.sin(a)
    return torch.where(sine != 0, torch.sin((nf + 1) * a) / sine, (nf + 1) * torch.cos((nf + 1) * a) / y)


def _v_closed(y: torch.Tensor, x: torch.Tensor, nf: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.sin(a / 2) != 1, torch.cos((nf + 0.5) * a) / torch.cos(a / 2),
                       _alternating(nf, nf + nf + 1))


def _w_closed(shifted: bool) -> Callable:
    def closed(y: torch.Tensor, x: torch.Tensor, nf: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        at_one = _alternating(nf, torch.ones_like(nf)) if shifted else \
            torch.where(x > 0, nf + nf + 1, _alternating(nf, torch.ones_like(nf)))
        return torch.where(torch.cos(a / 2) != 1, torch.sin((nf + 0.5) * a) / torch.sin(a / 2), at_one)
    return closed


def _chebyshev_kinds(shifted: bool) -> dict[str, _Chebyshev]:
    ones = torch.ones_like
    return {
        "t": _Chebyshev(lambda y: y, ones, lambda nf: _alternating(nf, ones(nf)),
                        lambda y, x, nf, a: torch.cos(nf * a), 6, shifted),
        "u": _Chebyshev(lambda y: y + y, lambda nf: nf + 1, lambda nf: _alternating(nf, nf + 1),
                        _u_closed, 6 if shifted else 8, shifted),
        "v": _Chebyshev(lambda y: y + y - 1, ones, lambda nf: _alternating(nf, nf + nf + 1),
                        _v_closed, 6 if shifted else 8, shifted),
        "w": _Chebyshev(lambda y: y + y + 1, lambda nf: nf + nf + 1, lambda nf: _alternating(nf, ones(nf)),
                        _w_closed(shifted), 4 if shifted else 8, shifted),
    }


def _hermite_limit(dtype: torch.dtype) -> int:
    return 128 if dtype == torch.float32 else 512 if dtype == torch.float64 else 1024


def hermite_polynomial_h(x: Any, n: Any) -> torch.Tensor:
    """Physicists' Hermite: ``H(k+1) = 2x H(k) - 2k H(k-1)``."""
    x, n, _ = _operands(x, n)
    one, q = torch.ones_like(x), x + x
    result = torch.where(n == 0, one, q)
    running = (n >= 2) & (n <= _hermite_limit(x.dtype))
    result = _run_recurrence(n, result, running, one, q, lambda k, p, q: _fused(x + x, q, -((2 * (k - 1)) * p)), first=2)
    result = torch.where(n > _hermite_limit(x.dtype), torch.full_like(x, float("nan")), result)
    return torch.where(n < 0, torch.zeros_like(result), result)


def hermite_polynomial_he(x: Any, n: Any) -> torch.Tensor:
    """Probabilists' Hermite: ``He(k+1) = x He(k) - k He(k-1)``."""
    x, n, _ = _operands(x, n)
    one = torch.ones_like(x)
    result = torch.where(n == 0, one, x)
    running = (n >= 2) & (n <= _hermite_limit(x.dtype))
    result = _run_recurrence(n, result, running, one, x, lambda k, p, q: _fused(x, q, -((k - 1) * p)), first=2)
    result = torch.where(n > _hermite_limit(x.dtype), torch.full_like(x, float("nan")), result)
    return torch.where(n < 0, torch.zeros_like(result), result)


def laguerre_polynomial_l(x: Any, n: Any) -> torch.Tensor:
    """``L(k+1) = ((2k + 1 - x) L(k) - k L(k-1)) / (k + 1)``; 1 at ``x = 0``."""
    x, n, _ = _operands(x, n)
    one, q = torch.ones_like(x), 1 - x
    result = torch.where(n == 0, one, q)
    at_zero = x.abs() == 0
    result = _run_recurrence(n, result, ~at_zero & (n >= 2), one, q,
                             lambda k, p, q: _fused((k + k) + (1 - x), q, -(k * p)) / (k + 1), first=1)
    return torch.where(n < 0, torch.zeros_like(result), torch.where(at_zero, one, result))


def legendre_polynomial_p(x: Any, n: Any) -> torch.Tensor:
    """``P(k+1) = ((2k + 1) x P(k) - k P(k-1)) / (k + 1)``; ``(±1)**n`` at ``x = ±1``."""
    x, n, nf = _operands(x, n)
    one = torch.ones_like(x)
    result = torch.where(n == 0, one, x)
    at_end = x.abs() == 1
    result = _run_recurrence(n, result, ~at_end & (n >= 2), one, x,
                             lambda k, p, q: _fused((k + k + 1) * x, q, -(k * p)) / (k + 1), first=1)
    ends = torch.where((x > 0) | (torch.remainder(nf, 2) == 0), one, -one)
    return torch.where(n < 0, torch.zeros_like(result), torch.where(at_end, ends, result))


DECOMPOSITIONS: dict[Any, Callable] = {
    **{getattr(aten, f"special_chebyshev_polynomial_{kind}").default: function
       for kind, function in _chebyshev_kinds(shifted=False).items()},
    **{getattr(aten, f"special_shifted_chebyshev_polynomial_{kind}").default: function
       for kind, function in _chebyshev_kinds(shifted=True).items()},
    aten.special_hermite_polynomial_h.default: hermite_polynomial_h,
    aten.special_hermite_polynomial_he.default: hermite_polynomial_he,
    aten.special_laguerre_polynomial_l.default: laguerre_polynomial_l,
    aten.special_legendre_polynomial_p.default: legendre_polynomial_p,
}
for _function in (hermite_polynomial_h, hermite_polynomial_he, laguerre_polynomial_l, legendre_polynomial_p):
    _function.reads_data = True  # type: ignore[attr-defined]
