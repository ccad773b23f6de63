"""Passes that finish the traced graph around the signature: lift the
constants tracing created, name placeholders as torch.export does, drop dead
code, and copy outputs that the write-back would otherwise change."""

from __future__ import annotations

import functools
import operator
from typing import Any

import torch

from .. import _torch_compat as tc
from ..artifacts import Inputs, InputSlot, Mutations, Placeholders, SlotKind
from ..errors import ExportError, user_line_of_recorded
from ..graphs import all_graph_modules, calls_view_op, graph_pass
from ..inputs.lift import placeholder_name
from ..regions.ops import region_body_and_operands


def _returned(gm: torch.fx.GraphModule) -> list[Any]:
    return list(gm.graph.output_node().args[0])  # type: ignore[arg-type]


def written_placeholders(gm: torch.fx.GraphModule, placeholders: Placeholders, mutations: Mutations,
                         skip: set[InputSlot] | frozenset[InputSlot] = frozenset()
                         ) -> dict[torch.fx.Node, torch.fx.Node]:
    """Each written input's placeholder (but those of ``skip``) -> the node holding its final value."""
    returned = _returned(gm)
    return {placeholders[slot]: returned[k] for k, slot in enumerate(mutations.mutated) if slot not in skip}


@graph_pass
def eliminate_dead_code(gm: torch.fx.GraphModule) -> None:
    """Drop unused view replays (in every body too) and profiler ranges; keep random ops so
    the RNG stream matches eager, also inside a region whose results are unused, and drop
    the bodies of regions no longer called. (The user's checks on unbacked values are
    runtime asserts by now, reading the ``.item()`` they check: pipeline.py inserts them first.)"""
    for _, sub in reversed(list(all_graph_modules(gm))):
        sub.graph.eliminate_dead_code(is_impure_node=functools.partial(impure, owner=sub))
        called = {n.target for n in sub.graph.nodes if n.op == "get_attr"}
        for name, child in list(sub.named_children()):
            if isinstance(child, torch.fx.GraphModule) and name not in called:
                delattr(sub, name)


def impure(node: torch.fx.Node, owner: torch.fx.GraphModule) -> bool:
    """Whether dead-code elimination must keep ``node`` (a region call: whether its body must)."""
    target = node.target
    if target in tc.PROFILER_RANGE_OPS:
        # eager profiling ranges (torch.profiler.record_function) are dropped, as torch.export
        # drops them: a runtime profiles the program its own way, and the range's handle is a
        # ScriptObject no program value may be
        return False
    if isinstance(target, tc.OpOverload) and torch.Tag.nondeterministic_seeded in target.tags:
        return True
    parts = region_body_and_operands(node)
    if parts is not None:
        body = getattr(owner, str(parts[0].target))
        return any(impure(n, body) for n in body.graph.nodes if n.op == "call_function")
    return node.is_impure()


