"""Decompositions whose gradient is eager's where torch's own is NaN, or missing.

``export(..., target=)``, ``export_joint(..., target=)`` and ``pf.eager`` lower a forward op
above autograd, so autograd differentiates the decomposition, not eager's derivative
formula. The two agree wherever the function is smooth; at the points eager's formula
handles on purpose they do not, and torch's decompositions (written for a compiler that
lowers below autograd) give NaN there:

* ``linalg_vector_norm`` at a zero vector: eager's backward masks the zero norm (gradient 0,
  the subgradient ``F.normalize`` of a zero row relies on); ``sqrt(sum(x * x))``'s derivative
  is infinite there;
* ``_safe_softmax`` over a fully masked row (every score ``-inf``: ``scaled_dot_product_attention``
  with a padding mask that hides a whole query): eager's backward reads its result, 0 in that row;
  torch's decomposition differentiates the NaN of a softmax over ``-inf`` before masking it;
* ``special_log_ndtr``: eager's formula is one expression; torch's decomposition selects between
  two branches with ``where``, and the branch not taken overflows (its NaN gradient survives the
  selection: 0 * inf);
* ``sinc`` at 0 (eager's gradient 0, the masked ``sin(x)/x``'s NaN);
* ``xlogy`` and ``xlog1py`` where ``x`` is 0: eager's gradient in ``x`` is ``log(y)`` (0 where
  ``y`` is at or below the log's pole), torch's decomposition masks the product and gives NaN
  where ``log(y)`` is infinite and 0 everywhere else (an entropy ``-xlogy(p, p)`` of a softmax
  that underflowed to 0 got NaN).

Each is the same values, written so no unselected branch sees an argument where it is not finite
(the "double where": each branch is fed a harmless value where it is not used).

And ``zero`` (``x.zero_()``): eager's gradient in ``x`` is a zero tensor; torch's decomposition
(``zeros_like``) does not depend on ``x``, so a program's gradient was None, or its loss did not
require grad at all. ``fill(x, 0)`` has eager's. (``copysign``'s, ours, in elementwise.py.)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from ... import _torch_compat as tc

aten = torch.ops.aten


def _safe_root(total: torch.Tensor, root: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``root(total)``, 0 at 0 with gradient 0 there (eager's norm backward masks the zero
    norm; a plain root's derivative is infinite there and gives NaN)."""
    zero = total == 0
    return torch.where(zero, torch.zeros_like(total), root(torch.where(zero, torch.ones_like(total), total)))


def vector_norm(x: torch.Tensor, ord: Any = 2, dim: Any = None, keepdim: bool = False, *,  # noqa: A002
                dtype: Any = None) -> torch.Tensor:
    if dtype is not None:
        x = x.to(dtype)
    dims = list(range(x.dim())) if dim is None or (not isinstance(dim, int) and len(dim) == 0) else dim
    magnitude = x.abs()
    if ord == 0:
        return (x != 0).sum(dims, keepdim=keepdim).to(magnitude.dtype)
    if ord == float("inf"):
        return magnitude.amax(dims, keepdim=keepdim)
    if ord == float("-inf"):
        return magnitude.amin(dims, keepdim=keepdim)
    if ord == 1:
        return magnitude.sum(dims, keepdim=keepdim)
    if ord == 2:
        return _safe_root((magnitude * magnitude).sum(dims, keepdim=keepdim), torch.sqrt)
    if ord > 0:  # |x|^p at x = 0: 0 with gradient 0 (eager's backward masks zeros; for p < 1 pow's is inf)
        zero = magnitude == 0
        powered = torch.where(zero, torch.zeros_like(magnitude),
                              torch.where(zero, torch.ones_like(magnitude), magnitude).pow(ord))
    else:
        powered = magnitude.pow(ord)
    return _safe_root(powered.sum(dims, keepdim=keepdim), lambda t: t.pow(1.0 / ord))


