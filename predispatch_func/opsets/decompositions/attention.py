"""CPU flash attention and its backward, restated in Core ATen.

torch's decomposition of ``_scaled_dot_product_flash_attention_for_cpu`` (the math attention)
returns the attention weights as its second output where the kernel returns the logsumexp (in
the kernel's layout), which its backward reads: a program lowering a direct call of the op
returned the weights, silently (found by scripts/joint_opinfo.py). Ours returns the logsumexp,
computed in the same pass as the output; and the fused backward, which torch does not decompose.
Shared by ``pf.eager`` (where it replaced torch's first) and ``export(..., target=)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from ... import _torch_compat as tc

_FLASH_CPU: Any = tc.resolve_overload("aten", "_scaled_dot_product_flash_attention_for_cpu.default")


def _scores(query: torch.Tensor, keys: torch.Tensor, is_causal: bool, attn_mask: Any, scale: Any,
            accumulate: torch.dtype) -> tuple[torch.Tensor, float]:
    """The attention scores, masked, and the scale they were taken with."""
    scale = scale if scale is not None else 1 / math.sqrt(query.size(-1))
    scores = (query.to(accumulate) @ keys.to(accumulate).transpose(-2, -1)) * scale
    if is_causal:
        allowed = torch.ones(query.size(-2), keys.size(-2), dtype=torch.bool, device=query.device).tril()
        scores = scores.masked_fill(~allowed, float("-inf"))
    if attn_mask is not None:
        scores = (scores.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool
                  else scores + attn_mask.to(accumulate))
    return scores, scale


def _accumulate(query: torch.Tensor) -> torch.dtype:
    return torch.float32 if query.dtype in (torch.float16, torch.bfloat16) else query.dtype


def _per_query_head(t: torch.Tensor, groups: int) -> torch.Tensor:
    return t.repeat_interleave(groups, 1) if groups > 1 else t


def _finite(logsumexp: torch.Tensor) -> torch.Tensor:
    """0 where a row attends to nothing (logsumexp -inf), so its weights ``exp(-inf - 0)`` are 0."""
    return torch.where(logsumexp == float("-inf"), torch.zeros_like(logsumexp), logsumexp)


def _flash_attention_for_cpu(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, dropout_p: float = 0.0,
                             is_causal: bool = False, *, attn_mask: Any = None,
                             scale: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One pass: the scores once, their logsumexp (the kernel's second output, which its
    backward reads), the weights as ``exp(scores - logsumexp)`` (0 in a row with nothing to
    attend to, as torch's safe softmax), the output laid out as the kernel's. torch's
    decomposition (the math attention) returns the weights instead, and allows no dropout either."""
    if dropout_p != 0.0:  # as torch's decomposition: the kernel's dropout mask cannot be reproduced
        raise NotImplementedError(f"{_FLASH_CPU}: no decomposition with dropout (dropout_p={dropout_p})")
    accumulate, groups = _accumulate(query), query.size(1) // key.size(1)
    scores, _ = _scores(query, _per_query_head(key, groups), is_causal, attn_mask, scale, accumulate)
    # a row with nothing to attend to (every score -inf): its logsumexp taken over zeros and its weights
    # set to 0, so differentiated above autograd (export) it has eager's gradient 0, not softmax's NaN
    empty = (scores == float("-inf")).all(-1, keepdim=True)
    scores = torch.where(empty, torch.zeros_like(scores), scores)
    logsumexp = scores.logsumexp(-1, keepdim=True)
    weights = torch.where(empty, torch.zeros_like(scores), (scores - logsumexp).exp())
    output = (weights @ _per_query_head(value, groups).to(accumulate)).to(query.dtype)
    logsumexp = torch.where(empty, torch.full_like(logsumexp, float("-inf")), logsumexp)
    if not query.is_contiguous() and query.transpose(1, 2).is_contiguous():  # the kernel's output is laid out
        output = output.transpose(1, 2).contiguous().transpose(1, 2)  # like the query: (batch, len, heads)
    # eager's derivative treats the logsumexp as not differentiable; kept in the kernel's (batch, len, heads) memory
    return output, logsumexp.squeeze(-1).detach().transpose(1, 2).contiguous().transpose(1, 2)


def _flash_attention_for_cpu_backward(grad_out: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                                      value: torch.Tensor, out: torch.Tensor, logsumexp: torch.Tensor,
                                      dropout_p: float, is_causal: bool, *, attn_mask: Any = None,
                                      scale: Any = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The fused backward, restated: the weights rebuilt from the scores and the forward's
    logsumexp, then the four products of attention's backward; keys and values shared by a
    group of query heads (GQA) get the sum of the group's gradients."""
    if dropout_p != 0.0:
        raise NotImplementedError(f"{_FLASH_CPU}: no decomposition with dropout (dropout_p={dropout_p})")
    accumulate, groups = _accumulate(query), query.size(1) // key.size(1)
    keys, values = _per_query_head(key, groups).to(accumulate), _per_query_head(value, groups).to(accumulate)
    scores, scale = _scores(query, keys, is_causal, attn_mask, scale, accumulate)
    weights = (scores - _finite(logsumexp.to(accumulate).unsqueeze(-1))).exp()
    grad, output = grad_out.to(accumulate), out.to(accumulate)
    grad_values = weights.transpose(-2, -1) @ grad
    grad_scores = weights * (grad @ values.transpose(-2, -1) - (grad * output).sum(-1, keepdim=True))
    grad_query = (grad_scores @ keys) * scale
    grad_keys = (grad_scores.transpose(-2, -1) @ query.to(accumulate)) * scale
    if groups > 1:
        batch, heads, length, dim = key.shape
        grad_keys = grad_keys.reshape(batch, heads, groups, length, dim).sum(2)
        grad_values = grad_values.reshape(batch, heads, groups, length, value.size(-1)).sum(2)
    return grad_query.to(query.dtype), grad_keys.to(key.dtype), grad_values.to(value.dtype)


_FLASH_CPU_BACKWARD: Any = tc.resolve_overload("aten", "_scaled_dot_product_flash_attention_for_cpu_backward.default")
DECOMPOSITIONS: dict[Any, Callable] = {_FLASH_CPU: _flash_attention_for_cpu,
                                       _FLASH_CPU_BACKWARD: _flash_attention_for_cpu_backward}
