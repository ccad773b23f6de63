"""Linear algebra with unique answers: triangular solves, LU with partial pivoting and what
is built on it (solve, inverse, determinant), Cholesky and its solves, and Householder QR:
``geqrf`` in the form LAPACK documents for its reflectors (dlarfg: the sign of R's diagonal
opposite to the column's first entry), so Q and R are LAPACK's, ``linalg_qr`` from it, and
the products of reflectors (``householder_product``, ``ormqr``).

Each is the textbook algorithm written as one whole-tensor step per row or
column, so the number of steps depends only on the matrix size and a trace holds
for every value. LU pivots as LAPACK's ``getrf`` does: at each column the row of
largest magnitude, the first on a tie (``argmax``), so the factors, the
``pivots`` (1-based, int32) and ``info`` (the first zero pivot, 1-based) are
LAPACK's and a backward reading them (``linalg_solve``'s reads ``LU`` and
``pivots``) gets what eager's would. Rounding differs from LAPACK's blocked
kernels within a few ulps.

Elsewhere: the symmetric eigendecomposition and the SVD (``spectral``: Jacobi rotations, their
vectors' signs their own), LAPACK's symmetric indefinite factorization (``ldl``). Not here:
complex inputs (not written yet: LAPACK pivots complex matrices by ``|re| + |im|``, and QR's
reflectors of complex columns take a complex ``beta``): those decline (``NotImplemented``) and
stay unreachable; ``docs/eager.md`` lists them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ... import _torch_compat as tc

aten = torch.ops.aten


def _real(*tensors: torch.Tensor) -> bool:
    return not any(t.is_complex() for t in tensors)


def _broadcast_batch(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return a.expand(*batch, *a.shape[-2:]), b.expand(*batch, *b.shape[-2:])


def _solve_lower_left(a: torch.Tensor, b: torch.Tensor, unit: bool, reverse: bool) -> torch.Tensor:
    """``a @ x = b`` for triangular ``a`` (lower; ``reverse``: upper, solved from the last row),
    one row of ``x`` a step, reading only ``a``'s triangle (and not its diagonal if ``unit``)."""
    a, b = _broadcast_batch(a, b)
    n = a.size(-1)
    rows: dict[int, torch.Tensor] = {}
    order = range(n - 1, -1, -1) if reverse else range(n)
    for i in order:
        row = b[..., i:i + 1, :]
        done = sorted(rows)
        if done:
            known = torch.cat([rows[j] for j in done], -2)
            coefficients = a[..., i:i + 1, done[0]:done[-1] + 1]
            row = row - coefficients @ known
        rows[i] = row if unit else row / a[..., i:i + 1, i:i + 1]
    if n == 0:  # nothing to solve; ``a`` stays an input of the result, so its gradient is an
        # empty tensor as eager's, not None (a (0, 0) factor of cholesky_solve in a training step)
        return b.clone() + a.sum() * 0
    return torch.cat([rows[i] for i in range(n)], -2)


def solve_triangular(a: torch.Tensor, b: torch.Tensor, *, upper: bool, left: bool = True,
                     unitriangular: bool = False) -> torch.Tensor:
    if not _real(a, b):
        return NotImplemented
    dtype = torch.result_type(a, b)
    a, b = a.to(dtype), b.to(dtype)
    if not left:  # x a = b  <=>  a^T x^T = b^T, the transpose's triangle the other one
        return _solve_lower_left(a.mT, b.mT, unitriangular, reverse=not upper).mT
    return _solve_lower_left(a, b, unitriangular, reverse=upper)


