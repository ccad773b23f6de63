"""Outline each frame's run of nodes into a region HOP call, outermost first.

For a run of nodes under one frame: the external values it reads become the
body's operands, the values read after it become its results (this is how a
tensor mutated inside a region leaves it: functionalization already turned
the mutation into a new value that later uses read), and each result that is
the in-place-under-no_grad new value of an operand records that operand in
``identity_of`` (see ``ops.py``). Each frame (frames.py) names its HOP, its
mode arguments and its body's attribute name.

Frames (frames.py) and identity edges speak of the nodes of the flat traced
graph; outlining copies nodes into bodies and replaces results by ``getitem``
nodes, so :class:`Outliner` keeps explicit maps from every node it makes to
the flat node it stands for, and back, per graph.
"""

from __future__ import annotations

import operator
from typing import Any

import torch

from .. import _torch_compat as tc
from ..autograd_facts import nodes_that_may_carry_grad
from ..errors import Refusal, UnsupportedError, user_line_of_recorded
from .frames import Frame

Node = torch.fx.Node


class Outliner:
    """One outlining of a flat graph: its frames, its identity edges, and the node maps."""

    __slots__ = ("_frames_of", "_edges", "_flat_of", "_in_graph", "_order", "_last_write_over", "_carried",
                 "_needs_grad")

    def __init__(self, gm: torch.fx.GraphModule, frames_of: dict[Node, tuple[Frame, ...]],
                 edges: dict[Node, Node], grad_sources: set[Node] | None = None):
        self._frames_of: dict[Any, tuple[Frame, ...]] = dict(frames_of)
        self._edges = edges  # new value -> the value whose autograd identity it keeps (flat nodes)
        self._carried: set[Node] = set()  # nodes that are such a new value with its identity carried
        self._needs_grad = nodes_that_may_carry_grad(gm.graph, grad_sources) if grad_sources is not None else None
        self._flat_of: dict[Node, Node] = {n: n for n in gm.graph.nodes}  # any node -> its flat node
        self._in_graph: dict[torch.fx.Graph, dict[Any, Node]] = {gm.graph: dict(self._flat_of)}
        self._order: dict[Any, int] = {n: i for i, n in enumerate(gm.graph.nodes)}
        self._last_write_over: dict[Any, int] = {}  # old value -> position of its latest new value
        for new, old in edges.items():
            self._last_write_over[old] = max(self._last_write_over.get(old, -1), self._order.get(new, -1))

    def outline(self, gm: torch.fx.GraphModule, depth: int = 0, grad_enabled: bool = True) -> None:
        """Outline the frames at ``depth`` of ``gm``, then recurse into each new body.
        Graphs are edited only; the caller generates code once at the end."""
        for frame, nodes in self._runs(gm, depth):
            body_gm = self._outline_run(gm, frame, nodes, grad_enabled)
            self.outline(body_gm, depth + 1, frame.grad_inside(grad_enabled))

    def _runs(self, gm: torch.fx.GraphModule, depth: int) -> list[tuple[Frame, list[Node]]]:
        runs: list[tuple[Frame, list[Node]]] = []
        previous = None
        for node in gm.graph.nodes:
            if node.op == "get_attr":
                continue  # a subgraph or spec read by a call: it moves with that call's run
            frames = self._frames_of.get(self._flat(node), ())
            frame = frames[depth] if len(frames) > depth and node.op == "call_function" else None
            if frame is not None:
                if frame is previous:
                    runs[-1][1].append(node)
                else:
                    runs.append((frame, [node]))
            previous = frame
        return runs

    def _outline_run(self, gm: torch.fx.GraphModule, frame: Frame, nodes: list[Node],
                     grad_enabled: bool) -> torch.fx.GraphModule:
        nodes = _with_subgraph_refs(gm, nodes)
        members = set(nodes)
        inputs: list[Node] = []
        for node in nodes:
            for inp in node.all_input_nodes:
                if inp not in members and inp not in inputs:
                    inputs.append(inp)
        end = max(self._order.get(self._flat(n), -1) for n in nodes)
        outputs = [n for n in nodes if any(u not in members for u in n.users)
                   or self._last_write_over.get(self._flat(n), -1) > end]
        # A write's old value may not be read inside: pass it in, so the region that turns grad
        # off (this one, or one nested in this autocast region) can carry its identity.
        if grad_enabled:
            inputs += [s for s in self._identity_sources(gm.graph, outputs, members) if s not in inputs]
        carries = grad_enabled and not frame.grad_inside(grad_enabled)
        identity_of = self._identity_of(inputs, outputs) if carries else ()
        if not grad_enabled and frame.grad_inside(grad_enabled):
            self._refuse_uncarried_identity(inputs, members, frame)

        body = torch.fx.Graph()
        env: dict[Node, Node] = {}
        for inp in inputs:
            env[inp] = body.placeholder(inp.name)
            env[inp].meta.update(inp.meta)
        for node in nodes:
            env[node] = body.node_copy(node, lambda n: env[n])
        body.output(tuple(env[o] for o in outputs))
        self._in_graph[body] = {}
        for old, new in env.items():
            self._note(new, self._flat(old))
            if old in self._carried:
                self._carried.add(new)
        body_gm = torch.fx.GraphModule(gm, body)  # copies the subgraphs its get_attr nodes name

        name = _free_attr(gm, frame.name)
        gm.add_submodule(name, body_gm)
        with gm.graph.inserting_before(nodes[0]):
            body_ref = gm.graph.get_attr(name)
            hop = gm.graph.call_function(frame.hop, (*frame.mode_args(), identity_of, body_ref, *inputs))
            hop.meta["val"] = tuple(o.meta.get("val") for o in outputs)
            if frame.stack_trace:
                hop.meta["stack_trace"] = frame.stack_trace
            results = []
            for i, out in enumerate(outputs):
                item = gm.graph.call_function(operator.getitem, (hop, i))
                item.meta.update({k: v for k, v in out.meta.items() if k in ("val", "stack_trace")})
                results.append(item)
                if identity_of and identity_of[i] >= 0:
                    self._carried.add(item)
        for out, item in zip(outputs, results):
            out.replace_all_uses_with(item, delete_user_cb=lambda user: user not in members)
            self._note(item, self._flat(out))
        for node in reversed(nodes):
            in_graph, flat = self._in_graph[gm.graph], self._flat(node)
            if flat is not None and in_graph.get(flat) is node:
                del in_graph[flat]
            gm.graph.erase_node(node)
            if node.op == "get_attr" and not any(n.op == "get_attr" and n.target == node.target
                                                 for n in gm.graph.nodes):
                delattr(gm, str(node.target))  # the subgraph now lives in the body only
        return body_gm

    def _flat(self, node: Node) -> Node | None:
        return self._flat_of.get(node)

    def _note(self, node: Node, flat: Node | None) -> None:
        """``node`` stands for ``flat`` in its graph (a result replaces the node it returns)."""
        if flat is not None:
            self._flat_of[node] = flat
            self._in_graph[node.graph][flat] = node

    def _identity_sources(self, graph: torch.fx.Graph, outputs: list[Node], members: set[Node]) -> list[Node]:
        """For each output that is a write's new value, the node (outside the run) it was written over."""
        flat_members = {self._flat(m) for m in members}
        sources = []
        for out in outputs:
            start = flat = self._flat(out)
            seen: set[Node] = set()
            while flat in self._edges and flat not in seen:
                seen.add(flat)
                flat = self._edges[flat]
                if flat not in flat_members:
                    break
            if flat is not start and flat not in flat_members:
                node = self._in_graph[graph].get(flat)
                if node is not None:
                    sources.append(node)
        return sources

    def _refuse_uncarried_identity(self, inputs: list[Node], members: set[Node], frame: Frame) -> None:
        """A grad-on region nested in a grad-off one reads a tensor written in place under that
        grad-off region: its identity is carried only where the grad-off region ends (a region's
        results carry identities, its operands do not), so inside, eager's gradient to the
        written tensor would be lost. Refused where that tensor may need grad."""
        if self._needs_grad is None:
            return
        for inp in inputs:
            flat, seen = self._flat(inp), set()
            if flat not in self._edges or inp in self._carried:
                continue
            while flat in self._edges and flat not in seen:
                seen.add(flat)
                flat = self._edges[flat]
            if flat not in self._needs_grad:
                continue
            user = next((u for u in inp.users if u in members), None)
            trace = (user.meta.get("stack_trace") if user is not None else None) or frame.stack_trace
            raise UnsupportedError(
                f"a tensor written in place with grad off ({inp.name}) is read by "
                f"{getattr(user, 'target', 'an op')} inside a grad-on region that is nested in a grad-off "
                "region (or in the caller's torch.no_grad()): eager's gradient reaches the written "
                "tensor, a program carries its identity only where the grad-off region ends; read it "
                "after that region, or write it outside", kind=Refusal.IDENTITY_IN_NESTED_GRAD_REGION,
                op=getattr(user, "target", None), source=user_line_of_recorded(trace))

    def _identity_of(self, inputs: list[Node], outputs: list[Node]) -> tuple[int, ...]:
        position: dict[Any, int] = {self._flat(inp): i for i, inp in enumerate(inputs)}
        result = []
        for out in outputs:
            start = flat = self._flat(out)
            seen: set[Node] = set()
            while flat in self._edges and flat not in position and flat not in seen:
                seen.add(flat)
                flat = self._edges[flat]
            result.append(position.get(flat, -1) if flat is not start else -1)
        return tuple(result) if any(j >= 0 for j in result) else ()


def _with_subgraph_refs(gm: torch.fx.GraphModule, nodes: list[Node]) -> list[Node]:
    """``nodes`` plus the ``get_attr`` nodes of the subgraphs (a torch HOP's branches, a
    Function's forward and backward) and of the pytree specs (a ``flat_apply``'s function and
    arguments) that only they read: those attributes move into the body."""
    members = set(nodes)
    refs = [inp for node in nodes for inp in node.all_input_nodes
            if inp.op == "get_attr" and isinstance(getattr(gm, str(inp.target), None),
                                                   (torch.fx.GraphModule, tc.pytree.TreeSpec))
            and all(u in members for u in inp.users)]
    if not refs:
        return nodes
    return [n for n in gm.graph.nodes if n in members or n in refs]


def _free_attr(gm: torch.fx.GraphModule, kind: str) -> str:
    i = 0
    while hasattr(gm, f"{kind}_{i}"):
        i += 1
    return f"{kind}_{i}"
