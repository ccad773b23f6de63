"""Symmetric eigendecomposition and SVD by Jacobi rotations, and what is built on them.

LAPACK's ``syevd`` and ``gesdd`` iterate until their data converge; a trace must hold one
sequence of ops for every value of a signature. Jacobi's methods converge quadratically in
the number of sweeps (each sweep rotates every pair of rows and columns once) from any
start, so a fixed count does: ``_sweeps(n)`` is three more than random matrices of that size
need to reach rounding (5 at n = 5, 9 at n = 100, measured), so the rotations still change
nothing in the last ones. Each sweep is ``n - 1`` rounds of ``n / 2`` disjoint pairs
(the round-robin "circle" order), so a round is one whole-tensor step, batched.

* ``eigh``: the two-sided method on the symmetric matrix read from one triangle;
  eigenvalues ascending, as ``syevd`` returns them.
* ``svd``: the one-sided method (Hestenes) on the columns of ``A`` itself (of ``A^T``
  when wide), not on ``A^T A``, whose small eigenvalues lose the small singular values;
  singular values descending; U's columns for zero singular values (and ``full_matrices``'
  extra ones) completed to an orthonormal basis by Householder QR.
* ``pinv``, ``polar``, ``matrix_sqrth``, ``lstsq`` from them, as their definitions say.

What is unique matches LAPACK's to rounding (eigenvalues, singular values, ``pinv``, the
polar factors, the square root, least-squares solutions); singular and eigenvectors are
unique only up to the sign of each (of each pair of columns of U and V together), and that
sign is LAPACK's choice: ours may differ, and every quantity that does not depend on it
(``U @ Vh``, ``|U|``, projectors, everything above) agrees. The coverage run and the tests
compare what the OpInfos' own gradient checks compare (``output_process_fn_grad``).

Gradients. Below autograd (``pf.eager``) eager's own backward formulas read our outputs;
they hold for any valid choice of signs. Above autograd (``export``) the rotations are not
differentiated (their derivative at convergence is an unstable limit); the outputs carry
the first-order perturbation formulas instead, as a term that is zero in value
(``x - x.detach()``) and has the derivative of the decomposition, which is what eager's
formulas compute: for eigh with ``E`` the symmetric part of the perturbation,
``dL = diag(V^T E V)``, ``dV = V (F o V^T E V)``, ``F_ij = 1 / (l_j - l_i)``; for the SVD,
``dS = diag(P)``, ``dU = U (F o (P S + S P^T)) + (I - U U^T) E V S^-1`` and the mirror for
V, with ``P = U^T E V`` and ``F_ij = 1 / (s_j^2 - s_i^2)``.

Real inputs only: complex Hermitian matrices need complex rotations (not written: those
decline with ``NotImplemented`` and stay unreachable).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from ... import _torch_compat as tc
from .linalg import geqrf, householder_product

aten = torch.ops.aten


def _sweeps(n: int) -> int:
    return math.ceil(math.log2(max(n, 2))) + 5


def _circle_order(n: int) -> list[int]:
    """For an even ``n``: the gather index that moves each position to the next round's
    (position 0 stays, the others turn one step around the circle top row -> bottom row),
    pairing position ``i`` with ``i + n/2``; after ``n - 1`` rounds every pair has met once
    and each index is back where it started."""
    half = n // 2
    ring = list(range(half)) + list(range(n - 1, half - 1, -1))
    source = [0] * n
    for k in range(1, n):
        source[ring[k + 1 if k + 1 < n else 1]] = ring[k]
    return source


def _rotation(diagonal_p: torch.Tensor, diagonal_q: torch.Tensor, off: torch.Tensor,
              negligible: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) of the rotation zeroing ``off`` in ``[[p, off], [off, q]]`` (Rutishauser's
    smaller angle); no rotation where ``off`` is negligible."""
    rotate = ~negligible
    theta = (diagonal_q - diagonal_p) / (2 * torch.where(rotate, off, torch.ones_like(off)))
    one = torch.ones_like(theta)
    tangent = torch.where(theta >= 0, one, -one) / (theta.abs() + torch.sqrt(theta * theta + 1))
    tangent = torch.where(rotate & torch.isfinite(theta * theta), tangent, torch.zeros_like(tangent))
    cosine = 1 / torch.sqrt(tangent * tangent + 1)
    return cosine, tangent * cosine