def triangular_solve(b: torch.Tensor, a: torch.Tensor, upper: bool = True, transpose: bool = False,
                     unitriangular: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    if not _real(a, b):
        return NotImplemented
    solved = solve_triangular(a.mT if transpose else a, b, upper=upper != transpose, unitriangular=unitriangular)
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return solved, a.expand(*batch, *a.shape[-2:]).clone(memory_format=torch.contiguous_format)


# --- LU -------------------------------------------------------------------------------------


def _swap(index: torch.Tensor, j: int, p: torch.Tensor) -> torch.Tensor:
    """``index`` (..., m) with entries ``j`` and ``p`` (..., 1) exchanged."""
    at = torch.arange(index.size(-1), device=index.device)
    at_j, at_p = index[..., j:j + 1], index.gather(-1, p)
    return torch.where(at == j, at_p, torch.where(at == p, at_j, index))


def _lu(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(LU, pivots, info) as ``getrf``: partial pivoting, a zero pivot column left unscaled."""
    m, n = a.shape[-2:]
    batch = a.shape[:-2]
    lu = a.clone(memory_format=torch.contiguous_format)
    rows = torch.arange(m, device=a.device).expand(*batch, m)
    pivots, info = [], torch.zeros(batch, dtype=torch.int32, device=a.device)
    for j in range(min(m, n)):
        p = lu[..., j:, j].abs().argmax(-1, keepdim=True) + j
        pivots.append(p)
        lu = lu.gather(-2, _swap(rows, j, p).unsqueeze(-1).expand(*batch, m, n))
        pivot = lu[..., j:j + 1, j:j + 1]
        zero = pivot == 0
        info = torch.where((info == 0) & zero.reshape(batch), torch.full_like(info, j + 1), info)
        if j + 1 == m:
            continue
        below = lu[..., j + 1:, j:j + 1]
        multipliers = torch.where(zero, below, below / torch.where(zero, torch.ones_like(pivot), pivot))
        trailing = lu[..., j + 1:, j + 1:] - multipliers @ lu[..., j:j + 1, j + 1:]
        lower = torch.cat([lu[..., j + 1:, :j], multipliers, trailing], -1)
        lu = torch.cat([lu[..., :j + 1, :], lower], -2)
    stacked = torch.cat(pivots, -1) if pivots else torch.zeros(*batch, 0, dtype=torch.int64, device=a.device)
    return lu, (stacked + 1).to(torch.int32), info


def _permutation(pivots: torch.Tensor, m: int) -> torch.Tensor:
    """``perm`` (..., m): row ``i`` of ``P^T A`` is row ``perm[i]`` of ``A``, the swaps
    ``pivots`` lists applied in order."""
    batch = pivots.shape[:-1]
    perm = torch.arange(m, device=pivots.device).expand(*batch, m)
    targets = pivots.to(torch.int64) - 1
    for j in range(pivots.size(-1)):
        perm = _swap(perm, j, targets[..., j:j + 1])
    return perm


def _rows(x: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    return x.gather(-2, order.unsqueeze(-1).expand(*order.shape, x.size(-1)))


def _check(info: torch.Tensor, name: str) -> None:
    if bool((info != 0).any().item()):
        raise RuntimeError(f"{name}: the factorization failed (info={info.tolist()}): the matrix is singular "
                           "or not positive-definite")


def lu_factor_ex(a: torch.Tensor, *, pivot: bool = True,
                 check_errors: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if not pivot or not _real(a):
        return NotImplemented  # without pivoting: CPU eager refuses it too
    lu, pivots, info = _lu(a)
    if check_errors:
        _check(info, "linalg.lu_factor_ex")
    return lu, pivots, info


def _eye_like(a: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    return (torch.arange(rows, device=a.device).unsqueeze(-1) == torch.arange(cols, device=a.device)).to(a.dtype)


def lu_unpack(lu: torch.Tensor, pivots: torch.Tensor, unpack_data: bool = True,
              unpack_pivots: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    m, n = lu.shape[-2:]
    k = min(m, n)
    if unpack_data:
        row = torch.arange(m, device=lu.device).unsqueeze(-1)
        col = torch.arange(n, device=lu.device)
        zeros = torch.zeros_like(lu)
        lower = torch.where(row > col, lu, zeros)[..., :, :k] + _eye_like(lu, m, k)
        upper = torch.where(row <= col, lu, zeros)[..., :k, :]
    else:
        lower = upper = lu.new_empty(0)
    if unpack_pivots:
        perm = _permutation(pivots, m)
        permutation = (torch.arange(m, device=lu.device).unsqueeze(-1) == perm.unsqueeze(-2)).to(lu.dtype)
    else:
        permutation = lu.new_empty(0)
    return permutation, lower, upper


def linalg_lu(a: torch.Tensor, *, pivot: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if not pivot or not _real(a):
        return NotImplemented
    lu, pivots, _ = _lu(a)
    return lu_unpack(lu, pivots)



def lu_solve(lu: torch.Tensor, pivots: torch.Tensor, b: torch.Tensor, *, left: bool = True,
             adjoint: bool = False) -> torch.Tensor:
    if not _real(lu, b):
        return NotImplemented
    if not left:  # x A = b  <=>  A^T x^T = b^T
        return lu_solve(lu, pivots, b.mT, left=True, adjoint=not adjoint).mT
    dtype = torch.result_type(lu, b)
    lu, b = _broadcast_batch(lu.to(dtype), b.to(dtype))
    perm = _permutation(pivots.expand(*lu.shape[:-2], pivots.size(-1)), lu.size(-2))
    if not adjoint:  # P L U x = b: L U x = P^T b
        y = _solve_lower_left(lu, _rows(b, perm), unit=True, reverse=False)
        return _solve_lower_left(lu, y, unit=False, reverse=True)
    # U^T L^T P^T x = b
    z = _solve_lower_left(lu.mT, b, unit=False, reverse=False)
    w = _solve_lower_left(lu.mT, z, unit=True, reverse=True)
    inverse = torch.zeros_like(perm).scatter(-1, perm, torch.arange(perm.size(-1), device=perm.device).expand_as(perm))
    return _rows(w, inverse)


def inv_ex(a: torch.Tensor, *, check_errors: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    if not _real(a):
        return NotImplemented
    lu, pivots, info = _lu(a)
    if check_errors:
        _check(info, "linalg.inv_ex")
    identity = _eye_like(a, a.size(-1), a.size(-1)).expand_as(a)
    return lu_solve(lu, pivots, identity), info


def solve_ex(a: torch.Tensor, b: torch.Tensor, *, left: bool = True,
             check_errors: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """As eager's: ``b`` a batch of vectors where it is one dim short of ``a`` with ``a``'s
    leading shape (or 1-D), else of matrices; ``LU`` and ``pivots`` of ``a`` alone."""
    if not _real(a, b):
        return NotImplemented
    lu, pivots, info = _lu(a)  # of A itself, unlike det: what eager's solve factors
    if check_errors:
        _check(info, "linalg.solve_ex")
    vector = b.dim() == 1 or (b.dim() == a.dim() - 1 and b.shape == a.shape[:-1])
    rhs = b.unsqueeze(-1) if vector else b
    if vector and not left:
        rhs = b.unsqueeze(-2)
    result = lu_solve(lu, pivots, rhs, left=left)
    if vector:
        result = result.squeeze(-1) if left else result.squeeze(-2)
    return result, lu, pivots, info


def _factored(a: torch.Tensor) -> tuple[bool, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Eager's det and slogdet factor ``A^T`` when ``A`` is contiguous (LAPACK's
    column-major layout without a copy) and return that LU; their backward knows. So do we:
    (transposed?, LU of what eager factors)."""
    transposed = a.is_contiguous()
    return transposed, _lu(a.mT if transposed else a)


def _permutation_sign(pivots: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    swaps = (pivots != torch.arange(1, pivots.size(-1) + 1, device=pivots.device)).sum(-1)
    return 1 - 2 * torch.remainder(swaps, 2).to(dtype)


def det(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if not _real(a):
        return NotImplemented
    _, (lu, pivots, _) = _factored(a)
    return _permutation_sign(pivots, a.dtype) * lu.diagonal(0, -2, -1).prod(-1), lu, pivots


def slogdet(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    if not _real(a):
        return NotImplemented
    _, (lu, pivots, _) = _factored(a)
    diagonal = lu.diagonal(0, -2, -1)
    sign = _permutation_sign(pivots, a.dtype) * torch.sign(diagonal).prod(-1)
    return sign, diagonal.abs().log().sum(-1), lu, pivots


# --- Cholesky -------------------------------------------------------------------------------


def _cholesky_lower(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(L, info) reading ``a``'s lower triangle, one column a step (``potrf``'s answer);
    info: the first (1-based) leading minor that is not positive-definite."""
    n = a.size(-1)
    batch = a.shape[:-2]
    columns: list[torch.Tensor] = []
    info = torch.zeros(batch, dtype=torch.int32, device=a.device)
    for j in range(n):
        column = a[..., j:, j:j + 1]
        if columns:
            done = torch.cat(columns, -1)  # (..., n, j)
            column = column - done[..., j:, :] @ done[..., j:j + 1, :].mT
        pivot = column[..., :1, :]
        failed = ~(pivot > 0).reshape(batch)
        info = torch.where((info == 0) & failed, torch.full_like(info, j + 1), info)
        root = pivot.sqrt()
        below = column[..., 1:, :] / root
        columns.append(torch.cat([torch.zeros(*batch, j, 1, dtype=a.dtype, device=a.device), root, below], -2))
    if not columns:
        return a.clone(), info
    return torch.cat(columns, -1), info


def _hermitian_read(a: torch.Tensor) -> torch.Tensor:
    """``a`` as the kernel reads it, the lower triangle mirrored, but differentiated as eager's
    formula is, as a symmetric matrix: the value of the mirrored matrix, the gradient of the
    symmetric part (the two agree on a symmetric input, exactly: ``(x + x) / 2 == x``)."""
    lower = torch.arange(a.size(-1), device=a.device)
    mirrored = torch.where(lower.unsqueeze(-1) >= lower, a, a.mT)
    symmetric = (a + a.mT) / 2
    return symmetric + (mirrored - symmetric).detach()


def cholesky_ex(a: torch.Tensor, *, upper: bool = False, check_errors: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    if not _real(a):
        return NotImplemented
    lower, info = _cholesky_lower(_hermitian_read(a.mT if upper else a))
    if check_errors:
        _check(info, "linalg.cholesky_ex")
    return (lower.mT.contiguous() if upper else lower), info


def cholesky_inverse(factor: torch.Tensor, upper: bool = False) -> torch.Tensor:
    if not _real(factor):
        return NotImplemented
    lower = factor.mT if upper else factor
    identity = _eye_like(factor, factor.size(-1), factor.size(-1)).expand_as(factor)
    inverse_lower = _solve_lower_left(lower, identity, unit=False, reverse=False)
    return inverse_lower.mT @ inverse_lower


def cholesky_solve_helper(b: torch.Tensor, factor: torch.Tensor, upper: bool) -> torch.Tensor:
    if not _real(b, factor):
        return NotImplemented
    lower = factor.mT if upper else factor
    y = _solve_lower_left(lower, b, unit=False, reverse=False)
    return _solve_lower_left(lower.mT, y, unit=False, reverse=True)


def cholesky_solve(b: torch.Tensor, factor: torch.Tensor, upper: bool = False) -> torch.Tensor:
    """The public op, as its kernel: batch dims broadcast, then the helper eager's kernel calls
    (export meets this one, pf.eager the helper)."""
    if not _real(b, factor):
        return NotImplemented
    batch = torch.broadcast_shapes(b.shape[:-2], factor.shape[:-2])
    return cholesky_solve_helper(b.expand(*batch, *b.shape[-2:]), factor.expand(*batch, *factor.shape[-2:]), upper)


def _reflector(a: torch.Tensor, i: int) -> torch.Tensor:
    """The i-th Householder vector LAPACK stores below the diagonal of column i: zeros above,
    an implicit 1 on the diagonal, ``a[i+1:, i]`` below; shape (..., rows, 1)."""
    column = a[..., :, i:i + 1]
    rows = torch.arange(a.size(-2), device=a.device).unsqueeze(-1)
    return torch.where(rows > i, column, torch.where(rows == i, torch.ones_like(column), torch.zeros_like(column)))


def _reflect(x: torch.Tensor, v: torch.Tensor, tau: torch.Tensor, left: bool) -> torch.Tensor:
    """``(I - tau v v^T) x`` (left) or ``x (I - tau v v^T)``."""
    if left:
        return x - tau * (v @ (v.mT @ x))
    return x - tau * ((x @ v) @ v.mT)


def householder_product(a: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    """The first n columns of ``H_1 ... H_k``, accumulated from the last reflector back (as orgqr)."""
    if not _real(a, tau):
        return NotImplemented
    rows, columns = a.shape[-2:]
    x = torch.eye(rows, columns, dtype=a.dtype, device=a.device).expand(*a.shape[:-2], rows, columns)
    for i in range(tau.size(-1) - 1, -1, -1):
        x = _reflect(x, _reflector(a, i), tau[..., i:i + 1].unsqueeze(-1), left=True)
    return x.clone() if tau.size(-1) == 0 else x


def ormqr(a: torch.Tensor, tau: torch.Tensor, c: torch.Tensor, left: bool = True, transpose: bool = False) -> Any:
    """``Q c``, ``Q^T c``, ``c Q`` or ``c Q^T`` with ``Q = H_1 ... H_k``, one reflector at a time."""
    if not _real(a, tau, c):
        return NotImplemented
    count = tau.size(-1)
    forward = left == transpose  # Q^T c and c Q apply H_1 first
    for i in (range(count) if forward else range(count - 1, -1, -1)):
        c = _reflect(c, _reflector(a, i), tau[..., i:i + 1].unsqueeze(-1), left)
    return c.clone() if count == 0 else c


def geqrf(a: torch.Tensor) -> Any:
    """Householder QR in LAPACK's documented form (dlarfg): for each column's ``x = (alpha, rest)``,
    ``beta = -sign(alpha) ||x||`` (sign(0) = +), ``tau = (beta - alpha) / beta``, the stored vector
    ``rest / (alpha - beta)`` and ``beta`` on R's diagonal; ``tau = 0`` where ``rest`` is zero.
    Each reflector then updates the columns to its right. (dlarfg's rescaling of tiny norms is not
    done: it changes nothing unless ``||x||`` is below 1e-292.)"""
    if not _real(a):
        return NotImplemented
    rows, columns = a.shape[-2:]
    taus = []
    for i in range(min(rows, columns)):
        alpha, rest = a[..., i:i + 1, i:i + 1], a[..., i + 1:, i:i + 1]
        rest_norm = torch.sqrt((rest * rest).sum(-2, keepdim=True))
        norm = torch.sqrt(alpha * alpha + rest_norm * rest_norm)
        beta = torch.where(alpha < 0, norm, -norm)
        reflects = rest_norm != 0
        safe_beta = torch.where(reflects, beta, torch.ones_like(beta))
        tau = torch.where(reflects, (beta - alpha) / safe_beta, torch.zeros_like(beta))
        scale = torch.where(reflects, 1 / torch.where(reflects, alpha - beta, torch.ones_like(beta)), torch.ones_like(beta))
        v_rest = rest * scale
        diagonal = torch.where(reflects, beta, alpha)
        column = torch.cat([a[..., :i, i:i + 1], diagonal, v_rest], -2)
        trailing = a[..., i:, i + 1:]
        v = torch.cat([torch.ones_like(alpha), v_rest], -2)
        trailing = trailing - tau * (v @ (v.mT @ trailing))
        a = torch.cat([a[..., :, :i], column, torch.cat([a[..., :i, i + 1:], trailing], -2)], -1)
        taus.append(tau.squeeze(-1))
    tau = torch.cat(taus, -1) if taus else a.new_zeros((*a.shape[:-2], 0))
    return a.clone() if not taus else a, tau


def linalg_qr(a: torch.Tensor, mode: str = "reduced") -> Any:
    """``geqrf``, then Q from its reflectors (all m columns for ``complete``) and R its upper triangle."""
    if not _real(a):
        return NotImplemented
    rows, columns = a.shape[-2:]
    k = min(rows, columns)
    factored, tau = geqrf(a)
    if mode == "r":
        return a.new_zeros((0,)), torch.triu(factored[..., :k, :])
    if mode == "complete" and rows > columns:
        padding = factored.new_zeros((*factored.shape[:-2], rows, rows - columns))
        q = householder_product(torch.cat([factored, padding], -1), tau)
        return q, torch.triu(factored)
    return householder_product(factored[..., :, :k], tau), torch.triu(factored[..., :k, :])


_TAYLOR_DEGREE = 18  # below norm 1 the remainder is under 1 / 19!, 8e-18


def matrix_exp(a: torch.Tensor) -> torch.Tensor:
    """Scaling and squaring: each matrix divided by ``2^s`` so its 1-norm is at most 1, the Taylor
    polynomial of degree 18 by Horner's rule, then squared ``s`` times; ``s`` is each matrix's own
    (a masked squaring), the largest read from the data (the loop's length), so this is a
    ``reads_data`` decomposition, as the kernel's choice of degree by norm is data-dependent.
    float32 and narrower are computed in float64 (eager's own float32 result is 2e-3 off the
    float64 one, elementwise, on the OpInfo's batched sample; this is an ulp off)."""
    if a.numel() == 0:
        return a.clone()
    if a.dtype in (torch.float32, torch.float16, torch.bfloat16):
        return matrix_exp(a.to(torch.float64)).to(a.dtype)
    if a.dtype == torch.complex64:
        return matrix_exp(a.to(torch.complex128)).to(a.dtype)
    norm = a.abs().sum(-2).amax(-1)
    exponent = torch.ceil(torch.log2(torch.where(torch.isfinite(norm) & (norm > 1), norm, torch.ones_like(norm))))
    squarings = int(exponent.max())
    scaled = a / torch.pow(2.0, exponent).to(a.dtype)[..., None, None]
    identity = torch.eye(a.size(-1), dtype=a.dtype, device=a.device).expand_as(a)
    result = identity
    for k in range(_TAYLOR_DEGREE, 0, -1):
        result = identity + (scaled @ result) / k
    for step in range(squarings):
        result = torch.where((exponent > step)[..., None, None], result @ result, result)
    return result


matrix_exp.reads_data = True  # type: ignore[attr-defined]


DECOMPOSITIONS: dict[Any, Callable] = {
    aten.linalg_matrix_exp.default: matrix_exp,
    aten.geqrf.default: geqrf,
    aten.linalg_qr.default: linalg_qr,
    aten.linalg_householder_product.default: householder_product,
    aten.ormqr.default: ormqr,
    aten.linalg_solve_triangular.default: solve_triangular,
    aten.triangular_solve.default: triangular_solve,
    aten.linalg_lu_factor_ex.default: lu_factor_ex,
    aten.lu_unpack.default: lu_unpack,
    aten.linalg_lu.default: linalg_lu,
    aten.linalg_lu_solve.default: lu_solve,
    aten.linalg_inv_ex.default: inv_ex,
    tc.resolve_overload("aten", "_linalg_solve_ex.default"): solve_ex,
    tc.resolve_overload("aten", "_linalg_det.default"): det,
    tc.resolve_overload("aten", "_linalg_slogdet.default"): slogdet,
    aten.linalg_cholesky_ex.default: cholesky_ex,
    aten.cholesky_inverse.default: cholesky_inverse,
    # the public op, which export meets above autograd (its eager kernel broadcasts, then calls
    # ``_cholesky_solve_helper``, which pf.eager met below it while only that one had a decomposition)
    aten.cholesky_solve.default: cholesky_solve,
}


# --- for torch releases that lack it -------------------------------------------------------


def cholesky(a: torch.Tensor, upper: bool = False) -> torch.Tensor:
    """The deprecated ``torch.cholesky``: the factor, or the kernel's error (read from ``info``)."""
    out = cholesky_ex(a, upper=upper, check_errors=True)
    return out if out is NotImplemented else out[0]


# (torch.cholesky's op is gone from later releases: resolved by name, kept only if it exists)
FALLBACK: dict[Any, Callable] = {op: decomposition for op, decomposition in (
    (tc.resolve_overload("aten", "cholesky.default"), cholesky),
) if op is not None}
