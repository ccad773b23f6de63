"""Which fused attention kernel a GPU host would run, decided on a host without a GPU.

``scaled_dot_product_attention`` asks ``aten._fused_sdp_choice`` for a kernel, and
its result's strides follow the kernel: flash and cuDNN return the query's layout,
memory-efficient attention a (batch, seq, heads, dim) layout seen through a
transpose, the math kernel a dense (batch, heads, seq, dim) one. What the model
does next depends on those strides (``transpose(1, 2).reshape(...)`` is a view of
a fused kernel's result and a copy of the math kernel's), so the program does too.

On a host without a GPU, a fake CUDA tensor's choice runs the CPU build's kernel
and always says math, so a build machine exported another program than the GPU
host (docs/runs/gpu-torch-2.11.md: 33 of 48 corpus programs apart). Here the
choice follows torch's CUDA rules for a datacenter GPU of compute capability 8.0
9.0 (H100, H200: cuDNN attention first, as torch prefers it there), in its
priority order, for the checks that depend on the arguments and on
``torch.backends.cuda``'s switches (``sdpa_kernel``). It is pinned against the
real choice on an H200 by tests/cuda/test_cuda.py. On an A100 (no cuDNN
preference) the layout differs only where a query not laid out as (batch, seq,
heads, dim) meets a mask or a non-square causal mask.
"""

from __future__ import annotations

from typing import Any

import torch

_HALF = (torch.float16, torch.bfloat16)
MATH, FLASH, EFFICIENT, CUDNN = 0, 1, 2, 3  # torch.nn.attention.SDPBackend values


def fused_sdp_choice_on_gpu(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0,
                            is_causal: bool = False, scale: float | None = None,
                            enable_gqa: bool = False) -> int:
    """The backend an sm90 GPU picks for these arguments (an ``SDPBackend`` value)."""
    switches = torch.backends.cuda
    if not _fused_may_take(query, key, value, attn_mask):
        return MATH
    if switches.cudnn_sdp_enabled() and _cudnn_fits(query, key, value, enable_gqa):
        return CUDNN
    if switches.flash_sdp_enabled() and _flash_fits(query, key, value, attn_mask, is_causal, enable_gqa):
        return FLASH
    if switches.mem_efficient_sdp_enabled() and _efficient_fits(query, key, value):
        return EFFICIENT
    return MATH


def _fused_may_take(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: Any) -> bool:
    """What every fused CUDA kernel asks: unit last-dim strides (the mask's too, as the
    caller gave it: a mask broadcast along its last dim goes to the math kernel), and a
    mask of 2 or 4 dims that does not require grad."""
    if any(t.stride(-1) != 1 for t in (query, key, value)):
        return False
    if attn_mask is None:
        return True
    return attn_mask.stride(-1) == 1 and attn_mask.dim() in (2, 4) and not attn_mask.requires_grad


def _dense_4d(*tensors: torch.Tensor) -> bool:
    return all(t.dim() == 4 and t.layout == torch.strided and not t.is_nested for t in tensors)


def _same_heads(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, enable_gqa: bool) -> bool:
    if query.size(0) != key.size(0) or key.size(0) != value.size(0) or key.size(1) != value.size(1):
        return False
    return query.size(1) == key.size(1) or (enable_gqa and query.size(1) % key.size(1) == 0)


def _flash_fits(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: Any,
                is_causal: bool, enable_gqa: bool) -> bool:
    head_dim = query.size(-1)
    return (_dense_4d(query, key, value) and query.dtype in _HALF
            and query.dtype == key.dtype == value.dtype and attn_mask is None
            and key.size(-1) == head_dim and value.size(-1) == head_dim
            and head_dim <= 256  # padded to a multiple of 8 by sdpa
            and not (is_causal and query.size(-2) != key.size(-2))
            and _same_heads(query, key, value, enable_gqa))


def _cudnn_fits(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, enable_gqa: bool) -> bool:
    head_dim = query.size(-1)
    return (_dense_4d(query, key, value) and query.dtype in _HALF
            and query.dtype == key.dtype == value.dtype
            and key.size(-1) == head_dim and value.size(-1) == head_dim
            and head_dim <= 256 and head_dim % 8 == 0
            and _same_heads(query, key, value, enable_gqa))


def _efficient_fits(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> bool:
    alignment = 8 if query.dtype in _HALF else 4
    return (_dense_4d(query, key, value) and query.dtype in (*_HALF, torch.float32)
            and query.dtype == key.dtype == value.dtype and key.size(-1) == query.size(-1)
            and query.size(-1) % alignment == 0 and value.size(-1) % alignment == 0
            and query.size(-1) > 0 and value.size(-1) > 0
            and _same_heads(query, key, value, False))
