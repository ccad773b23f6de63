"""The metadata of a training step's nodes past the forward: each backward node named after the
forward op it differentiates, the optimizer's update named after no line of the user's.

The autograd engine runs a backward op from autograd's frames, not the user's: it has no stack
of its own, and the neighbour rule of ``passes/node_meta.fill_missing`` would give it whatever
node sits beside it in the graph (a linear's backward named after the ``torch.cond`` next to
it). torch's joint tracing names a backward node after the forward node whose autograd node ran
it: that node's ``stack_trace`` and autograd sequence number (``seq_nr``), and
``autograd_backward`` (which torch's passes over forward+loss+backward graphs read, e.g. the
activation-checkpointing rematerialisation). So does the joint trace here, with the forward
node's module stack too (a partitioner by module keeps a layer's backward with the layer):

* :class:`ForwardOrigins`: while the forward replays, which autograd nodes (by sequence number)
  each forward node made;
* :func:`attributed_backward`: while the engine runs the backward, a pre-hook on each autograd
  node marks where its ops start in the graph; afterwards each stretch of nodes takes its forward
  node's metadata. A gradient sum the engine adds between two autograd nodes belongs to the one
  that produced it; the loss's gradient seed is a backward node of no forward node;
* :func:`marked_as_the_update`: the optimizer's ops come from torch.optim's code and ours, no
  line of the user's; without a mark the neighbour rule would name them after the gradient they
  read (a linear's line on its weight's momentum update).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from .. import _torch_compat as tc
from ..passes.node_meta import NO_USER_LINE

AUTOGRAD_BACKWARD = "autograd_backward"
_FROM_FORWARD = ("stack_trace", "nn_module_stack", "seq_nr", "custom")


class ForwardOrigins:
    """Autograd sequence number -> the forward graph node whose replay made that autograd node."""

    def __init__(self) -> None:
        self._by_number: dict[int, torch.fx.Node] = {}

    @contextlib.contextmanager
    def replaying(self, node: torch.fx.Node) -> Iterator[None]:
        """Around one forward node's replay. A region's body replays inside its node: the body's
        nodes claim their autograd nodes first, the region node keeps the rest."""
        start = tc.autograd_sequence_nr()
        try:
            yield
        finally:
            for number in range(start, tc.autograd_sequence_nr()):
                self._by_number.setdefault(number, node)

    def of(self, grad_fn: Any) -> torch.fx.Node | None:
        return self._by_number.get(tc.sequence_nr_of(grad_fn))


@contextlib.contextmanager
def attributed_backward(roots: Sequence[Any], origins: ForwardOrigins, graph: torch.fx.Graph) -> Iterator[None]:
    """Around the engine's run of the backward from ``roots`` (autograd nodes): every node the
    trace records into ``graph`` meanwhile takes the metadata of the forward node that made the
    autograd node running it (none for an autograd node no forward node made, e.g. a user's
    tensor made outside the trace)."""
    # (the last node before, forward node); the engine's first ops (the loss's gradient seed) come
    # before any autograd node runs
    marks: list[tuple[torch.fx.Node | None, torch.fx.Node | None]] = [(_last(graph), None)]

    def prehook_for(forward: torch.fx.Node | None) -> Any:
        def prehook(grad_outputs: Any) -> None:
            marks.append((_last(graph), forward))
        return prehook

    handles = [fn.register_prehook(prehook_for(origins.of(fn))) for fn in _reachable(roots)]
    try:
        yield
        end = _last(graph)
    finally:
        for handle in handles:
            handle.remove()
    for (start, forward), (stop, _) in zip(marks, [*marks[1:], (end, None)]):
        node = start.next if start is not None else next(iter(graph.nodes), None)
        while node is not None and node.op != "root" and stop is not None:
            node.meta[AUTOGRAD_BACKWARD] = True
            if forward is not None:
                for key in _FROM_FORWARD:
                    if key in forward.meta:
                        node.meta[key] = forward.meta[key]
            if node is stop:
                break
            node = node.next


@contextlib.contextmanager
def marked_as_the_update(graph: torch.fx.Graph) -> Iterator[None]:
    """Around the optimizer's step in the trace: its nodes keep no stack trace."""
    start = _last(graph)
    yield
    node = start.next if start is not None else next(iter(graph.nodes), None)
    while node is not None and node.op != "root":
        node.meta[NO_USER_LINE] = True
        node = node.next


def _reachable(roots: Sequence[Any]) -> list[Any]:
    seen: dict[Any, None] = {}
    stack = [r for r in roots if r is not None]
    while stack:
        fn = stack.pop()
        if fn in seen:
            continue
        seen[fn] = None
        stack.extend(next_fn for next_fn, _ in fn.next_functions if next_fn is not None)
    return list(seen)


def _last(graph: torch.fx.Graph) -> torch.fx.Node | None:
    return next(iter(reversed(graph.nodes)), None)


__all__ = ["AUTOGRAD_BACKWARD", "ForwardOrigins", "attributed_backward", "marked_as_the_update"]
