"""Composites that autocast casts as a whole, decomposed in the program.

Inside an autocast region eager casts a composite's arguments once, by the composite's
own policy (CUDA promotes ``grid_sampler``'s arguments to their widest dtype), then runs
its pieces with autocast off for that device. A program that records the pieces leaves
each to autocast's policy for *it* at run time, or to none: ``grid_sampler_2d`` met a
bf16 input beside an fp32 grid and raised (torchvision's raft_small on the H200).

Where the pieces run op by op under autocast run their ops on other dtypes than eager
runs them (a probe on fakes, once per op, argument dtypes and autocast state), the
trace records eager's casts as ``_to_copy`` nodes and runs the
pieces inside a nested ``autocast(enabled=False)`` region, as eager runs them. Elsewhere
(``matmul`` into ``mm``: both bf16) the program is left as it was.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .. import _torch_compat as tc
from .composite_policy import _fresh_like

_DEVICES = ("cuda", "cpu")
_TO_COPY = torch.ops.aten._to_copy.default


class AutocastComposites:
    """For one export: which decomposed calls need eager's autocast casts recorded."""

    __slots__ = ("_has_kernel", "_verdicts")

    def __init__(self) -> None:
        self._has_kernel: dict[tuple[Any, str], bool] = {}
        self._verdicts: dict[tuple, tuple[str, dict[int, torch.dtype]] | None] = {}

    def may_cast(self, func: Any, args: tuple, kwargs: dict) -> bool:
        """Cheap: an autocast region is on and casts ``func`` by a policy of its own."""
        return (torch.is_autocast_enabled("cuda") or torch.is_autocast_enabled("cpu")) \
            and self._casting_device(func, args, kwargs) is not None

    def instead(self, func: Any, args: tuple, kwargs: dict,
                pieces: Callable[..., Any] | None) -> Callable[..., Any] | None:
        """What to trace instead of a call of ``func`` the program decomposes into ``pieces``
        (the trace's reroute; None: ``func``'s own decomposition), or None."""
        device = self._casting_device(func, args, kwargs)
        if device is None:
            return None
        leaves = tc.pytree.tree_leaves((args, kwargs))
        key = (func, device, torch.get_autocast_dtype(device),
               tuple((t.dtype, t.device.type) if isinstance(t, torch.Tensor) else None for t in leaves))
        if key not in self._verdicts:
            self._verdicts[key] = _probe(func, args, kwargs, device,
                                         pieces or (lambda *a, **k: func.decompose(*a, **k)))
        verdict = self._verdicts[key]
        if verdict is None:
            return None
        return lambda *a, **k: _run_as_eager_does(func, verdict[0], verdict[1], a, k)

    def _casting_device(self, func: Any, args: tuple, kwargs: dict) -> str | None:
        for device in _DEVICES:
            if not torch.is_autocast_enabled(device):
                continue
            known = self._has_kernel.get((func, device))
            if known is None:
                known = self._has_kernel[(func, device)] = isinstance(func, tc.OpOverload) \
                    and tc.has_autocast_kernel(func, device)
            if known and any(isinstance(t, torch.Tensor) and t.device.type == device
                             for t in tc.pytree.tree_leaves((args, kwargs))):
                return device
        return None


def _probe(func: Any, args: tuple, kwargs: dict, device: str,
           pieces: Callable[..., Any]) -> tuple[str, dict[int, torch.dtype]] | None:
    """(device, casts by leaf position) where ``pieces`` (what the trace records for the call),
    run op by op under autocast, run their ops on other dtypes than eager does (autocast's
    casts, then the pieces with autocast off)."""
    tensors = [t for t in tc.pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    fake_mode = tc.fake_mode_of(tensors)
    if fake_mode is None:
        return None
    with tc.below_pre_dispatch(), fake_mode, tc.discarding_unbacked_symbols(fake_mode):
        fresh_args, fresh_kwargs = tc.pytree.tree_map_only(torch.Tensor, _fresh_like, (args, kwargs))
        leaves, spec = tc.pytree.tree_flatten((fresh_args, fresh_kwargs))
        dtype = torch.get_autocast_dtype(device)
        # set here, not read: on a host without a GPU torch keeps CUDA autocast's dispatch off
        # (trace/environment.py keeps only the region), while the GPU host's would cast
        with tc.autocast_state_as({device: (True, dtype)}):
            seen = tc.autocast_casts_of(func, fresh_args, fresh_kwargs)
        casts = {i: seen[id(t)] for i, t in enumerate(leaves) if isinstance(t, torch.Tensor) and id(t) in seen}
        cast_args, cast_kwargs = tc.pytree.tree_unflatten(
            [t.to(casts[i]) if i in casts else t for i, t in enumerate(leaves)], spec)
        try:
            with tc.autocast_state_as({device: (False, dtype)}):
                _, eager = tc.calls_after_autocast(pieces, *cast_args, **cast_kwargs)
        except (RuntimeError, NotImplementedError):  # a kernel with no fake one, on a host without a GPU
            return None
        try:
            with tc.autocast_state_as({device: (True, dtype)}):
                _, recorded = tc.calls_after_autocast(pieces, *fresh_args, **fresh_kwargs)
        except RuntimeError:  # the pieces refuse what autocast's casts would have given them
            return device, casts
    return None if recorded == eager else (device, casts)


def _run_as_eager_does(func: Any, device: str, casts: dict[int, torch.dtype], args: tuple, kwargs: dict) -> Any:
    leaves, spec = tc.pytree.tree_flatten((args, kwargs))
    leaves = [_TO_COPY(t, dtype=casts[i]) if i in casts else t for i, t in enumerate(leaves)]
    cast_args, cast_kwargs = tc.pytree.tree_unflatten(leaves, spec)
    with tc.autocast_recorded(device, False, torch.get_autocast_dtype(device)):
        return func(*cast_args, **cast_kwargs)
