"""Grid sampling: ``grid_sampler_3d`` and the backward kernels of the 2-d and 3-d samplers.

torch decomposes ``grid_sampler_2d``'s forward only. A sample is a weighted sum of input
values at a few integer positions (taps): 2 per dimension for (bi/tri)linear
interpolation, 1 for nearest, 4 for bicubic (2-d only). Each tap here is its flat index
into the input's spatial positions, whether it lies inside, its weight, and the weight's
derivative along each grid coordinate. Then the forward gathers, the input's gradient
scatter-adds the output's gradient with the same weights (the transposed map), and the
grid's gradient is the sum over taps of the weight's derivative times the input value.

The coordinates follow the documented rules of ``grid_sample``: a grid value ``g`` in
[-1, 1] maps to ``(g + 1) / 2 * (size - 1)`` with ``align_corners``, else to
``((g + 1) * size - 1) / 2``; ``border`` clamps it to the input, ``reflection`` reflects
it about the borders (the corner pixels' centres with ``align_corners``, their outer edges
without) and then clamps; ``zeros`` leaves it, and taps outside read zero. The clamp's
derivative is 0 outside and 1 inside, including at the bounds; a reflection flips its
sign. Nearest rounds half to even (its grid gradient is zero). Bicubic uses Keys' cubic
convolution kernel with ``a = -0.75`` on the unnormalized coordinate, each tap's integer
position padded on its own.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from typing import Any

import torch

aten = torch.ops.aten

BILINEAR, NEAREST, BICUBIC = 0, 1, 2
ZEROS, BORDER, REFLECTION = 0, 1, 2
_CUBIC_A = -0.75


@dataclasses.dataclass
class _Axis:
    """One tap's place along one spatial axis: integer position, weight, d weight / d grid."""

    position: torch.Tensor
    weight: torch.Tensor
    slope: torch.Tensor


def _unnormalize(g: torch.Tensor, size: int, align_corners: bool) -> tuple[torch.Tensor, float]:
    if align_corners:
        return (g + 1) / 2 * (size - 1), (size - 1) / 2
    return ((g + 1) * size - 1) / 2, size / 2


