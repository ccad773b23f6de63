"""Backward kernels of pooling, upsampling and replication padding, as scatters.

Each of these forward ops reads every output element from a few input
elements, chosen by index arithmetic on the sizes alone (or, for max pooling,
recorded in the forward's ``indices``). Its backward adds each output gradient,
weighted, into those input elements: a ``scatter_add`` (duplicates accumulate,
as the kernels' ``+=`` does). Upsampling, average pooling and padding are
separable, so the backward runs one dim at a time. The index arithmetic follows
the CPU kernels (``UpSample.h``'s source-index and nearest-index rules, float
arithmetic for nearest as the kernel has it), so the same input elements
receive the gradient.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ... import _torch_compat as tc

aten = torch.ops.aten
_CUBIC_A = -0.75


def _scatter_along(grad: torch.Tensor, dim: int, size: int, index: torch.Tensor,
                   weight: torch.Tensor | None) -> torch.Tensor:
    """The input gradient along ``dim`` (of length ``size``) from ``grad``, whose position ``o``
    along ``dim`` adds ``weight[o] * grad[o]`` into input position ``index[o]``."""
    shape = [1] * grad.dim()
    shape[dim] = -1
    if weight is not None:
        grad = grad * weight.to(grad.dtype).view(shape)
    full = list(grad.shape)
    full[dim] = size
    return grad.new_zeros(full).scatter_add(dim, index.view(shape).expand(grad.shape), grad)


def _accumulate_taps(grad: torch.Tensor, dim: int, size: int,
                     taps: Sequence[tuple[torch.Tensor, torch.Tensor | None]]) -> torch.Tensor:
    total = None
    for index, weight in taps:
        part = _scatter_along(grad, dim, size, index, weight)
        total = part if total is None else total + part
    assert total is not None
    return total


# --- upsampling ----------------------------------------------------------------------------


def _area_scale(in_size: int, out_size: int, align_corners: bool, scale: Any) -> float:
    if align_corners:
        return (in_size - 1) / (out_size - 1) if out_size > 1 else 0.0
    return 1.0 / scale if scale is not None and scale > 0 else in_size / out_size


def _source(out_size: int, ratio: float, align_corners: bool, cubic: bool, dtype: torch.dtype,
            device: Any) -> torch.Tensor:
    """Each output position's real source coordinate, in the kernel's arithmetic type."""
    position = torch.arange(out_size, device=device, dtype=dtype)
    if align_corners:
        return position * ratio
    source = (position + 0.5) * ratio - 0.5
    return source if cubic else source.clamp(min=0)


def _guarded(source: torch.Tensor, in_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's guard: index floor(source), at most the last; lambda the rest, in [0, 1]."""
    index = torch.floor(source).to(torch.int64).clamp(max=in_size - 1)
    return index, (source - index).clamp(0, 1)


