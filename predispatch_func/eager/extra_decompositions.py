"""ATen decompositions torch lacks, or gets wrong for eager, for ops eager kernels call.

torch decomposes these only into prims (``torch._refs``), which no ATen op set
holds, and export never meets them (its functional batch norm takes another
path), but eager's CPU ``native_batch_norm`` decomposition calls ``var_mean``, and autograd
allocates gradient buffers with ``new_empty_strided``.
Each is a one-line restatement in ops of Core ATen; the op_db coverage run
checks each against eager.

``CORRECTED``: CPU flash attention's decomposition in torch returns the
attention weights as its second output where the kernel returns the
logsumexp (in the kernel's layout); a caller of the op reads it, so ours
returns the logsumexp, computed in the same pass as the output.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from .. import _torch_compat as tc

aten = torch.ops.aten


def _var_mean_correction(x: torch.Tensor, dim: Any = None, *, correction: Any = None,
                         keepdim: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    return (aten.var.correction(x, dim, correction=correction, keepdim=keepdim),
            aten.mean.dim(x, dim, keepdim=keepdim) if dim is not None else
            aten.mean.dim(x, list(range(x.dim())), keepdim=keepdim))


def _new_empty_strided(x: torch.Tensor, size: Any, stride: Any, *, dtype: Any = None, layout: Any = None,
                       device: Any = None, pin_memory: Any = None) -> torch.Tensor:
    return aten.empty_strided.default(size, stride, dtype=dtype or x.dtype, layout=layout or x.layout,
                                      device=device or x.device, pin_memory=pin_memory)


TABLE: dict[Any, Callable] = {
    aten.var_mean.correction: _var_mean_correction,
    aten.new_empty_strided.default: _new_empty_strided,  # autograd allocates gradients with it
}


_FLASH_CPU: Any = tc.resolve_overload("aten", "_scaled_dot_product_flash_attention_for_cpu.default")


def _flash_attention_for_cpu(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, dropout_p: float = 0.0,
                             is_causal: bool = False, *, attn_mask: Any = None,
                             scale: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One pass: the scores once, their logsumexp (the kernel's second output), the weights as
    ``exp(scores - logsumexp)`` (0 in a row with nothing to attend to, as torch's safe softmax),
    the output in the kernel's memory layout. torch's decomposition (the math attention) computes
    the scores as well but returns the weights, and allows no dropout either."""
    if dropout_p != 0.0:  # as torch's decomposition: the kernel's dropout mask cannot be reproduced
        raise NotImplementedError(f"{_FLASH_CPU}: no decomposition with dropout (dropout_p={dropout_p})")
    accumulate = torch.float32 if query.dtype in (torch.float16, torch.bfloat16) else query.dtype
    groups = query.size(1) // key.size(1)
    keys = key.repeat_interleave(groups, 1) if groups > 1 else key
    values = value.repeat_interleave(groups, 1) if groups > 1 else value
    scores = (query.to(accumulate) @ keys.to(accumulate).transpose(-2, -1)) * (
        scale if scale is not None else 1 / math.sqrt(query.size(-1)))
    if is_causal:
        allowed = torch.ones(query.size(-2), key.size(-2), dtype=torch.bool, device=query.device).tril()
        scores = scores.masked_fill(~allowed, float("-inf"))
    if attn_mask is not None:
        scores = (scores.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool
                  else scores + attn_mask.to(accumulate))
    logsumexp = scores.logsumexp(-1, keepdim=True)
    finite = torch.where(logsumexp == float("-inf"), torch.zeros_like(logsumexp), logsumexp)
    output = ((scores - finite).exp() @ values.to(accumulate)).to(query.dtype)
    output = output.permute(2, 0, 1, 3).contiguous().permute(1, 2, 0, 3)  # the kernel's (len, batch, heads) memory
    # eager's derivative treats the logsumexp as not differentiable; kept in the kernel's (batch, len, heads) memory
    return output, logsumexp.squeeze(-1).detach().transpose(1, 2).contiguous().transpose(1, 2)


CORRECTED: dict[Any, Callable] = {_FLASH_CPU: _flash_attention_for_cpu}


def for_op(op: Any) -> Callable | None:
    return TABLE.get(op) or CORRECTED.get(op)
