"""Backward formulas of torch that read the wrong value of a functional op, corrected in the joint graph.

The joint program differentiates the functional forward, so it meets the derivative formulas of
torch's ``*_functional`` ops, which eager training never runs (eager differentiates the in-place
op before any functionalization):

* ``rrelu_with_noise_functional`` (``rrelu`` in training, decomposed): its formula calls
  ``rrelu_with_noise_backward(grad, self, noise)`` with the *input* ``noise``, the empty buffer
  the in-place op would fill, not ``noise_out``, the slopes it drew (eager's gradient through the
  functional op is that buffer: pinned by a test). The backward reads ``noise_out`` here.
"""

from __future__ import annotations

import operator

import torch

from .. import _torch_compat as tc
from ..graphs import all_graph_modules


def backward_reads_what_the_forward_drew(gm: torch.fx.GraphModule) -> None:
    functional = tc.resolve_overload("aten", "rrelu_with_noise_functional.default")
    backward = tc.resolve_overload("aten", "rrelu_with_noise_backward.default")
    if functional is None or backward is None:
        return
    for _, module in all_graph_modules(gm):
        drawn: dict[tuple[torch.fx.Node, torch.fx.Node], torch.fx.Node] = {}
        for node in list(module.graph.nodes):
            if node.op != "call_function":
                continue
            if node.target is functional and len(node.args) >= 2:
                drawn[(node.args[0], node.args[1])] = _noise_out(module.graph, node)
            elif node.target is backward and len(node.args) >= 3 and (node.args[1], node.args[2]) in drawn:
                node.update_arg(2, drawn[(node.args[1], node.args[2])])


def _noise_out(graph: torch.fx.Graph, call: torch.fx.Node) -> torch.fx.Node:
    """``call``'s second result (its ``getitem(call, 1)``, made if the graph has none)."""
    for user in call.users:
        if user.target is operator.getitem and user.args[1] == 1:
            return user
    with graph.inserting_after(call):
        noise_out = graph.call_function(operator.getitem, (call, 1))
    if isinstance(call.meta.get("val"), (tuple, list)):
        noise_out.meta["val"] = call.meta["val"][1]
    for key in ("stack_trace", "nn_module_stack", "source_fn_stack", "seq_nr"):
        if key in call.meta:
            noise_out.meta[key] = call.meta[key]
    return noise_out


__all__ = ["backward_reads_what_the_forward_drew"]