def _opmath(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _linear_taps(in_size: int, out_size: int, align_corners: bool, scale: Any, dtype: torch.dtype,
                 device: Any) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    if in_size == out_size:  # the kernel copies
        return [(torch.arange(out_size, device=device), None)]
    ratio = _area_scale(in_size, out_size, align_corners, scale)
    index, lambda1 = _guarded(_source(out_size, ratio, align_corners, False, _opmath(dtype), device), in_size)
    following = index + (index < in_size - 1).to(torch.int64)
    return [(index, 1 - lambda1), (following, lambda1)]


def _cubic_taps(in_size: int, out_size: int, align_corners: bool, scale: Any, dtype: torch.dtype,
                device: Any) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    ratio = _area_scale(in_size, out_size, align_corners, scale)
    index, t = _guarded(_source(out_size, ratio, align_corners, True, _opmath(dtype), device), in_size)
    a = _CUBIC_A

    def near(x: torch.Tensor) -> torch.Tensor:  # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x: torch.Tensor) -> torch.Tensor:  # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    weights = (far(t + 1), near(t), near(1 - t), far(2 - t))
    return [((index - 1 + k).clamp(0, in_size - 1), w) for k, w in enumerate(weights)]


def _as_float32(value: float) -> float:
    """``value`` rounded to float32, as the nearest kernels compute their scale."""
    return struct.unpack("f", struct.pack("f", value))[0]


def _nearest_taps(exact: bool) -> Callable:
    def taps(in_size: int, out_size: int, align_corners: bool, scale: Any, dtype: torch.dtype,
             device: Any) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        position = torch.arange(out_size, device=device, dtype=torch.float32)
        if not exact and out_size == in_size:
            return [(torch.arange(out_size, device=device), None)]
        if not exact and out_size == 2 * in_size:
            return [(torch.div(torch.arange(out_size, device=device), 2, rounding_mode="floor"), None)]
        ratio = _as_float32(1.0 / scale if scale is not None and scale > 0 else in_size / out_size)
        source = (position + 0.5) * ratio if exact else position * ratio
        return [(torch.floor(source).to(torch.int64).clamp(max=in_size - 1), None)]
    return taps


def _upsample_backward(taps_for: Callable, spatial: int, align_corners_arg: bool) -> Callable:
    def decomposition(grad_output: torch.Tensor, output_size: Sequence[int], input_size: Sequence[int],
                      *rest: Any) -> torch.Tensor:
        if align_corners_arg:
            align_corners, scales = rest[0], list(rest[1:])
        else:
            align_corners, scales = False, list(rest)
        scales += [None] * (spatial - len(scales))
        grad = grad_output
        leading = grad.dim() - spatial
        for k in range(spatial):
            dim = leading + k
            taps = taps_for(input_size[dim], output_size[k], align_corners, scales[k], grad.dtype, grad.device)
            grad = _accumulate_taps(grad, dim, input_size[dim], taps)
        return grad.contiguous()
    return decomposition


# --- pooling ------------------------------------------------------------------------------


def _max_pool_backward(spatial: int, indices_at: int) -> Callable:
    def decomposition(grad_output: torch.Tensor, x: torch.Tensor, *rest: Any) -> torch.Tensor:
        """Each output gradient into the input element its ``indices`` entry (flat in the
        input's spatial plane) names."""
        indices = rest[indices_at]
        planes = x.shape[:x.dim() - spatial]
        flat_in = x.shape[x.dim() - spatial:].numel()
        grad = grad_output.reshape(*planes, -1)
        zeros = grad.new_zeros(*planes, flat_in)
        return zeros.scatter_add(-1, indices.reshape(*planes, -1), grad).view(x.shape)
    return decomposition


def _window_taps(starts: torch.Tensor, ends: torch.Tensor, weight: torch.Tensor, longest: int,
                 in_size: int) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """One tap per window offset ``k < longest``: position ``start + k`` with ``weight`` where it
    lies inside ``[start, end)``, else weight 0 (position clamped into range)."""
    taps: list[tuple[torch.Tensor, torch.Tensor | None]] = []
    for k in range(longest):
        position = starts + k
        inside = (position < ends).to(weight.dtype)
        taps.append((position.clamp(0, in_size - 1), weight * inside))
    return taps


def _adaptive_avg_pool_backward(spatial: int) -> Callable:
    def decomposition(grad_output: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        grad = grad_output
        leading = x.dim() - spatial
        for k in range(spatial):
            dim, in_size, out_size = leading + k, x.size(leading + k), grad_output.size(leading + k)
            o = torch.arange(out_size, device=x.device)
            starts = torch.div(o * in_size, out_size, rounding_mode="floor")
            ends = torch.div((o + 1) * in_size + out_size - 1, out_size, rounding_mode="floor")
            longest = max(-(-(i + 1) * in_size // out_size) - (i * in_size // out_size) for i in range(out_size))
            weight = 1 / (ends - starts).to(grad.dtype)
            grad = _accumulate_taps(grad, dim, in_size, _window_taps(starts, ends, weight, longest, in_size))
        return grad.contiguous()
    return decomposition


def avg_pool3d_backward(grad_output: torch.Tensor, x: torch.Tensor, kernel_size: Sequence[int],
                        stride: Sequence[int], padding: Sequence[int], ceil_mode: bool, count_include_pad: bool,
                        divisor_override: Any) -> torch.Tensor:
    """The divisor of a window is a product over dims (of the padded or the in-bounds
    extent, or an override), so the backward is separable like the rest."""
    grad = grad_output
    leading = x.dim() - 3
    stride = stride or kernel_size
    for k in range(3):
        dim, in_size, out_size = leading + k, x.size(leading + k), grad_output.size(leading + k)
        size = kernel_size[k if len(kernel_size) > 1 else 0]
        step = stride[k if len(stride) > 1 else 0]
        pad = padding[k if len(padding) > 1 else 0]
        o = torch.arange(out_size, device=x.device)
        starts = o * step - pad
        ends = torch.minimum(starts + size, torch.full_like(starts, in_size + pad))
        padded_extent = ends - starts
        starts, ends = starts.clamp(min=0), ends.clamp(max=in_size)
        if divisor_override:
            weight = torch.ones_like(starts, dtype=grad.dtype) / (divisor_override if k == 0 else 1)
        else:
            weight = 1 / (padded_extent if count_include_pad else ends - starts).to(grad.dtype)
        grad = _accumulate_taps(grad, dim, in_size, _window_taps(starts, ends, weight, size, in_size))
    return grad.contiguous()


# --- padding and shrinking ---------------------------------------------------------------


def _replication_pad_backward(spatial: int) -> Callable:
    def decomposition(grad_output: torch.Tensor, x: torch.Tensor, padding: Sequence[int]) -> torch.Tensor:
        """Output position ``o`` read input ``clamp(o - left, 0, size - 1)``; padding lists
        (left, right) from the last dim backwards."""
        grad = grad_output
        for k in range(spatial):
            dim = x.dim() - 1 - k
            left, in_size = padding[2 * k], x.size(dim)
            source = (torch.arange(grad.size(dim), device=x.device) - left).clamp(0, in_size - 1)
            grad = _scatter_along(grad, dim, in_size, source, None)
        return grad.contiguous()
    return decomposition


DECOMPOSITIONS: dict[Any, Callable] = {
    aten.upsample_linear1d_backward.default: _upsample_backward(_linear_taps, 1, True),
    aten.upsample_bilinear2d_backward.default: _upsample_backward(_linear_taps, 2, True),
    aten.upsample_trilinear3d_backward.default: _upsample_backward(_linear_taps, 3, True),
    aten.upsample_bicubic2d_backward.default: _upsample_backward(_cubic_taps, 2, True),
    aten.upsample_nearest1d_backward.default: _upsample_backward(_nearest_taps(exact=False), 1, False),
    tc.resolve_overload("aten", "_upsample_nearest_exact1d_backward.default"): _upsample_backward(_nearest_taps(exact=True), 1, False),
    # 2d and 3d: met where the forward stays whole (upsample_nearest2d is Core ATen), as HRNet's
    aten.upsample_nearest2d_backward.default: _upsample_backward(_nearest_taps(exact=False), 2, False),
    aten.upsample_nearest3d_backward.default: _upsample_backward(_nearest_taps(exact=False), 3, False),
    tc.resolve_overload("aten", "_upsample_nearest_exact2d_backward.default"): _upsample_backward(_nearest_taps(exact=True), 2, False),
    tc.resolve_overload("aten", "_upsample_nearest_exact3d_backward.default"): _upsample_backward(_nearest_taps(exact=True), 3, False),
    aten.max_pool3d_with_indices_backward.default: _max_pool_backward(3, 5),
    aten.adaptive_max_pool2d_backward.default: _max_pool_backward(2, 0),
    aten.adaptive_max_pool3d_backward.default: _max_pool_backward(3, 0),
    aten.fractional_max_pool2d_backward.default: _max_pool_backward(2, 2),
    aten.fractional_max_pool3d_backward.default: _max_pool_backward(3, 2),
    tc.resolve_overload("aten", "_adaptive_avg_pool3d_backward.default"): _adaptive_avg_pool_backward(3),
    aten.avg_pool3d_backward.default: avg_pool3d_backward,
    aten.replication_pad1d_backward.default: _replication_pad_backward(1),
    aten.replication_pad2d_backward.default: _replication_pad_backward(2),
}


# --- embedding bags -----------------------------------------------------------------------

_SUM, _MEAN, _MAX = 0, 1, 2
_EMBEDDING_BAG: Any = tc.resolve_overload("aten", "_embedding_bag.default")


def embedding_bag_forward_only(weight: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor,
                               scale_grad_by_freq: bool = False, mode: int = 0, sparse: bool = False,
                               per_sample_weights: Any = None, include_last_offset: bool = False,
                               padding_idx: int = -1) -> Any:
    """The op without autograd's bookkeeping: ``_embedding_bag`` (Core ATen) computes the same
    bags and, besides, the bookkeeping."""
    return _EMBEDDING_BAG(weight, indices, offsets, scale_grad_by_freq, mode, sparse,
                          per_sample_weights, include_last_offset, padding_idx)


def _bags(indices: torch.Tensor, offsets: torch.Tensor, offset2bag: torch.Tensor) -> torch.Tensor:
    """Each index's bag: the forward's ``offset2bag``, or (where the kernel left it empty) the
    number of offsets at or below the index's position, less one."""
    if offset2bag.numel() == indices.numel():
        return offset2bag
    position = torch.arange(indices.numel(), device=indices.device)
    return (offsets.unsqueeze(0) <= position.unsqueeze(1)).sum(1) - 1


def embedding_bag_backward(grad: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor,
                           offset2bag: torch.Tensor, bag_size: torch.Tensor, maximum_indices: torch.Tensor,
                           num_weights: int, scale_grad_by_freq: bool, mode: int, sparse: bool,
                           per_sample_weights: Any, padding_idx: int = -1) -> torch.Tensor:
    """The weight's gradient: each bag's gradient added into the rows its indices name (scaled
    by the sample's weight, by 1/bag size for mean, by 1/frequency if asked), or for max into
    the rows ``maximum_indices`` recorded; the padding row gets none."""
    if sparse:
        return NotImplemented  # a sparse gradient: not a strided tensor
    dim = grad.size(-1)
    if mode == _MAX:
        rows = maximum_indices.reshape(-1)
        values = grad.reshape(-1)
        columns = torch.arange(dim, device=grad.device).repeat(grad.size(0))
        keep = (bag_size.repeat_interleave(dim) > 0) & (rows >= 0)
        values = torch.where(keep, values, torch.zeros_like(values))
        rows = torch.where(keep, rows, torch.zeros_like(rows))
        return aten.index_put.default(grad.new_zeros(num_weights, dim), [rows, columns], values, True)
    bags = _bags(indices, offsets, offset2bag)
    contribution = grad.index_select(0, bags)
    scale = torch.ones_like(indices, dtype=grad.dtype)
    if per_sample_weights is not None:
        scale = scale * per_sample_weights.to(grad.dtype)
    if mode == _MEAN:
        size = bag_size.index_select(0, bags).to(grad.dtype)
        scale = scale / torch.where(size == 0, torch.ones_like(size), size)
    if scale_grad_by_freq:
        counts = torch.zeros(num_weights, dtype=grad.dtype, device=grad.device).scatter_add(
            0, indices, torch.ones_like(indices, dtype=grad.dtype))
        scale = scale / counts.index_select(0, indices)
    if padding_idx >= 0:
        scale = torch.where(indices == padding_idx, torch.zeros_like(scale), scale)
    return aten.index_put.default(grad.new_zeros(num_weights, dim), [indices], contribution * scale.unsqueeze(-1), True)


def embedding_bag_per_sample_weights_backward(grad: torch.Tensor, weight: torch.Tensor, indices: torch.Tensor,
                                              offsets: torch.Tensor, offset2bag: torch.Tensor, mode: int,
                                              padding_idx: int = -1) -> torch.Tensor:
    """Each sample's weight multiplied its row into its bag's sum: its gradient is the dot of
    that row with the bag's gradient (0 for the padding index)."""
    bags = _bags(indices, offsets, offset2bag)
    dots = (grad.index_select(0, bags) * weight.index_select(0, indices).to(grad.dtype)).sum(-1)
    if padding_idx >= 0:
        dots = torch.where(indices == padding_idx, torch.zeros_like(dots), dots)
    return dots


def embedding_renorm(weight: torch.Tensor, indices: torch.Tensor, max_norm: float, norm_type: float) -> torch.Tensor:
    """(The functional form of ``embedding_renorm_``, what ``max_norm`` runs.) Each row some
    index names whose norm exceeds ``max_norm`` scaled by ``max_norm / (norm + 1e-7)``."""
    named = torch.zeros(weight.size(0), dtype=torch.bool, device=weight.device).index_put(
        [indices.reshape(-1)], torch.ones((), dtype=torch.bool, device=weight.device))
    magnitude = weight.abs()
    if norm_type == float("inf"):
        norms = magnitude.amax(-1, keepdim=True)
    elif norm_type == 1:
        norms = magnitude.sum(-1, keepdim=True)
    elif norm_type == 2:
        norms = (magnitude * magnitude).sum(-1, keepdim=True).sqrt()
    else:  # written out: linalg_vector_norm has no decomposition into ATen on torch 2.13
        norms = magnitude.pow(norm_type).sum(-1, keepdim=True).pow(1.0 / norm_type)
    scale = max_norm / (norms + 1e-7)
    rescale = named.unsqueeze(-1) & (norms > max_norm)
    return torch.where(rescale, weight * scale, weight)


DECOMPOSITIONS.update({
    aten.embedding_renorm.default: embedding_renorm,
    tc.resolve_overload("aten", "_embedding_bag_forward_only.default"): embedding_bag_forward_only,
    tc.resolve_overload("aten", "_embedding_bag_backward.default"): embedding_bag_backward,
    tc.resolve_overload("aten", "_embedding_bag_per_sample_weights_backward.default"):
        embedding_bag_per_sample_weights_backward,
})