def _rotate_columns(x: torch.Tensor, cosine: torch.Tensor, sine: torch.Tensor) -> torch.Tensor:
    half = x.size(-1) // 2
    left, right = x[..., :, :half], x[..., :, half:]
    c, s = cosine.unsqueeze(-2), sine.unsqueeze(-2)
    return torch.cat([c * left - s * right, s * left + c * right], -1)


def _pad_even(x: torch.Tensor, rows: bool) -> torch.Tensor:
    """A zero column (and row) where the size is odd: it pairs with nothing (no rotation)."""
    if x.size(-1) % 2 == 0:
        return x
    return torch.nn.functional.pad(x, (0, 1, 0, 1) if rows else (0, 1))


def _jacobi_eigh(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(eigenvalues, eigenvectors) of symmetric ``a``, unordered, by two-sided rotations."""
    n = a.size(-1)
    a = _pad_even(a, rows=True)
    size, half = a.size(-1), a.size(-1) // 2
    vectors = torch.eye(size, dtype=a.dtype, device=a.device).expand_as(a)
    order = torch.tensor(_circle_order(size), device=a.device)
    tiny = torch.finfo(a.dtype).tiny
    for _ in range(_sweeps(n)):
        for _ in range(size - 1):
            diagonal = a.diagonal(0, -2, -1)
            off = a[..., :half, half:].diagonal(0, -2, -1)
            cosine, sine = _rotation(diagonal[..., :half], diagonal[..., half:], off, off.abs() <= tiny)
            a = _rotate_columns(a, cosine, sine)
            a = _rotate_columns(a.mT, cosine, sine).mT
            vectors = _rotate_columns(vectors, cosine, sine)
            a = a.index_select(-1, order).index_select(-2, order)
            vectors = vectors.index_select(-1, order)
    return a.diagonal(0, -2, -1)[..., :n], vectors[..., :n, :n]


def _jacobi_columns(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(``a V`` with mutually orthogonal columns, ``V``) by one-sided rotations: the columns'
    norms are the singular values, the normalized columns the left singular vectors."""
    n = a.size(-1)
    a = _pad_even(a, rows=False)
    size, half = a.size(-1), a.size(-1) // 2
    vectors = torch.eye(size, dtype=a.dtype, device=a.device).expand(*a.shape[:-2], size, size)
    order = torch.tensor(_circle_order(size), device=a.device)
    eps = torch.finfo(a.dtype).eps
    for _ in range(_sweeps(n)):
        for _ in range(size - 1):
            left, right = a[..., :, :half], a[..., :, half:]
            alpha, beta = (left * left).sum(-2), (right * right).sum(-2)
            gamma = (left * right).sum(-2)
            negligible = gamma.abs() <= eps * torch.sqrt(alpha * beta)
            cosine, sine = _rotation(alpha, beta, gamma, negligible)
            a = _rotate_columns(a, cosine, sine).index_select(-1, order)
            vectors = _rotate_columns(vectors, cosine, sine).index_select(-1, order)
    return a[..., :, :n], vectors[..., :n, :n]


def _columns(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return x.gather(-1, index.unsqueeze(-2).expand(*x.shape[:-1], index.size(-1)))


def _wide(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype in (torch.float32, torch.float16, torch.bfloat16) else dtype


def _symmetric_read(a: torch.Tensor, lower: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(the symmetric matrix the kernel reads from one triangle, without gradient; the
    perturbation: the symmetric part of ``a - a.detach()``, zero in value)."""
    index = torch.arange(a.size(-1), device=a.device)
    keep = index.unsqueeze(-1) >= index if lower else index.unsqueeze(-1) <= index
    value = torch.where(keep, a, a.mT).detach()
    change = a - a.detach()
    return value, (change + change.mT) / 2


def _inverse_gaps(values: torch.Tensor) -> torch.Tensor:
    """``F_ij = 1 / (values_j - values_i)`` off the diagonal, 0 on it and where equal."""
    gap = values.unsqueeze(-2) - values.unsqueeze(-1)
    zero = gap == 0
    return torch.where(zero, torch.zeros_like(gap), 1 / torch.where(zero, torch.ones_like(gap), gap))


def _eigh(value: torch.Tensor, change: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Eigenvalues ascending and eigenvectors of symmetric ``value``, carrying the first-order
    derivative along ``change`` (symmetric, zero in value)."""
    wide = _wide(value.dtype)
    values, vectors = _jacobi_eigh(value.to(wide))
    values, order = torch.sort(values, stable=True, dim=-1)
    vectors = _columns(vectors, order).to(value.dtype)
    values = values.to(value.dtype)
    projected = vectors.mT @ change @ vectors
    values = values + projected.diagonal(0, -2, -1)
    vectors = vectors + vectors @ (_inverse_gaps(values.detach()) * projected)
    return values, vectors


def linalg_eigh(a: torch.Tensor, UPLO: str = "L", compute_v: bool = True) -> Any:  # noqa: N803  (the schema's name)
    if a.is_complex() or not a.is_floating_point():
        return NotImplemented
    values, vectors = _eigh(*_symmetric_read(a, UPLO.upper() == "L"))
    return values, (vectors if compute_v else a.new_empty(0))


def _svd_tall(value: torch.Tensor, change: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(U m x m, S descending, V n x n) of a tall or square ``value`` (m >= n), the first n
    columns of U carrying the first-order derivative along ``change``."""
    m, n = value.shape[-2:]
    wide = _wide(value.dtype)
    columns, right = _jacobi_columns(value.to(wide))
    singular = torch.sqrt((columns * columns).sum(-2))
    singular, order = torch.sort(singular, stable=True, dim=-1, descending=True)
    columns, right = _columns(columns, order), _columns(right, order)
    # left vectors: normalized columns, those of (numerically) zero singular values left zero,
    # then Householder QR completes them and the m - n more to an orthonormal basis
    floor = singular[..., :1] * (max(m, n) * torch.finfo(wide).eps)
    keep = (singular > floor) & (singular > 0)
    scaled = torch.where(keep.unsqueeze(-2), columns / torch.where(keep, singular, torch.ones_like(singular)).unsqueeze(-2),
                         torch.zeros_like(columns))
    padded = torch.cat([scaled, scaled.new_zeros((*scaled.shape[:-1], m - n))], -1)
    reflected, tau = geqrf(padded)
    diagonal = reflected.diagonal(0, -2, -1)
    diagonal_sign = torch.where(diagonal < 0, -torch.ones_like(diagonal), torch.ones_like(diagonal))
    left = householder_product(reflected, tau) * diagonal_sign.unsqueeze(-2)
    left, singular, right = left.to(value.dtype), singular.to(value.dtype), right.to(value.dtype)
    # first order (zero in value): dS = diag(P), dU, dV with P = U^T E V
    thin = left[..., :, :n]
    projected = thin.mT @ change @ right
    gaps = _inverse_gaps(singular.detach() ** 2)
    s = singular.unsqueeze(-2)
    nonzero = singular != 0
    inverse = torch.where(nonzero, 1 / torch.where(nonzero, singular, torch.ones_like(singular)), torch.zeros_like(singular))
    d_left = thin @ (gaps * (projected * s + s.mT * projected.mT)) \
        + (change @ right - thin @ (thin.mT @ change @ right)) * inverse.unsqueeze(-2)
    d_right = right @ (gaps * (s.mT * projected + projected.mT * s))
    singular = singular + projected.diagonal(0, -2, -1)
    left = torch.cat([thin + d_left, left[..., :, n:]], -1)
    return left, singular, right + d_right


def _svd(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(U full, S, V full) of any real ``a``: a wide matrix as its transpose's."""
    value, change = a.detach(), a - a.detach()
    if a.size(-2) >= a.size(-1):
        return _svd_tall(value, change)
    right, singular, left = _svd_tall(value.mT, change.mT)
    return left, singular, right


def linalg_svd(a: torch.Tensor, full_matrices: bool = False, compute_uv: bool = True,
               *, driver: str | None = None) -> Any:
    if a.is_complex() or not a.is_floating_point():
        return NotImplemented
    m, n = a.shape[-2:]
    k = min(m, n)
    left, singular, right = _svd(a)
    if not compute_uv:
        return a.new_empty(0), singular, a.new_empty(0)
    if not full_matrices:
        left, right = left[..., :, :k], right[..., :, :k]
    return left, singular, right.mT


def _default_tolerances(a: torch.Tensor, atol: torch.Tensor | None,
                        rtol: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """linalg's rule: ``atol`` 0 if absent; ``rtol`` absent is ``eps * max(m, n)``, or 0 where a
    positive ``atol`` was given."""
    real = a.real.dtype if a.is_complex() else a.dtype
    zero = torch.zeros((), dtype=real, device=a.device)
    absolute = zero if atol is None else atol.to(real)
    if rtol is not None:
        return absolute, rtol.to(real)
    default = torch.full((), torch.finfo(real).eps * max(a.size(-1), a.size(-2)), dtype=real, device=a.device)
    return absolute, default if atol is None else torch.where(absolute > 0, zero, default)


def _pinv_value(a: torch.Tensor, absolute: torch.Tensor, relative: torch.Tensor, hermitian: bool) -> torch.Tensor:
    """``V diag(1/s) U^T`` over the singular values above ``max(atol, rtol * s_max)`` (over
    ``|eigenvalues|`` with ``hermitian``, of the lower triangle, as eager reads it); no gradient."""
    a = a.detach()
    if hermitian:
        values, vectors = _eigh(*_symmetric_read(a, lower=True))
        magnitude = values.abs()
        bound = torch.maximum(absolute.unsqueeze(-1), relative.unsqueeze(-1) * magnitude.amax(-1, keepdim=True))
        kept = magnitude > bound
        inverse = torch.where(kept, 1 / torch.where(kept, values, torch.ones_like(values)), torch.zeros_like(values))
        return (vectors * inverse.unsqueeze(-2)) @ vectors.mT
    k = min(a.shape[-2:])
    left, singular, right = _svd(a)
    bound = torch.maximum(absolute.unsqueeze(-1), relative.unsqueeze(-1) * singular[..., :1])
    kept = singular > bound
    inverse = torch.where(kept, 1 / torch.where(kept, singular, torch.ones_like(singular)), torch.zeros_like(singular))
    return (right[..., :, :k] * inverse.unsqueeze(-2)) @ left[..., :, :k].mT


def linalg_pinv(a: torch.Tensor, *, atol: torch.Tensor | None = None, rtol: torch.Tensor | None = None,
                hermitian: bool = False) -> Any:
    """The pseudo-inverse ``X``, carrying its first-order derivative as eager's formula has it,
    of ``A`` as given (with ``hermitian`` too; Golub and Pereyra):
    ``dX = -X dA X + X X^T dA^T (I - A X) + (I - X A) dA^T X^T X``."""
    if a.is_complex() or not a.is_floating_point():
        return NotImplemented
    absolute, relative = _default_tolerances(a, atol, rtol)
    if a.numel() == 0:
        return a.new_zeros((*a.shape[:-2], a.size(-1), a.size(-2)))
    x = _pinv_value(a, absolute, relative, hermitian)
    value, change = a.detach(), a - a.detach()
    m, n = a.shape[-2:]
    eye_m = torch.eye(m, dtype=a.dtype, device=a.device)
    eye_n = torch.eye(n, dtype=a.dtype, device=a.device)
    first_order = -(x @ change @ x) + (x @ x.mT) @ change.mT @ (eye_m - value @ x) \
        + (eye_n - x @ value) @ change.mT @ (x.mT @ x)
    return x + first_order


def linalg_polar(a: torch.Tensor) -> Any:
    """``A = U H`` (m >= n): ``U = W V^T``, ``H = V S V^T`` from ``A = W S V^T``."""
    if a.is_complex() or not a.is_floating_point():
        return NotImplemented
    n = a.size(-1)
    left, singular, right = _svd(a)
    unitary = left[..., :, :n] @ right.mT
    return unitary, (right * singular.unsqueeze(-2)) @ right.mT


def linalg_matrix_sqrth(a: torch.Tensor) -> Any:
    """``V diag(sqrt(l)) V^T`` of the symmetric matrix read from the lower triangle."""
    if a.is_complex() or not a.is_floating_point():
        return NotImplemented
    values, vectors = _eigh(*_symmetric_read(a, lower=True))
    return (vectors * values.sqrt().unsqueeze(-2)) @ vectors.mT


def linalg_lstsq(a: torch.Tensor, b: torch.Tensor, rcond: float | None = None, *,
                 driver: str | None = None) -> Any:
    """The minimum-norm least-squares solution through the SVD, singular values below
    ``rcond * s_max`` dropped, with what each LAPACK driver returns besides: the squared
    residuals (tall, full-rank, not ``gelsy``), the rank (not ``gels``), the singular values
    (``gelsd``, ``gelss``). A full-rank matrix's solution is the same for every driver;
    ``gels`` assumes full rank, ``gelsy`` finds the rank by a column-pivoted QR, which
    agrees with the singular values' cut except where one sits at the threshold."""
    if not (a.is_floating_point() and b.is_floating_point()) or a.is_complex() or b.is_complex():
        return NotImplemented
    driver = driver or "gelsy"
    m, n = a.shape[-2:]
    vector = b.dim() == a.dim() - 1
    rhs = b.unsqueeze(-1) if vector else b
    batch = torch.broadcast_shapes(a.shape[:-2], rhs.shape[:-2])
    a, rhs = a.expand(*batch, m, n), rhs.expand(*batch, *rhs.shape[-2:])
    k = min(m, n)
    threshold = torch.finfo(a.dtype).eps * max(m, n) if rcond is None or rcond < 0 else rcond
    left, singular, right = _svd(a)
    kept = singular > threshold * singular[..., :1]
    inverse = torch.where(kept, 1 / torch.where(kept, singular, torch.ones_like(singular)), torch.zeros_like(singular))
    solution = right[..., :, :k] @ ((left[..., :, :k].mT @ rhs) * inverse.unsqueeze(-1))
    rank = kept.sum(-1)
    full_rank = bool((rank == k).all().item()) if k else True
    if m > n and driver != "gelsy" and full_rank:
        residuals = ((a @ solution - rhs) ** 2).sum(-2)
    else:
        residuals = a.new_empty(0)
    if vector:
        solution = solution.squeeze(-1)
        residuals = residuals.squeeze(-1) if residuals.numel() else residuals
    return (solution, residuals,
            rank if driver != "gels" else torch.empty(0, dtype=torch.int64, device=a.device),
            singular if driver in ("gelsd", "gelss") else a.new_empty(0))


# whether the residuals are returned depends on the rank found
linalg_lstsq.reads_data = True  # type: ignore[attr-defined]


DECOMPOSITIONS: dict[Any, Callable] = {op: decomposition for op, decomposition in (
    (tc.resolve_overload("aten", "_linalg_eigh.default"), linalg_eigh),
    (tc.resolve_overload("aten", "_linalg_svd.default"), linalg_svd),
    (aten.linalg_pinv.atol_rtol_tensor, linalg_pinv),
    (aten.linalg_lstsq.default, linalg_lstsq),
    # new in torch 2.15: resolved by name, kept where they exist
    (tc.resolve_overload("aten", "linalg_polar.default"), linalg_polar),
    (tc.resolve_overload("aten", "linalg_matrix_sqrth.default"), linalg_matrix_sqrth),
) if op is not None}
