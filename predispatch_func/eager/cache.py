"""Per-signature kernels: a decomposition traced once into a graph of target ops.

Running a decomposition is Python work on every call (argument checks,
branches on sizes and dtypes, recursion into further decompositions). For one
input signature it always does the same thing, so it is traced once with fake
tensors into an fx graph holding only target ops, and later calls with that
signature run the graph's generated code.

The key is the whole signature a decomposition can branch on: for each tensor
its dtype, device, layout, sizes, strides, storage offset, conj/neg bits and
requires_grad; which arguments are the same tensor (the trace
has one input for a tensor passed twice); every other argument by type and value (floats by ``repr``, so
``-0.0`` and ``nan`` are not confused with ``0.0``); and grad mode. What the
key cannot see is the tensors' data, so a decomposition that reads data
(``.item()``, ``nonzero``) cannot be traced with fake tensors: that failure
marks the signature uncacheable and its decomposition runs as Python each time.
Random ops stay calls in the graph, so a replay draws from the generator
exactly as running the decomposition does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .. import _torch_compat as tc
from .replay import TracedKernel

UNCACHEABLE = object()


def signature(args: tuple, kwargs: dict) -> tuple[tuple, list[torch.Tensor]]:
    """(hashable key, the tensors in order) for one call. On the hot path of every replay,
    so the common arguments (tensors, plain values) are keyed inline."""
    key: list[Any] = [_grad_enabled()]
    tensors: list[torch.Tensor] = []
    for value in args:
        kind = type(value)
        if kind in _PLAIN:
            key.append((kind, value))
        elif isinstance(value, _Tensor) and value.layout == _STRIDED:
            tensors.append(value)
            key.append((value.dtype, value.device, value.shape, value.stride(), value.storage_offset(),
                        value.requires_grad, value.is_conj(), value.is_neg()))
        else:
            _walk(value, key, tensors)
    if kwargs:
        for name, value in kwargs.items():
            key.append(name)
            _walk(value, key, tensors)
    if len(tensors) > 1:  # one tensor passed twice is one input of the trace: key the pattern
        first: dict[int, int] = {}
        key.append(tuple([first.setdefault(id(t), i) for i, t in enumerate(tensors)]))
    return tuple(key), tensors


_Tensor, _STRIDED, _grad_enabled = torch.Tensor, torch.strided, torch.is_grad_enabled
_PLAIN = frozenset({int, bool, str, type(None), torch.dtype, torch.device, torch.memory_format, torch.layout})


def _walk(value: Any, key: list, tensors: list) -> None:
    kind = type(value)
    if kind in _PLAIN:
        key.append((kind, value))
    elif isinstance(value, _Tensor):
        tensors.append(value)
        if value.layout == _STRIDED:
            key.append((value.dtype, value.device, value.shape, value.stride(), value.storage_offset(),
                        value.requires_grad, value.is_conj(), value.is_neg()))
        else:
            key.append((value.dtype, value.device, value.layout, value.shape))
    elif kind is tuple or kind is list or isinstance(value, (tuple, list)):
        key.append((kind, len(value)))
        for item in value:
            _walk(item, key, tensors)
    elif kind is float:
        key.append((float, repr(value)))
    else:
        key.append((kind, value))


def _rebuild(value: Any, tensors: list, position: list[int]) -> Any:
    if isinstance(value, torch.Tensor):
        position[0] += 1
        return tensors[position[0] - 1]
    if isinstance(value, (tuple, list)):
        return type(value)(_rebuild(item, tensors, position) for item in value)
    if isinstance(value, dict):  # the kwargs: a keyword-only tensor (sdpa's attn_mask) is an input too
        return {name: _rebuild(item, tensors, position) for name, item in value.items()}
    return value


def trace(call: Callable[[tuple, dict], Any], args: tuple, kwargs: dict) -> Any:
    """A kernel traced from ``call(args, kwargs)`` taking the call's tensors as inputs (its fx
    graph, replayed compiled: ``replay``), or ``UNCACHEABLE`` when fake tensors cannot run it
    (data-dependent, no fake kernel)."""
    def on_tensors(*tensors: torch.Tensor) -> Any:
        position = [0]
        return call(_rebuild(args, list(tensors), position), _rebuild(kwargs, list(tensors), position))

    _, tensors = signature(args, kwargs)
    try:
        graph = tc.make_fx(on_tensors, tracing_mode="fake")(*tensors)
    except Exception:  # noqa: BLE001  (any failure to trace only costs speed: run uncached)
        return UNCACHEABLE
    return TracedKernel.of_graph(graph)


def ops_of(kernel: TracedKernel) -> list[Any]:
    return kernel.ops
