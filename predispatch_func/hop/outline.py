"""Outline each frame's run of nodes into a region HOP call, outermost first.

For a run of nodes under one frame: the external values it reads become the
body's operands, the values read after it become its results (this is how a
tensor mutated inside a region leaves it: functionalization already turned
the mutation into a new value that later uses read), and each result that is
the in-place-under-no_grad new value of an operand records that operand in
``identity_of`` (see ``ops.py``).
"""

from __future__ import annotations

import operator
from typing import Any

import torch

from .frames import AutocastFrame, Frame, GradFrame
from .ops import pf_autocast_region, pf_grad_region

FLAT = "_pf_flat_node"  # meta key: the flat-graph node a (copied) node stands for
FLAT_ORDER = "_pf_flat_order"  # meta key: position of every flat-graph node (shared dict)


def outline_level(gm: torch.fx.GraphModule, frames_of: dict[torch.fx.Node, tuple[Frame, ...]],
                  edges: dict[torch.fx.Node, torch.fx.Node], depth: int = 0,
                  grad_enabled: bool = True) -> None:
    """Outline the frames at ``depth`` of ``gm``, then recurse into each new body.
    Graphs are edited only; the caller generates code once at the end."""
    for frame, nodes in _runs(gm, frames_of, depth):
        body_gm, grad_inside = _outline_run(gm, frame, nodes, edges, grad_enabled)
        outline_level(body_gm, frames_of, edges, depth + 1, grad_inside)


def _runs(gm: torch.fx.GraphModule, frames_of, depth: int) -> list[tuple[Frame, list[torch.fx.Node]]]:
    runs: list[tuple[Frame, list[torch.fx.Node]]] = []
    previous = None
    for node in gm.graph.nodes:
        frames = frames_of.get(node.meta.get(FLAT), ())
        frame = frames[depth] if len(frames) > depth and node.op == "call_function" else None
        if frame is not None:
            if frame is previous:
                runs[-1][1].append(node)
            else:
                runs.append((frame, [node]))
        previous = frame
    return runs


def _outline_run(gm, frame: Frame, nodes: list[torch.fx.Node], edges, grad_enabled: bool):
    nodes = _with_subgraph_refs(gm, nodes)
    members = set(nodes)
    inputs: list[torch.fx.Node] = []
    for node in nodes:
        for inp in node.all_input_nodes:
            if inp not in members and inp not in inputs:
                inputs.append(inp)
    outputs = [n for n in nodes if any(u not in members for u in n.users)
               or _old_value_of_later_write(n, nodes, edges)]
    grad_inside = frame.enabled if isinstance(frame, GradFrame) else grad_enabled
    carries = grad_enabled and not grad_inside
    # A write's old value may not be read inside: pass it in, so the region that turns grad
    # off (this one, or one nested in this autocast region) can carry its identity.
    if grad_enabled:
        inputs += [s for s in _identity_sources(outputs, members, edges) if s not in inputs]

    body = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for inp in inputs:
        env[inp] = body.placeholder(inp.name)
        env[inp].meta.update(inp.meta)
    for node in nodes:
        env[node] = body.node_copy(node, lambda n: env[n])
    body.output(tuple(env[o] for o in outputs))
    body_gm = torch.fx.GraphModule(gm, body)  # copies the subgraphs its get_attr nodes name

    identity_of = _identity_of(inputs, outputs, edges) if carries else ()
    kind = "grad_region" if isinstance(frame, GradFrame) else "autocast_region"
    name = _free_attr(gm, kind)
    gm.add_submodule(name, body_gm)
    with gm.graph.inserting_before(nodes[0]):
        body_ref = gm.graph.get_attr(name)
        hop = gm.graph.call_function(_target(frame), (*_mode_args(frame), identity_of, body_ref, *inputs))
        hop.meta["val"] = tuple(o.meta.get("val") for o in outputs)
        if frame.stack_trace:
            hop.meta["stack_trace"] = frame.stack_trace
        results = []
        for i, out in enumerate(outputs):
            item = gm.graph.call_function(operator.getitem, (hop, i))
            item.meta.update({k: v for k, v in out.meta.items() if k in ("val", "stack_trace", FLAT)})
            results.append(item)
    for out, item in zip(outputs, results):
        out.replace_all_uses_with(item, delete_user_cb=lambda user: user not in members)
    for node in reversed(nodes):
        gm.graph.erase_node(node)
        if node.op == "get_attr" and not any(n.op == "get_attr" and n.target == node.target
                                             for n in gm.graph.nodes):
            delattr(gm, node.target)  # the subgraph now lives in the body only
    return body_gm, grad_inside


