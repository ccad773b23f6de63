"""Batch norm's backward in fewer ops than torch's decomposition, with the same values.

Every BatchNorm layer of a training step calls ``native_batch_norm_backward``, which is outside
Core ATen. torch's decomposition spells it out in some 30 ops: it broadcasts each per-channel
vector by one ``unsqueeze`` per dimension (four vectors, twelve calls for an image), computes
``input - mean`` over the whole input twice, and multiplies the scale by 1.0 when there is no
weight. Under ``pf.eager.on(core_aten)`` each is a call a step pays for in every layer (a conv
net's batch norms were a third of its warm step's cost above eager).

This one makes the same calls in the same order where they compute anything: one ``view`` a
vector, ``input - mean`` once, nothing multiplied by 1.0. The reductions are the same sums over
the same tensors and every elementwise op the same op on the same operands, so the results are
torch's decomposition's bit for bit (pinned by tests/opsets/test_normalization.py), and a
backend's gradients do not move with the choice. (They are not eager's fused kernel's bits:
its sums run in another order; docs/joint.md.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

aten = torch.ops.aten


def _computation_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype torch's decomposition computes in: float32 for the half types, else the input's."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def native_batch_norm_backward(grad_out: torch.Tensor, input: torch.Tensor, weight: Any,  # noqa: A002
                               running_mean: Any, running_var: Any, save_mean: Any, save_invstd: Any,
                               train: bool, eps: float, output_mask: list[bool]) -> Any:
    if input.dim() < 2:
        raise AssertionError(f"rank of the input must be at least 2, got {input.dim()}")
    computation = _computation_dtype(input.dtype)
    weight_dtype = input.dtype if weight is None else weight.dtype

    def cast(value: Any) -> Any:
        return None if value is None else value.to(computation)

    grad = cast(grad_out)
    x = cast(input)
    if train:
        if save_mean is None or save_invstd is None:
            raise AssertionError("mean and invstd must not be None in training mode")
        mean, invstd = cast(save_mean), cast(save_invstd)
    else:
        if running_mean is None or running_var is None:
            raise AssertionError("running_mean and running_var must not be None in eval mode")
        mean, invstd = cast(running_mean), torch.rsqrt(cast(running_var) + eps)

    per_channel = [1] * input.dim()
    per_channel[1] = input.shape[1]
    reduced = [axis for axis in range(input.dim()) if axis != 1]
    norm = 1.0 / (input.numel() / input.shape[1])

    centered = x - mean.view(per_channel)
    grad_sum = torch.sum(grad, reduced)
    dot = torch.sum(grad * centered, reduced)
    scale = invstd if weight is None else invstd * cast(weight)
    if train:
        projection = centered * torch.mul(dot * norm, invstd * invstd).view(per_channel)
        grad_input = ((grad - projection) - (grad_sum * norm).view(per_channel)) * scale.view(per_channel)
    else:
        grad_input = grad * scale.view(per_channel)
    grad_weight = (dot * invstd).to(weight_dtype) if output_mask[1] else None
    grad_bias = grad_sum.to(weight_dtype) if output_mask[2] else None
    return grad_input.to(input.dtype), grad_weight, grad_bias


DECOMPOSITIONS: dict[Any, Callable] = {
    aten.native_batch_norm_backward.default: native_batch_norm_backward,
}
