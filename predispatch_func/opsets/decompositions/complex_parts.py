"""Complex tensors built from, or rebuilt through, their real and imaginary parts.

Core ATen holds no op that makes a complex tensor from real ones, nor one that
negates an imaginary part alone; the runtime floor's ``view_as_complex`` and
``view_as_real`` (views that read the same memory as another dtype) give both.
``real + imag * 1j`` would not do: an infinite imaginary part times ``1j``
gives a NaN real part, where ``complex`` keeps the parts as they are.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ... import _torch_compat as tc

aten = torch.ops.aten


def complex_from_parts(real: torch.Tensor, imag: torch.Tensor) -> torch.Tensor:
    """The parts side by side in a fresh tensor, read as complex numbers."""
    real, imag = torch.broadcast_tensors(real, imag)
    return torch.view_as_complex(torch.stack((real, imag), -1))


def polar(magnitude: torch.Tensor, angle: torch.Tensor) -> torch.Tensor:
    """As the kernel: ``magnitude * cos(angle)`` and ``magnitude * sin(angle)`` as the parts."""
    return complex_from_parts(magnitude * torch.cos(angle), magnitude * torch.sin(angle))


def conj_physical(x: torch.Tensor) -> torch.Tensor:
    """The imaginary parts negated, in new memory (a real tensor: a copy)."""
    if not x.is_complex():
        return x.clone()
    parts = torch.view_as_real(x)
    return complex_from_parts(parts[..., 0], -parts[..., 1])


DECOMPOSITIONS: dict[Any, Callable] = {
    aten.complex.default: complex_from_parts,
    aten.polar.default: polar,
    tc.resolve_overload("aten", "_conj_physical.default"): conj_physical,
}
