"""The symmetric indefinite factorization ``A = P L D L^T P^T`` of LAPACK's ``sytrf`` (lower
triangle), and solves with it (``sytrs``), as LAPACK documents them.

Bunch and Kaufman's partial pivoting (1977) picks, at each step, a 1 x 1 or a 2 x 2 diagonal
block of the trailing matrix by comparing magnitudes with ``alpha = (1 + sqrt(17)) / 8``:
with ``colmax`` the largest below the diagonal in the column (row ``imax``) and ``rowmax`` the
largest off the diagonal in row/column ``imax``: no interchange if ``|a_kk| >= alpha colmax``
or ``|a_kk| colmax >= alpha colmax^2 / rowmax``; else ``imax`` moves to ``k`` if
``|a_imax,imax| >= alpha rowmax``; else the block is 2 x 2 with ``imax`` moved to ``k + 1``.
The interchange applies to the trailing matrix only (the columns already done keep their
rows), so ``LD`` holds D's blocks on and next to the diagonal and the multipliers below,
and ``pivots`` LAPACK's 1-based indices (both entries of a 2 x 2 block: minus the row it came
from). The factor is this algorithm's, which is why it is written as LAPACK's: an LDL^T with
other pivots is as valid and different.

The step sizes and interchanges are decisions on the data, so the factorization reads it
(``.item()``, one matrix of a batch at a time): ``pf.eager`` runs it uncached and export names
it (``reads_data``). The solve walks the pivots the same way.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from ... import _torch_compat as tc

_ALPHA = (1 + math.sqrt(17)) / 8


def _swap(s: torch.Tensor, i: int, j: int) -> torch.Tensor:
    """Symmetric ``s`` with rows and columns ``i`` and ``j`` exchanged."""
    if i == j:
        return s
    order = list(range(s.size(0)))
    order[i], order[j] = j, i
    index = torch.tensor(order, device=s.device)
    return s.index_select(0, index).index_select(1, index)


def _largest(values: torch.Tensor) -> tuple[float, int]:
    magnitude = values.abs()
    position = int(magnitude.argmax().item())
    return float(magnitude[position].item()), position


def _factor(a: torch.Tensor) -> tuple[torch.Tensor, list[int], int]:
    """(LD, 1-based pivots, info) of one matrix, from its lower triangle."""
    n = a.size(0)
    trailing = torch.tril(a) + torch.tril(a, -1).mT  # the symmetric matrix the kernel reads
    columns: list[torch.Tensor] = []
    pivots: list[int] = []
    info, k = 0, 0
    while k < n:
        step, swap_to = 1, 0  # the trailing matrix's own index moved to position swap_to (0 or 1)
        diagonal = abs(float(trailing[0, 0].item()))
        colmax, imax = _largest(trailing[1:, 0]) if k < n - 1 else (0.0, -1)
        imax += 1
        chosen = 0
        if max(diagonal, colmax) == 0:
            info = info or k + 1
        elif diagonal < _ALPHA * colmax:
            rowmax = float(torch.cat([trailing[imax, :imax], trailing[imax + 1:, imax]]).abs().max().item())
            if diagonal >= _ALPHA * colmax * (colmax / rowmax):
                chosen = 0
            elif abs(float(trailing[imax, imax].item())) >= _ALPHA * rowmax:
                chosen = imax
            else:
                chosen, step, swap_to = imax, 2, 1
        trailing = _swap(trailing, swap_to, chosen)
        size = trailing.size(0)
        block = trailing[:step, :step]
        below = trailing[step:, :step]
        if step == 1:
            d = block[0, 0]
            multipliers = below / d if float(d.item()) != 0 else below
            pivots.append(k + chosen + 1)
        else:
            multipliers = below @ torch.linalg.inv(block)
            pivots.extend([-(k + chosen + 1)] * 2)
        lower_block = torch.tril(block)
        column = torch.cat([lower_block, multipliers], 0)  # (size, step)
        columns.append(torch.cat([column.new_zeros((n - size, step)), column], 0))
        trailing = trailing[step:, step:] - multipliers @ below.mT
        k += step
    ld = torch.cat(columns, 1) if columns else a.new_zeros((0, 0))
    return ld, pivots, info


def ldl_factor_ex(a: torch.Tensor, *, hermitian: bool = False, check_errors: bool = False) -> Any:
    if a.is_complex() or not a.is_floating_point():
        return NotImplemented
    n = a.size(-1)
    batch = a.shape[:-2]
    flat = a.reshape(math.prod(batch), n, n)
    factors, pivots, infos = [], [], []
    for matrix in flat.unbind(0):
        factor, chosen, failed = _factor(matrix)
        factors.append(factor)
        pivots.append(torch.tensor(chosen, dtype=torch.int32, device=a.device))
        infos.append(failed)
    if check_errors and any(infos):
        raise RuntimeError(f"linalg.ldl_factor_ex: the factorization could not be completed (info={infos})")
    ld = torch.stack(factors).reshape(a.shape) if factors else a.new_zeros(a.shape)
    pivot = torch.stack(pivots).reshape(*batch, n) if pivots else torch.zeros((*batch, n), dtype=torch.int32)
    return ld, pivot, torch.tensor(infos, dtype=torch.int32, device=a.device).reshape(batch)


ldl_factor_ex.reads_data = True  # type: ignore[attr-defined]


def _rows_swapped(b: torch.Tensor, i: int, j: int) -> torch.Tensor:
    if i == j:
        return b
    order = list(range(b.size(0)))
    order[i], order[j] = j, i
    return b.index_select(0, torch.tensor(order, device=b.device))


def _solve(ld: torch.Tensor, pivots: list[int], b: torch.Tensor) -> torch.Tensor:
    """``A x = b`` for one matrix, ``A = P L D L^T P^T`` as the pivots build it: first
    ``L D y = b`` walking the blocks forward, then ``L^T x = y`` walking them back."""
    n = ld.size(0)
    k = 0
    blocks = []
    while k < n:
        step = 1 if pivots[k] > 0 else 2
        blocks.append((k, step, abs(pivots[k]) - 1))
        k += step
    for k, step, source in blocks:
        b = _rows_swapped(b, k + step - 1, source)
        below = ld[k + step:, k:k + step]
        b = torch.cat([b[:k + step], b[k + step:] - below @ b[k:k + step]], 0)
        block = ld[k:k + step, k:k + step]
        block = torch.tril(block) + torch.tril(block, -1).mT
        solved = torch.linalg.solve(block, b[k:k + step])
        b = torch.cat([b[:k], solved, b[k + step:]], 0)
    for k, step, source in reversed(blocks):
        below = ld[k + step:, k:k + step]
        updated = b[k:k + step] - below.mT @ b[k + step:]
        b = torch.cat([b[:k], updated, b[k + step:]], 0)
        b = _rows_swapped(b, k + step - 1, source)
    return b


def ldl_solve(ld: torch.Tensor, pivots: torch.Tensor, b: torch.Tensor, *, hermitian: bool = False) -> Any:
    if ld.is_complex() or b.is_complex() or not ld.is_floating_point():
        return NotImplemented
    n = ld.size(-1)
    batch = torch.broadcast_shapes(ld.shape[:-2], pivots.shape[:-1], b.shape[:-2])
    count = math.prod(batch)
    lds = ld.expand(*batch, n, n).reshape(count, n, n)
    pivot_rows = pivots.expand(*batch, n).reshape(count, n).tolist()
    rhs = b.expand(*batch, *b.shape[-2:]).reshape(count, *b.shape[-2:])
    solved = [_solve(lds[i], pivot_rows[i], rhs[i]) for i in range(lds.size(0))]
    out = torch.stack(solved) if solved else rhs.clone()
    return out.reshape(*batch, *b.shape[-2:])


ldl_solve.reads_data = True  # type: ignore[attr-defined]


DECOMPOSITIONS: dict[Any, Callable] = {op: decomposition for op, decomposition in (
    (tc.resolve_overload("aten", "linalg_ldl_factor_ex.default"), ldl_factor_ex),
    (tc.resolve_overload("aten", "linalg_ldl_solve.default"), ldl_solve),
) if op is not None}