def _clamp(x: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(x clamped into [0, size - 1], its derivative: 0 outside, 1 inside and on the bounds)."""
    inside = (x >= 0) & (x <= size - 1)
    return x.clamp(0, size - 1), inside.to(x.dtype)


def _reflect(x: torch.Tensor, twice_low: int, twice_high: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(x reflected into [low, high] about both ends, its derivative: +1 or -1)."""
    if twice_low == twice_high:
        return torch.zeros_like(x), torch.zeros_like(x)
    low, span = twice_low / 2, (twice_high - twice_low) / 2
    distance = x - low
    sign = torch.where(distance < 0, -torch.ones_like(x), torch.ones_like(x))
    distance = distance.abs()
    flips = torch.floor(distance / span)
    extra = torch.fmod(distance, span)
    even = torch.remainder(flips, 2) == 0
    return torch.where(even, extra + low, span - extra + low), torch.where(even, sign, -sign)


def _pad(x: torch.Tensor, size: int, padding_mode: int, align_corners: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(the coordinate after padding, its derivative)."""
    if padding_mode == ZEROS:
        return x, torch.ones_like(x)
    slope = torch.ones_like(x)
    if padding_mode == REFLECTION:
        x, slope = _reflect(x, 0, 2 * (size - 1)) if align_corners else _reflect(x, -1, 2 * size - 1)
    x, inside = _clamp(x, size)
    return x, slope * inside


def _cubic(t: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Keys' kernel at the distances of the four taps ``-1, 0, 1, 2`` from ``t`` in [0, 1):
    (weight, d weight / dt) for each."""
    a = _CUBIC_A

    def near(d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # |d| <= 1
        return ((a + 2) * d - (a + 3)) * d * d + 1, (3 * (a + 2) * d - 2 * (a + 3)) * d

    def far(d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # 1 < |d| < 2
        return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a, (3 * a * d - 10 * a) * d + 8 * a

    w0, s0 = far(t + 1)
    w1, s1 = near(t)
    w2, s2 = near(1 - t)
    w3, s3 = far(2 - t)
    return [(w0, s0), (w1, s1), (w2, -s2), (w3, -s3)]


def _axis_taps(g: torch.Tensor, size: int, mode: int, padding_mode: int, align_corners: bool) -> list[_Axis]:
    x, unnormalize_slope = _unnormalize(g, size, align_corners)
    if mode == BICUBIC:
        base = torch.floor(x)
        taps = []
        for offset, (weight, slope) in zip((-1, 0, 1, 2), _cubic(x - base)):
            position, _ = _pad(base + offset, size, padding_mode, align_corners)
            taps.append(_Axis(position, weight, slope * unnormalize_slope))
        return taps
    x, pad_slope = _pad(x, size, padding_mode, align_corners)
    if mode == NEAREST:
        return [_Axis(torch.round(x), torch.ones_like(x), torch.zeros_like(x))]
    low = torch.floor(x)
    slope = pad_slope * unnormalize_slope
    return [_Axis(low, (low + 1) - x, -slope), _Axis(low + 1, x - low, slope)]


@dataclasses.dataclass
class _Tap:
    index: torch.Tensor  # (N, P) flat spatial index, clamped into the input
    inside: torch.Tensor  # (N, P) whether the tap lies inside (outside: it reads zero)
    weight: torch.Tensor  # (N, P)
    slopes: list[torch.Tensor]  # per grid coordinate (x, y[, z]): d weight / d g


def _product(factors: list[torch.Tensor]) -> torch.Tensor:
    """Left to right (x, then y, then z), as the kernel multiplies the weights."""
    result = factors[0]
    for factor in factors[1:]:
        result = result * factor
    return result


def _taps(sizes: list[int], grid: torch.Tensor, mode: int, padding_mode: int, align_corners: bool) -> list[_Tap]:
    """Every tap of every output point; ``sizes`` the input's spatial sizes (D, H, W order),
    ``grid`` (N, *out, dims) with coordinate 0 along W."""
    n, dims = grid.size(0), grid.size(-1)
    flat_grid = grid.reshape(n, -1, dims)
    per_axis = [_axis_taps(flat_grid[..., i], sizes[dims - 1 - i], mode, padding_mode, align_corners)
                for i in range(dims)]  # per grid coordinate i (x, y, z), its axis size counted from the last
    taps = []
    for reversed_choice in itertools.product(*reversed(per_axis)):  # x varies fastest: the kernel's order
        choice = reversed_choice[::-1]
        inside = torch.ones_like(flat_grid[..., 0], dtype=torch.bool)
        index = torch.zeros_like(flat_grid[..., 0], dtype=torch.int64)
        for i in range(dims - 1, -1, -1):  # from the outermost spatial axis (z) in
            size = sizes[dims - 1 - i]
            position = choice[i].position
            inside = inside & (position >= 0) & (position <= size - 1)
            index = index * size + position.clamp(0, size - 1).to(torch.int64)
        weight = _product([axis.weight for axis in choice])
        slopes = [_product([axis.slope if j == i else axis.weight for j, axis in enumerate(choice)]) for i in range(dims)]
        taps.append(_Tap(index, inside, weight, slopes))
    return taps


def _gather(flat_input: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """(N, C, P) values of ``flat_input`` (N, C, S) at ``index`` (N, P)."""
    return flat_input.gather(2, index.unsqueeze(1).expand(-1, flat_input.size(1), -1))


def _supported(input: torch.Tensor, mode: int, dims: int) -> bool:  # noqa: A002
    return input.is_floating_point() and mode in (BILINEAR, NEAREST) + ((BICUBIC,) if dims == 2 else ())


def grid_sampler(input: torch.Tensor, grid: torch.Tensor, interpolation_mode: int, padding_mode: int,  # noqa: A002
                 align_corners: bool) -> Any:
    dims = grid.size(-1)
    if not _supported(input, interpolation_mode, dims):
        return NotImplemented
    n, channels = input.shape[:2]
    flat = input.reshape(n, channels, -1)
    out = input.new_zeros((n, channels, grid[..., 0].numel() // max(n, 1)))
    for tap in _taps(list(input.shape[2:]), grid, interpolation_mode, padding_mode, align_corners):
        value = _gather(flat, tap.index) * tap.weight.unsqueeze(1)
        out = out + torch.where(tap.inside.unsqueeze(1), value, torch.zeros_like(value))  # not 0 * an inf
    return out.reshape(n, channels, *grid.shape[1:-1])


def grid_sampler_backward(grad_output: torch.Tensor, input: torch.Tensor, grid: torch.Tensor,  # noqa: A002
                          interpolation_mode: int, padding_mode: int, align_corners: bool,
                          output_mask: list[bool]) -> Any:
    """(the input's gradient: each output gradient scatter-added with its taps' weights, or None
    where ``output_mask`` says it is not needed; the grid's gradient, always, as eager's)."""
    dims = grid.size(-1)
    if not _supported(input, interpolation_mode, dims):
        return NotImplemented
    n, channels = input.shape[:2]
    flat = input.reshape(n, channels, -1)
    flat_grad = grad_output.reshape(n, channels, -1)
    grad_input = torch.zeros_like(flat) if output_mask[0] else None
    grad_grid = [grid.new_zeros(grid.shape[:-1]).reshape(n, -1) for _ in range(dims)]
    for tap in _taps(list(input.shape[2:]), grid, interpolation_mode, padding_mode, align_corners):
        inside = tap.inside.unsqueeze(1)
        if grad_input is not None:
            spread = flat_grad * tap.weight.unsqueeze(1)
            spread = torch.where(inside, spread, torch.zeros_like(spread))
            grad_input = grad_input.scatter_add(2, tap.index.unsqueeze(1).expand(-1, channels, -1), spread)
        if interpolation_mode != NEAREST:
            along = _gather(flat, tap.index) * flat_grad
            along = torch.where(inside, along, torch.zeros_like(along)).sum(1)
            grad_grid = [g + along * slope for g, slope in zip(grad_grid, tap.slopes)]
    stacked = torch.stack(grad_grid, -1).reshape(grid.shape)
    return (grad_input.reshape(input.shape) if grad_input is not None else None), stacked


def cudnn_grid_sampler(input: torch.Tensor, grid: torch.Tensor) -> Any:  # noqa: A002
    """cuDNN's sampler, which CUDA's ``grid_sampler`` picks for a 4-d bilinear sample with zero
    padding and ``align_corners=True`` (cuDNN's only convention): that call of ``grid_sampler_2d``
    (Core ATen). Met in a program exported on the GPU (raft's correlation lookup)."""
    return aten.grid_sampler_2d.default(input, grid, BILINEAR, ZEROS, True)


DECOMPOSITIONS: dict[Any, Callable] = {
    aten.cudnn_grid_sampler.default: cudnn_grid_sampler,
    aten.grid_sampler_3d.default: grid_sampler,
    aten.grid_sampler_2d_backward.default: grid_sampler_backward,
    aten.grid_sampler_3d_backward.default: grid_sampler_backward,
}
