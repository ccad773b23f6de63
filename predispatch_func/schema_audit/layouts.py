"""Sparse layouts in the audit: a composite may alias only on some layouts.

``to_sparse_csr`` of a dense tensor is fresh, of a CSR tensor it is the input
itself; ``gather_backward(..., sparse_grad=True)`` returns a COO tensor whose
values are a view of ``grad``. Dense samples alone call both honest. So every
overload that has a kernel for a sparse layout (or is a composite, which runs on
whatever its decomposition accepts) gets samples whose first tensor is
converted to that layout, and an accepted layout no sample ran on is reported
``untested`` for the op; the exporter decomposes a kept composite called with a
tensor of such a layout (``trace/composite_policy.py``).
"""

from __future__ import annotations

import dataclasses

import torch

from .. import _torch_compat as tc
from .samples import Sample

SPARSE_LAYOUTS = {
    "sparse_coo": torch.sparse_coo, "sparse_csr": torch.sparse_csr, "sparse_csc": torch.sparse_csc,
    "sparse_bsr": torch.sparse_bsr, "sparse_bsc": torch.sparse_bsc,
}
LAYOUT_NAMES = {layout: name for name, layout in SPARSE_LAYOUTS.items()}
_PER_LAYOUT = 4  # samples converted per layout


def accepted_layouts(op: tc.OpOverload) -> list[str]:
    """The sparse layouts ``op`` may run on: it has a kernel for them, or is a composite."""
    composite = tc.has_composite_implicit_kernel(op)
    return [name for name, layout in SPARSE_LAYOUTS.items() if composite or tc.has_sparse_kernel(op, layout)]


def layout_of(t: torch.Tensor) -> str:
    return LAYOUT_NAMES.get(t.layout, "strided")


def _convert(t: torch.Tensor, name: str) -> torch.Tensor | None:
    if t.layout != torch.strided or t.dim() != 2 or not (t.is_floating_point() or t.is_complex()):
        return None
    if name == "sparse_coo":
        return t.to_sparse()
    if name in ("sparse_bsr", "sparse_bsc"):
        return t.to_sparse(layout=SPARSE_LAYOUTS[name], blocksize=(1, 1))
    return t.to_sparse(layout=SPARSE_LAYOUTS[name])


def layout_samples(op: tc.OpOverload, samples: list[Sample]) -> list[Sample]:
    """For each sparse layout ``op`` accepts, a few of ``samples`` with their first
    tensor argument (2-d, floating) converted to it."""
    found = []
    for name in accepted_layouts(op):
        made = 0
        for s in samples:
            if made == _PER_LAYOUT or s.outs_from is not None:
                break
            args = list(s.args)
            i = next((k for k, a in enumerate(args) if isinstance(a, torch.Tensor)), None)
            if i is None:
                continue
            converted = _convert(args[i], name)
            if converted is None:
                continue
            args[i] = converted
            found.append(dataclasses.replace(s, source=f"{s.source}+{name}", args=tuple(args), layout=name))
            made += 1
    return found
