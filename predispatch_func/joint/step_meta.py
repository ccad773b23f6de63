"""The metadata of a training step's nodes, each named after the forward node it comes from.

The joint trace records from calls that are not the user's (the forward program replayed node
by node, autograd's engine, the optimizer), so no node gets a stack of its own, and the
neighbour rule of ``passes/node_meta.fill_missing`` would give it whatever node sits beside it
(a linear's backward named after the ``torch.cond`` next to it). So:

* :func:`stamped`: the nodes the replay of one forward node records take its metadata
  (``FORWARD_META``);
* :class:`ForwardOrigins` and :func:`attributed_backward`: as torch's joint tracing does, a
  backward node takes the ``stack_trace`` and autograd sequence number (``seq_nr``) of the
  forward node whose autograd node ran it, and ``autograd_backward`` (which torch's passes over
  forward+loss+backward graphs read, e.g. the activation-checkpointing rematerialisation); here
  its module stack too (a partitioner by module keeps a layer's backward with the layer). While
  the forward replays, each forward node notes the autograd nodes (by sequence number) it made;
  while the engine runs the backward, a pre-hook on each autograd node marks where its ops
  start in the graph. A gradient sum the engine adds between two autograd nodes belongs to the
  one that produced it; the loss's gradient seed is a backward node of no forward node;
* :func:`marked_as_the_update`: the optimizer's ops come from torch.optim's code and ours, no
  line of the user's: they keep none (not the line of the gradient they read).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from .. import _torch_compat as tc
from ..passes.node_meta import NO_USER_LINE

AUTOGRAD_BACKWARD = "autograd_backward"
# what a forward node gives the nodes its replay records, and its backward nodes (not the torch
# call it names: a matcher of forward calls by ``torch_fn`` must not catch their backward, and
# torch's joint graphs give backward nodes none)
FORWARD_META = ("stack_trace", "nn_module_stack", "source_fn_stack", "torch_fn", "seq_nr", "custom")
BACKWARD_META = ("stack_trace", "nn_module_stack", "seq_nr", "custom")


@contextlib.contextmanager
def stamped(source: torch.fx.Node, graph: torch.fx.Graph) -> Iterator[None]:
    """Around the replay of ``source`` (a forward node): the nodes it records into ``graph`` take
    its metadata (where they have none of their own)."""
    start = _last(graph)
    yield
    for node in _after(graph, start):
        _take_meta(node, source, FORWARD_META)


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
        for node in _after(graph, start, stop):
            node.meta[AUTOGRAD_BACKWARD] = True
            if forward is not None:
                _take_meta(node, forward, BACKWARD_META, overwrite=True)  # over what a lowering copied


@contextlib.contextmanager
def marked_as_the_update(graph: torch.fx.Graph) -> Iterator[None]:
    """Around the optimizer's step in the trace: its nodes keep no stack trace."""
    start = _last(graph)
    yield
    for node in _after(graph, start):
        node.meta[NO_USER_LINE] = True


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
    return next(iter(reversed(graph.nodes)), None)  # torch 2.11: reversed() gives a list


def _after(graph: torch.fx.Graph, start: torch.fx.Node | None,
           stop: torch.fx.Node | None = None) -> Iterator[torch.fx.Node]:
    """The nodes recorded after ``start`` (from the first when None), up to ``stop`` included
    (to the last when None)."""
    node = start.next if start is not None else next(iter(graph.nodes), None)
    while node is not None and node.op != "root":
        following = node.next
        yield node
        if node is stop:
            return
        node = following


def _take_meta(node: torch.fx.Node, source: torch.fx.Node, keys: tuple[str, ...], overwrite: bool = False) -> None:
    for key in keys:
        if key in source.meta and (overwrite or key not in node.meta):
            node.meta[key] = source.meta[key]


__all__ = ["AUTOGRAD_BACKWARD", "BACKWARD_META", "FORWARD_META", "ForwardOrigins", "attributed_backward",
           "marked_as_the_update", "stamped"]