def safe_softmax(x: torch.Tensor, dim: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``softmax``, 0 over a row whose every element is ``-inf``; the softmax itself runs over a
    row of zeros there, so its backward sees finite values and the row's gradient is 0.

    A row is fully masked where its maximum is ``-inf`` (a NaN in it makes the maximum NaN, as
    it makes ``all(x == -inf)`` false), found on ``x`` detached: one reduction and a comparison
    of its rows instead of a comparison of every score, ``all`` (``any`` between two negations in
    Core ATen) and their autograd records; the zeros selected are one 0-dim tensor, broadcast."""
    if x.dim() > 0 and x.shape[dim] == 0:  # nothing to mask (and no maximum of an empty row)
        return torch.softmax(x, dim, dtype=dtype)
    masked_rows = torch.amax(x.detach(), dim, keepdim=True) == float("-inf")
    finite = torch.where(masked_rows, torch.zeros((), dtype=x.dtype, device=x.device), x)
    out = torch.softmax(finite, dim, dtype=dtype)
    return torch.where(masked_rows, torch.zeros((), dtype=out.dtype, device=out.device), out)


def log_ndtr(x: torch.Tensor) -> torch.Tensor:
    """``log(ndtr(x))``: through ``erfcx`` below 1 (no underflow far left), ``log1p(-erfc/2)``
    from 1 on; each branch evaluated only where it is taken."""
    if not x.is_floating_point():
        x = x.to(torch.get_default_dtype())
    lower = x < 1.0
    t_low = torch.where(lower, x, torch.zeros_like(x)) * math.sqrt(0.5)
    t_high = torch.where(lower, torch.ones_like(x), x) * math.sqrt(0.5)
    low = torch.log(torch.special.erfcx(-t_low) / 2) - t_low * t_low
    high = torch.log1p(-torch.special.erfc(t_high) / 2)
    return torch.where(lower, low, high)


def sinc(x: torch.Tensor) -> torch.Tensor:
    """``sin(pi x) / (pi x)``, 1 at 0, where the quotient is fed 1 (gradient 0 there, as eager's)."""
    if not (x.is_floating_point() or x.is_complex()):
        x = x.to(torch.get_default_dtype())
    zero = x == 0
    scaled = torch.where(zero, torch.ones_like(x), x) * math.pi
    return torch.where(zero, torch.ones_like(x), torch.sin(scaled) / scaled)


def _log_product(x: Any, y: Any, log: Callable[[torch.Tensor], torch.Tensor], pole: float) -> torch.Tensor:
    """``x * log(y)``, 0 where x is 0 (NaN where y is), with eager's gradient: in x ``log(y)``, 0
    where x is 0 and y at or below the pole; in y ``x / (y - pole)``."""
    dtype = torch.result_type(x, y)  # a Python number takes part as a scalar does
    if not dtype.is_floating_point:
        dtype = torch.get_default_dtype()
    device = (x if isinstance(x, torch.Tensor) else y).device
    x, y = (v.to(dtype) if isinstance(v, torch.Tensor) else torch.scalar_tensor(v, dtype=dtype, device=device)
            for v in (x, y))
    at_pole = (x == 0) & (y <= pole)
    return x * log(torch.where(at_pole, torch.full_like(y, pole + 1), y)) + 0.0  # + 0.0: 0 * log(y < 1) is -0


def xlogy(x: Any, y: Any) -> torch.Tensor:
    return _log_product(x, y, torch.log, 0.0)


def xlog1py(x: Any, y: Any) -> torch.Tensor:
    return _log_product(x, y, torch.log1p, -1.0)


def zero(x: torch.Tensor) -> torch.Tensor:
    return aten.fill.Scalar(x, 0) if x.requires_grad else torch.zeros_like(x)


DECOMPOSITIONS: dict[Any, Callable] = {
    aten.zero.default: zero,
    aten.linalg_vector_norm.default: vector_norm,
    tc.resolve_overload("aten", "_safe_softmax.default"): safe_softmax,
    aten.special_log_ndtr.default: log_ndtr,
    aten.sinc.default: sinc,
    aten.special_sinc.default: sinc,
    aten.xlogy.Tensor: xlogy,
    aten.xlogy.Scalar_Self: xlogy,
    aten.xlogy.Scalar_Other: xlogy,
    aten.special_xlogy.default: xlogy,
    aten.special_xlogy.self_scalar: xlogy,
    aten.special_xlogy.other_scalar: xlogy,
    aten.special_xlog1py.default: xlog1py,
    aten.special_xlog1py.self_scalar: xlog1py,
    aten.special_xlog1py.other_scalar: xlog1py,
}
