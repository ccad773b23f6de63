"""``_upsample_bilinear2d_aa`` and its backward: antialiased resizing as two fixed linear maps.

Each output row (and column) is a normalized triangle-filter average of the
input rows around its centre ``scale * (i + 1/2)``, the filter widened by the
scale when shrinking (PIL's antialias, which the kernel follows): a matrix
``W`` per axis that depends only on the sizes, ``align_corners`` (the scale
``(in - 1) / (out - 1)``) and a given scale, so the forward is
``W_h x W_w^T`` and the backward ``W_h^T g W_w``. An axis whose size does not
change is copied by the forward kernel, whatever scale is given, but the
backward kernel weighs it by the given scale all the same (so eager's gradient
is not its forward's there: torch's inconsistency, kept, as a backend must
match eager). The weights are
built in float64 from index grids, then cast to the input's dtype.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ... import _torch_compat as tc


def _weights(inputs: int, outputs: int, align_corners: bool, scale: Any, like: torch.Tensor,
             copy_same_size: bool) -> torch.Tensor:
    """(outputs, inputs): row i holds output i's filter weights over the input positions."""
    if inputs == outputs and (copy_same_size or scale is None):
        return torch.eye(inputs, dtype=like.dtype, device=like.device)
    if align_corners:
        ratio = (inputs - 1) / (outputs - 1) if outputs > 1 else 0.0
    else:
        ratio = 1.0 / scale if scale is not None and scale > 0 else inputs / outputs
    support = ratio if ratio >= 1.0 else 1.0  # the triangle's half-width (1) times the shrink
    inverse = 1.0 / ratio if ratio >= 1.0 else 1.0
    centre = (torch.arange(outputs, device=like.device, dtype=torch.float64) + 0.5).mul(ratio).unsqueeze(-1)
    position = torch.arange(inputs, device=like.device, dtype=torch.float64).unsqueeze(0)
    first = torch.clamp(torch.trunc(centre - support + 0.5), min=0)
    last = torch.clamp(torch.trunc(centre + support + 0.5), max=inputs)
    inside = (position >= first) & (position < last)
    weight = torch.clamp(1 - ((position - centre + 0.5) * inverse).abs(), min=0) * inside.to(torch.float64)
    total = weight.sum(-1, keepdim=True)
    weight = weight / torch.where(total == 0, torch.ones_like(total), total)
    return weight.to(like.dtype)


def upsample_bilinear2d_aa(x: torch.Tensor, output_size: Any, align_corners: bool, scales_h: Any = None,
                           scales_w: Any = None) -> torch.Tensor:
    rows = _weights(x.size(-2), output_size[0], align_corners, scales_h, x, copy_same_size=True)
    columns = _weights(x.size(-1), output_size[1], align_corners, scales_w, x, copy_same_size=True)
    return (rows @ x @ columns.mT).contiguous()


def upsample_bilinear2d_aa_backward(grad: torch.Tensor, output_size: Any, input_size: Any, align_corners: bool,
                                    scales_h: Any = None, scales_w: Any = None) -> torch.Tensor:
    rows = _weights(input_size[2], output_size[0], align_corners, scales_h, grad, copy_same_size=False)
    columns = _weights(input_size[3], output_size[1], align_corners, scales_w, grad, copy_same_size=False)
    return (rows.mT @ grad @ columns).contiguous()


DECOMPOSITIONS: dict[Any, Callable] = {
    tc.resolve_overload("aten", "_upsample_bilinear2d_aa.default"): upsample_bilinear2d_aa,
    tc.resolve_overload("aten", "_upsample_bilinear2d_aa_backward.default"): upsample_bilinear2d_aa_backward,
}
