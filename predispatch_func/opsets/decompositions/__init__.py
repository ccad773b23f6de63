"""Decompositions into Core ATen that torch lacks, written here, shared by both lowerings.

torch registers no ATen-level decomposition for these ops (some only a ref into
prims, which no ATen op set holds), so a backend implementing Core ATen met them
as unreachable, in ``pf.eager.on(core_aten)`` and in ``export(..., target=)``
alike. :func:`~predispatch_func.opsets.lowering.core_decompositions` adds this
table after torch's, so :class:`~predispatch_func.opsets.Lowering` picks them
for both paths: one lowering.

Each is a restatement of the op's documented (and, where the result depends on
it, its CPU kernel's) behaviour in ops of Core ATen and the eager runtime floor,
written so a decomposition traced once per signature stays right for every value
of that signature: no ``.item()`` unless the op returns a Python value. Each is
checked against eager on the op's OpInfo samples, forward and backward, float64
and float32 (``tests/opsets/test_decompositions.py``). One module a family:

* ``elementwise``: pointwise math, shifts, gcd, rounding to decimals, frexp;
* ``complex_parts``: complex numbers from their parts (``complex``, ``polar``), conjugation;
* ``polynomials``: the orthogonal polynomials of a per-element degree (Chebyshev, Hermite, Laguerre,
  Legendre), by eager's recurrences and closed forms;
* ``gamma``: ``lgamma``, ``digamma``, ``polygamma``, Hurwitz's ``zeta``, from the textbook series;
* ``error_function``: ``erfc``, ``erfcx`` and the inverses ``erfinv``, ``ndtri``;
* ``bessel``: Bessel functions J0, J1, Y0, Y1, spherical j0, the modified I0, I1, K0, K1 and scaled forms;
* ``histograms``: ``histc`` with the kernel's bin edges;
* ``scans``: cumulative products, maxima and logsumexp, as log-step scans;
* ``structure``: copies of views, views, scatters (diagonal, strided, index_reduce, put, bincount), factories;
* ``searching``: equal, full max/min, masked_select, searchsorted, scatter with reduce;
* ``segments``: ``segment_reduce`` and its backward;
* ``pooling``: adaptive and fractional max pooling, with the kernels' indices;
* ``backward``: the backward kernels of pooling, upsampling, padding and shrinking;
* ``antialias``: antialiased bilinear resizing and its backward, as fixed linear maps;
* ``products``: ``_trilinear`` and the discrete Fourier transform;
* ``sampling``: ``grid_sampler_3d`` and the 2-d and 3-d samplers' backward kernels, by their taps;
* ``draws``: random ops drawing what their CPU kernels draw (``multinomial`` without replacement, ``rrelu``);
* ``ctc``: the CTC loss and its backward kernel, by the forward and backward recursions over time;
* ``losses``: backward kernels of margin losses and pairwise distances;
* ``linalg``: triangular solves, LU and what it gives (solve, inverse, determinant), Cholesky, Householder QR
  in LAPACK's form (``geqrf``, ``linalg_qr``) and products of its reflectors (``householder_product``, ``ormqr``);
* ``ldl``: LAPACK's symmetric indefinite factorization (Bunch-Kaufman pivoting) and its solve;
* ``normalization``: batch norm's backward, torch's decomposition's values in fewer ops (each step of a
  conv net calls it once a layer);
* ``attention``: CPU flash attention and its backward (torch's returns the weights for the logsumexp);
* ``singular_points``: ops torch decomposes itself, but whose gradient above autograd is NaN where
  eager's formula gives a value (a zero norm, a fully masked softmax row, ``log_ndtr``'s other branch);
* ``spectral``: symmetric eigendecomposition and SVD by Jacobi rotations, and from them ``pinv``, ``polar``,
  ``matrix_sqrth``, ``lstsq``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import (
    antialias,
    attention,
    backward,
    bessel,
    complex_parts,
    ctc,
    draws,
    elementwise,
    error_function,
    gamma,
    histograms,
    ldl,
    linalg,
    losses,
    normalization,
    polynomials,
    pooling,
    products,
    sampling,
    scans,
    searching,
    segments,
    singular_points,
    spectral,
    structure,
)

TABLE: dict[Any, Callable] = {
    **elementwise.DECOMPOSITIONS,
    **complex_parts.DECOMPOSITIONS,
    **polynomials.DECOMPOSITIONS,
    **gamma.DECOMPOSITIONS,
    **error_function.DECOMPOSITIONS,
    **bessel.DECOMPOSITIONS,
    **histograms.DECOMPOSITIONS,
    **scans.DECOMPOSITIONS,
    **structure.DECOMPOSITIONS,
    **searching.DECOMPOSITIONS,
    **segments.DECOMPOSITIONS,
    **pooling.DECOMPOSITIONS,
    **backward.DECOMPOSITIONS,
    **antialias.DECOMPOSITIONS,
    **linalg.DECOMPOSITIONS,
    **spectral.DECOMPOSITIONS,
    **ldl.DECOMPOSITIONS,
    **losses.DECOMPOSITIONS,
    **ctc.DECOMPOSITIONS,
    **draws.DECOMPOSITIONS,
    **products.DECOMPOSITIONS,
    **sampling.DECOMPOSITIONS,
    **singular_points.DECOMPOSITIONS,
    **attention.DECOMPOSITIONS,
    **normalization.DECOMPOSITIONS,
}

# ops whose decomposition reads tensor data for a size or a Python value (``.item()``): pf.eager runs
# them uncached; a program cannot hold that decision, so export leaves them unreachable, saying why
READS_DATA = frozenset(op for op, decomposition in TABLE.items()
                       if getattr(decomposition, "reads_data", False))

# used only where the running torch has no decomposition of its own
FALLBACK: dict[Any, Callable] = {**pooling.FALLBACK, **linalg.FALLBACK}

__all__ = ["FALLBACK", "READS_DATA", "TABLE"]