@graph_pass
def lift_traced_constants(gm: torch.fx.GraphModule, inputs: Inputs) -> Inputs:
    """Tensors created while tracing (``torch.tensor(...)``) become constant inputs."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    anchor = placeholders[inputs.n_state - 1] if inputs.n_state else None
    new_slots: list[InputSlot] = []
    lifted: dict[str, torch.fx.Node] = {}  # attribute -> its placeholder: one tensor read twice
    for node in list(gm.graph.nodes):
        if node.op == "get_attr" and node.target in lifted:
            node.replace_all_uses_with(lifted[node.target])
            gm.graph.erase_node(node)
            continue
        if node.op != "get_attr" or not isinstance(getattr(gm, node.target, None), torch.Tensor):
            continue
        if (dead := _feeds_nothing(node)) is not None:  # ``y = torch.tensor(3)``, never used: no input
            target = node.target
            for unused in sorted(dead, key=_position(gm), reverse=True):
                gm.graph.erase_node(unused)
            if not any(n.op == "get_attr" and n.target == target for n in gm.graph.nodes):
                delattr(gm, target)
            continue
        value = getattr(gm, node.target)
        if isinstance(value, tc.FakeTensor):
            raise _fake_constant(node)
        if isinstance(value, torch.nn.Parameter):  # one held where lifting does not look (a dict):
            # a constant that does not train, as torch.export makes it; kept a Parameter it would
            # be registered as one by module(), which then finds no buffer of that name
            value = value.detach()
        fqn = f"lifted_tensor_{len(new_slots)}"
        ctx = (gm.graph.inserting_after(anchor) if anchor is not None
               else gm.graph.inserting_before(placeholders[0] if placeholders else None))
        with ctx:
            ph = gm.graph.placeholder(fqn)
        ph.meta.update(node.meta)
        node.replace_all_uses_with(ph)
        gm.graph.erase_node(node)
        delattr(gm, node.target)
        lifted[str(node.target)] = ph
        anchor = ph
        new_slots.append(InputSlot(SlotKind.CONSTANT, fqn, value))
    return inputs.with_constants(new_slots)


def _fake_constant(node: torch.fx.Node) -> ExportError:
    """A tensor the trace made without recording how (a fake, with no value) would become a
    constant of the program: running it would read garbage. Never a silent program."""
    user = next(iter(node.users), None)
    return ExportError(
        "a tensor made while tracing was not recorded as an op and would be a program constant without "
        f"a value (read by {user.target if user is not None else 'nothing'}); the program would compute "
        "with garbage. Known: an in-place op lowered to target= whose decomposition makes a tensor "
        "(lerp_ with a scalar weight under core_aten). Export without target= or report it",
        op=user.target if user is not None else None,
        source=user_line_of_recorded(user.meta.get("stack_trace")) if user is not None else None)


def _feeds_nothing(node: torch.fx.Node) -> set[torch.fx.Node] | None:
    """``node`` and every node computed from it, where none of them reaches the output or has an
    effect (dead code the final dead-code pass would drop, leaving the constant an unused input);
    None where one does."""
    seen, todo = {node}, [node]
    while todo:
        for user in todo.pop().users:
            if user.op == "output" or user.is_impure():
                return None
            if user not in seen:
                seen.add(user)
                todo.append(user)
    return seen


def _position(gm: torch.fx.GraphModule) -> Any:
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    return order.__getitem__


@graph_pass
def name_placeholders(gm: torch.fx.GraphModule, inputs: Inputs) -> None:
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    assert len(placeholders) == len(inputs.slots), (len(placeholders), len(inputs.slots))
    for node, slot in zip(placeholders, inputs.slots):
        tc.rename_node(node, placeholder_name(slot))
        node.target = node.name
        if slot.kind is SlotKind.USER and not isinstance(slot.value, (torch.Tensor, torch.SymInt)):
            node.meta.setdefault("val", slot.value)  # a constant input, as torch.export records it


def _view_root(node: Any, gm: torch.fx.GraphModule) -> Any:
    """The node a chain of view ops starts from (``node`` itself if it is no view).

    A region result whose body returns a view of a body input is, when the
    program runs, a view of the operand passed there: the chain goes on outside.
    """
    while isinstance(node, torch.fx.Node):
        if calls_view_op(node):
            node = node.args[0]
            continue
        if node.target is operator.getitem and isinstance(node.args[0], torch.fx.Node) \
                and calls_view_op(node.args[0]):  # a piece of split / chunk / unbind
            node = node.args[0].args[0]
            continue
        operand = _operand_viewed_by_region_result(node, gm)
        if operand is None:
            return node
        node = operand
    return None


def _operand_viewed_by_region_result(node: torch.fx.Node, gm: torch.fx.GraphModule) -> Any:
    if node.target is not operator.getitem or not isinstance(node.args[0], torch.fx.Node):
        return None
    parts = region_body_and_operands(node.args[0])
    if parts is None:
        return None
    body_attr, operands = parts
    body = getattr(gm, str(body_attr.target))
    returned = next(n for n in reversed(body.graph.nodes) if n.op == "output").args[0][node.args[1]]
    root = _view_root(returned, body)
    if getattr(root, "op", None) != "placeholder":
        return None
    placeholders = [n for n in body.graph.nodes if n.op == "placeholder"]
    return operands[placeholders.index(root)]


@graph_pass
def copy_outputs_reading_written_inputs(gm: torch.fx.GraphModule, placeholders: Placeholders,
                                        mutations: Mutations) -> None:
    """Give an output its own copy where module()'s write-back would change what it returns.

    module() writes each mutated input back with ``copy_``, then returns the outputs,
    and a user output that is the very node of a mutation becomes the written input:
    * a mutation whose new value is (a view of) another input's placeholder (``y.copy_(x)``): the
      write-back of that other input could run first, and a user output of ``x`` would
      come back as ``y``;
    * a user output that is (a view of) the placeholder of an input written back later
      (``y.copy_(x); x.sin_(); return y``) would read the new value;
    * a user output that shares its node with a mutation although eager returned another
      tensor (``y.copy_(w); return w``) would come back as the written input.
    Two mutations never share a node either: torch's signature keys them by output name.
    ``mutations.output_is_input[k]`` is the mutation position user output ``k`` really is, if any."""
    written = written_placeholders(gm, placeholders, mutations)
    rewritten = {p for p, v in written.items() if v is not p}
    out_node = gm.graph.output_node()
    outputs = list(out_node.args[0])  # type: ignore[arg-type]
    n_mut = len(mutations.mutated)
    targets = list(written)  # one placeholder per mutation, in output order
    copies: dict[tuple[str, torch.fx.Node], torch.fx.Node] = {}

    def copy_of(kind: str, node: torch.fx.Node) -> torch.fx.Node:
        if (kind, node) not in copies:
            with gm.graph.inserting_before(out_node):
                copies[kind, node] = gm.graph.call_function(torch.ops.aten.clone.default, (node,))
            copies[kind, node].meta.update(node.meta)
        return copies[kind, node]

    for j in range(n_mut):
        node = outputs[j]
        root = _view_root(node, gm)
        if getattr(root, "op", None) == "placeholder" and root is not targets[j]:
            outputs[j] = copy_of(f"mutation {j}", node)
        elif node in outputs[:j]:
            outputs[j] = copy_of(f"mutation {j}", node)
    mutation_nodes = set(outputs[:n_mut])
    for k, real in enumerate(mutations.output_is_input):
        node = outputs[n_mut + k]
        if real is not None:  # eager returned the written input itself
            outputs[n_mut + k] = outputs[real]
        elif _view_root(node, gm) in rewritten or node in mutation_nodes:
            outputs[n_mut + k] = copy_of("output", node)
    if copies:
        out_node.args = (tuple(outputs),)
