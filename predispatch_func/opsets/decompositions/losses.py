"""Backward kernels of margin losses and of pairwise distances.

Each restates its CPU kernel's per-element rule as whole-tensor arithmetic: which
terms are active (a margin term above zero, a target class), the derivative of
each (``p``-norm derivatives as ``Distance.cpp`` defines them, 0 where the
distance is 0), and their sum into the input's gradient.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ... import _torch_compat as tc

aten = torch.ops.aten
_NONE, _MEAN, _SUM = 0, 1, 2


def _by_grad_output(grad_input: torch.Tensor, grad_output: torch.Tensor, reduction: int) -> torch.Tensor:
    if reduction == _NONE and grad_output.dim() > 0:
        return grad_input * grad_output.unsqueeze(-1)
    return grad_input * grad_output


def multi_margin_loss_backward(grad_output: torch.Tensor, x: torch.Tensor, target: torch.Tensor, p: Any,
                               margin: Any, weight: torch.Tensor | None = None, reduction: int = _MEAN) -> torch.Tensor:
    """Per class ``j`` other than the target ``y``: ``z = margin - x[y] + x[j]``; an active
    term (``z > 0``) adds ``g`` (p=1) or ``2 g z`` (p=2) to ``x[j]`` and takes it from ``x[y]``,
    ``g`` being 1/C (1/(N C) for mean), times the target's weight."""
    flat = x.reshape(-1, x.size(-1)) if x.dim() else x.reshape(1, 1)
    classes, frames = flat.size(-1), flat.size(0)
    labels = target.reshape(-1, 1)
    g = 1.0 / (classes * frames) if reduction == _MEAN else 1.0 / classes
    z = margin - flat.gather(1, labels) + flat
    is_target = torch.arange(classes, device=x.device) == labels
    active = (z > 0) & ~is_target
    h = torch.full_like(z, g) if p == 1 else 2 * g * z
    if weight is not None:
        h = h * weight.to(x.dtype).index_select(0, labels.reshape(-1)).unsqueeze(-1)
    h = torch.where(active, h, torch.zeros_like(h))
    grad = h - is_target.to(x.dtype) * h.sum(-1, keepdim=True)
    grad = _by_grad_output(grad, grad_output.reshape(-1) if reduction == _NONE else grad_output, reduction)
    return grad.reshape(x.shape)


def multilabel_margin_loss_backward(grad_output: torch.Tensor, x: torch.Tensor, target: torch.Tensor,
                                    reduction: int, is_target: torch.Tensor) -> torch.Tensor:
    """Per valid target class ``j`` (those before the first -1) and non-target class ``k``:
    ``z = 1 - x[j] + x[k]``; an active term adds ``g`` to ``x[k]`` and takes it from ``x[j]``."""
    flat = x.reshape(-1, x.size(-1)) if x.dim() else x.reshape(1, 1)
    classes, frames = flat.size(-1), flat.size(0)
    labels = target.reshape(frames, classes)
    g = 1.0 / (classes * frames) if reduction == _MEAN else 1.0 / classes
    valid = torch.cumprod((labels >= 0).to(torch.int64), -1).to(torch.bool)  # up to the first -1
    safe = torch.where(valid, labels, torch.zeros_like(labels))
    z = 1 - flat.gather(1, safe).unsqueeze(-1) + flat.unsqueeze(1)  # (frames, target slot, class)
    others = is_target.reshape(frames, classes) == 0
    active = ((z > 0) & others.unsqueeze(1) & valid.unsqueeze(-1)).to(x.dtype)
    grad = g * active.sum(1)
    grad = grad.scatter_add(1, safe, -g * active.sum(-1) * valid.to(x.dtype))
    grad = _by_grad_output(grad, grad_output.reshape(-1) if reduction == _NONE else grad_output, reduction)
    return grad.reshape(x.shape)


def _distance_derivative(diff: torch.Tensor, dist: torch.Tensor, p: float) -> torch.Tensor:
    """d dist / d diff, as Distance.cpp has it per p (0 where the distance is 0)."""
    zero = torch.zeros_like(diff)
    if p == 0:
        return zero
    if p == 1:
        return torch.sign(diff)
    if p == float("inf"):
        return torch.sign(diff) * (diff.abs() == dist).to(diff.dtype)
    safe = torch.where(dist == 0, torch.ones_like(dist), dist)
    if p < 2:
        value = torch.sign(diff) * diff.abs().pow(p - 1) / safe.pow(p - 1)
        dead = (dist == 0) | ((diff == 0) & (p < 1))
        return torch.where(dead, zero, value)
    if p == 2:
        return torch.where(dist == 0, zero, diff / safe)
    return torch.where(dist == 0, zero, diff * diff.abs().pow(p - 2) / safe.pow(p - 1))


def cdist_backward(grad: torch.Tensor, x1: torch.Tensor, x2: torch.Tensor, p: float, cdist: torch.Tensor) -> torch.Tensor:
    diff = x1.unsqueeze(-2) - x2.unsqueeze(-3)  # (..., P, R, M)
    derivative = _distance_derivative(diff, cdist.unsqueeze(-1), p)
    return (grad.unsqueeze(-1) * derivative).sum(-2)


def pdist_backward(grad: torch.Tensor, x: torch.Tensor, p: float, pdist: torch.Tensor) -> torch.Tensor:
    """Pairs ``i < j`` in row-major order; each pair's term goes to ``x[i]`` and, negated, ``x[j]``."""
    n = x.size(0)
    pairs = torch.triu_indices(n, n, 1, device=x.device)
    first, second = pairs[0], pairs[1]
    diff = x.index_select(0, first) - x.index_select(0, second)
    term = grad.unsqueeze(-1) * _distance_derivative(diff, pdist.unsqueeze(-1), p)
    out = torch.zeros_like(x)
    out = aten.index_put.default(out, [first], term, True)
    return aten.index_put.default(out, [second], -term, True)


DECOMPOSITIONS: dict[Any, Callable] = {
    aten.multi_margin_loss_backward.default: multi_margin_loss_backward,
    aten.multilabel_margin_loss_backward.default: multilabel_margin_loss_backward,
    tc.resolve_overload("aten", "_cdist_backward.default"): cdist_backward,
    tc.resolve_overload("aten", "_pdist_backward.default"): pdist_backward,
}