def _with_subgraph_refs(gm: torch.fx.GraphModule, nodes: list[torch.fx.Node]) -> list[torch.fx.Node]:
    """``nodes`` plus the ``get_attr`` nodes of the subgraphs (a torch HOP's branches, a
    Function's forward and backward) that only they call: the subgraphs move into the body."""
    members = set(nodes)
    refs = [inp for node in nodes for inp in node.all_input_nodes
            if inp.op == "get_attr" and isinstance(getattr(gm, inp.target, None), torch.fx.GraphModule)
            and all(u in members for u in inp.users)]
    if not refs:
        return nodes
    return [n for n in gm.graph.nodes if n in members or n in refs]


def _old_value_of_later_write(node: torch.fx.Node, run: list[torch.fx.Node], edges) -> bool:
    """Is ``node`` the value a write after this run was done over? Then it leaves the
    run even if nothing reads it, so the later region can carry its autograd identity
    (``d = x.detach(); d.sub_(1); d.sub_(2)``: the second write keeps the first's)."""
    flat = node.meta.get(FLAT)
    order = _flat_order(node)
    end = max(order.get(n.meta.get(FLAT), -1) for n in run)
    return any(old is flat and order.get(new, -1) > end for new, old in edges.items())


def _flat_order(node: torch.fx.Node) -> dict[torch.fx.Node, int]:
    return node.meta.get(FLAT_ORDER) or {}


def _identity_sources(outputs, members, edges) -> list[torch.fx.Node]:
    """For each output that is a write's new value, the node (outside the run) it was written over."""
    flat_members = {m.meta.get(FLAT): m for m in members}
    sources = []
    for out in outputs:
        flat, seen = out.meta.get(FLAT), set()
        while flat in edges and flat not in seen:
            seen.add(flat)
            flat = edges[flat]
            if flat not in flat_members:
                break
        if flat is not out.meta.get(FLAT) and flat not in flat_members:
            node = _node_for_flat(out.graph, flat)
            if node is not None:
                sources.append(node)
    return sources


def _node_for_flat(graph: torch.fx.Graph, flat: torch.fx.Node) -> torch.fx.Node | None:
    return next((n for n in graph.nodes if n.meta.get(FLAT) is flat), None)


def _identity_of(inputs, outputs, edges) -> tuple[int, ...]:
    position = {inp.meta.get(FLAT): i for i, inp in enumerate(inputs)}
    result = []
    for out in outputs:
        flat = out.meta.get(FLAT)
        seen = set()
        while flat in edges and flat not in position and flat not in seen:
            seen.add(flat)
            flat = edges[flat]
        result.append(position.get(flat, -1) if flat is not out.meta.get(FLAT) else -1)
    return tuple(result) if any(j >= 0 for j in result) else ()


def _target(frame: Frame) -> Any:
    return pf_grad_region if isinstance(frame, GradFrame) else pf_autocast_region


def _mode_args(frame: Frame) -> tuple:
    if isinstance(frame, GradFrame):
        return (frame.enabled,)
    assert isinstance(frame, AutocastFrame)
    return (frame.device_type, frame.dtype, frame.enabled, frame.cache_enabled)


def _free_attr(gm: torch.fx.GraphModule, kind: str) -> str:
    i = 0
    while hasattr(gm, f"{kind}_{i}"):
        i += 1
    return f"{kind}_{i}"
