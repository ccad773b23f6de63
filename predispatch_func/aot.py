"""``aot_export_module``: the layer under :func:`predispatch_func.export`.

It owns lifting (parameters, buffers, tensor constants become placeholders),
functionalization (one trace through the mode stack) and the mutation
metadata (which inputs the model wrote, and their final values as outputs).

Pipeline: flatten -> lift -> fake-ify -> trace (modes/) -> outline regions
(hop/) -> name placeholders, lift traced constants -> signature.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import torch
from torch.export.graph_signature import (
    ConstantArgument,
    ExportGraphSignature,
    InputKind,
    InputSpec,
    OutputKind,
    OutputSpec,
    SymIntArgument,
    TensorArgument,
)

from . import _torch_compat as tc
from .errors import UnsupportedError
from .fakeify import Fakeifier
from .graphs import all_graph_modules
from .hop import outline_regions
from .lift import LiftedState, lift_state, placeholder_name, user_input_names
from .modes import CompositePolicy, trace_functional
from .schema_audit import shipped_decision
from .writeback_guard import guard_saved_mutated_inputs

_MUTATION_KIND = {
    "parameter": OutputKind.PARAMETER_MUTATION,
    "buffer": OutputKind.BUFFER_MUTATION,
    "user": OutputKind.USER_INPUT_MUTATION,
}
_INPUT_KIND = {
    "parameter": InputKind.PARAMETER,
    "buffer": InputKind.BUFFER,
    "constant": InputKind.CONSTANT_TENSOR,
}


@dataclasses.dataclass
class AotSignature:
    """What a caller needs to turn the graph into a program and call it."""

    graph_signature: ExportGraphSignature
    in_spec: tc.pytree.TreeSpec
    out_spec: tc.pytree.TreeSpec
    forward_arg_names: list[str]
    state_dict: dict[str, torch.Tensor]
    constants: dict[str, torch.Tensor]
    range_constraints: dict[Any, Any]
    composite_decisions: dict[str, tuple[str, str]]
    grad_enabled_on_return: bool = True


@dataclasses.dataclass
class _InputSlot:
    kind: str  # parameter | buffer | constant | user
    target: str  # fqn, or the user input's name
    value: Any
    persistent: bool | None = None


def aot_export_module(mod: torch.nn.Module, args: tuple, *, pre_dispatch: bool = True,
                      decompositions: dict | None = None, kwargs: dict | None = None,
                      dynamic_shapes: Any = None,
                      composite_overrides: dict[str, str] | None = None,
                      ) -> tuple[torch.fx.GraphModule, AotSignature]:
    """Trace ``mod`` into a functional graph over lifted state and flat user inputs."""
    kwargs = dict(kwargs or {})
    args = tuple(args)
    state = lift_state(mod)
    flat_user, in_spec = tc.pytree.tree_flatten((args, kwargs))
    user_names, arg_names = user_input_names(mod, args, kwargs)
    slots = [_InputSlot(kind, fqn, t, (fqn not in state.non_persistent) if kind == "buffer" else None)
             for kind, fqn, t in state.items()]
    slots += [_InputSlot("user", n, v) for n, v in zip(user_names, flat_user)]

    fakeify = Fakeifier(dynamic_shapes, mod, args, kwargs)
    fake_inputs = [fakeify.state(s.value) if s.kind != "user" else fakeify.user(i, s.value)
                   for i, s in enumerate(slots)]
    n_state = len(slots) - len(flat_user)
    aliased = _inputs_sharing_memory(fake_inputs)
    policy = CompositePolicy(audit_lookup=shipped_decision, overrides=composite_overrides)
    meta: dict[str, Any] = {}

    def body(inputs: list[Any], mode) -> list[Any]:
        by_fqn = {s.target: t for s, t in zip(slots[:n_state], inputs[:n_state])}
        call_args, call_kwargs = tc.pytree.tree_unflatten(inputs[n_state:], in_spec)
        with tc.reparametrize(mod, by_fqn):
            out = mod(*call_args, **call_kwargs)
            reassigned = _reassigned_buffers(mod, slots[:n_state], inputs)
        flat_out, meta["out_spec"] = tc.pytree.tree_flatten(out)
        final = [reassigned.get(i, t) for i, t in enumerate(inputs)]
        mutated = [i for i, t in enumerate(inputs) if i in reassigned
                   or (isinstance(t, tc.FunctionalTensor) and tc.has_data_mutation(t))]
        for i in mutated:
            if slots[i].kind == "constant":
                raise UnsupportedError(
                    f"the model writes to tensor attribute {slots[i].target!r}, which is neither a "
                    "parameter nor a buffer; register it with register_buffer so the write can be "
                    "carried in the signature")
            if sharing := aliased.get(i):
                raise UnsupportedError(
                    f"the model writes to input {slots[i].target!r}, which shares memory with "
                    f"{', '.join(repr(slots[j].target) for j in sharing)}; a functional program "
                    "cannot carry a write through inputs that alias each other: pass distinct "
                    "tensors (e.g. .clone() one of them)")
        meta["mutated"] = [slots[i] for i in mutated]
        meta["output_is_input"] = [next((j for j, i in enumerate(mutated) if o is inputs[i]), None)
                                   for o in flat_out]
        return [final[i] for i in mutated] + flat_out

    with _preserved_model_state(mod):
        trace = trace_functional(body, fake_inputs, policy=policy,
                                 pre_dispatch=pre_dispatch, decompositions=decompositions)
    gm = trace.graph_module
    slots = _lift_traced_constants(gm, slots, n_state)
    _name_placeholders(gm, slots)
    gm = outline_regions(gm, trace.identity_edges)
    _eliminate_dead_code(gm)
    signature = _build_signature(gm, slots, meta["mutated"])
    if _copy_outputs_reading_written_inputs(gm, signature, meta["output_is_input"]):
        signature = _build_signature(gm, slots, meta["mutated"])
    guard_saved_mutated_inputs(gm, _written_placeholders(gm, signature), _grad_sources(gm, signature))
    for _, sub in all_graph_modules(gm):  # the passes above edit graphs; generate code once
        sub.recompile()
    state_dict = {**state.parameters,
                  **{k: v for k, v in state.buffers.items() if k not in state.non_persistent}}
    constants = {**{k: v for k, v in state.buffers.items() if k in state.non_persistent},
                 **{s.target: s.value for s in slots if s.kind == "constant"}}
    return gm, AotSignature(
        graph_signature=signature, in_spec=in_spec, out_spec=meta["out_spec"],
        forward_arg_names=arg_names, state_dict=state_dict, constants=constants,
        range_constraints=fakeify.range_constraints(gm),
        composite_decisions=dict(policy.decisions),
        grad_enabled_on_return=trace.grad_enabled_on_return)


def _reassigned_buffers(mod: torch.nn.Module, state_slots: list[_InputSlot],
                        inputs: list[Any]) -> dict[int, torch.Tensor]:
    """Buffers the forward replaced by assignment (``self.buf = self.buf + x``).

    Eager keeps the new tensor on the module, so it is a buffer mutation whose
    final value is the assigned tensor. Replacing a parameter, or a buffer by
    something of another shape or dtype, cannot be written back: refused.
    """
    found = {}
    for i, slot in enumerate(state_slots):
        if slot.kind not in ("parameter", "buffer"):
            continue
        prefix, _, name = slot.target.rpartition(".")
        owner = mod.get_submodule(prefix)
        current = (owner._parameters if slot.kind == "parameter" else owner._buffers).get(name)
        if current is inputs[i]:
            continue
        same_kind = (slot.kind == "buffer" and isinstance(current, torch.Tensor)
                     and current.shape == inputs[i].shape and current.dtype == inputs[i].dtype)
        if not same_kind:
            raise UnsupportedError(
                f"the model replaces {slot.kind} {slot.target!r} by assignment"
                + ("" if slot.kind == "parameter" else " with a value of another shape, dtype or type")
                + "; only buffers replaced by a tensor of the same shape and dtype can be carried "
                "as a mutation (or write in place: self.buf.copy_(new))")
        found[i] = current
    return found


def _inputs_sharing_memory(inputs: list[Any]) -> dict[int, list[int]]:
    """For each input index, the other inputs over the same storage (fakes keep it)."""
    by_storage: dict[Any, list[int]] = {}
    for i, t in enumerate(inputs):
        if isinstance(t, torch.Tensor) and t.layout == torch.strided:
            by_storage.setdefault(tc.StorageWeakRef(t.untyped_storage()), []).append(i)
    return {i: [j for j in group if j != i] for group in by_storage.values() if len(group) > 1
            for i in group}


@contextlib.contextmanager
def _preserved_model_state(mod: torch.nn.Module):
    """Exporting must not move the caller's RNG, nor its modules' training flags."""
    rng = torch.get_rng_state()
    training = [(m, m.training) for m in mod.modules()]
    try:
        yield
    finally:
        torch.set_rng_state(rng)
        for m, flag in training:
            m.training = flag


def _eliminate_dead_code(gm: torch.fx.GraphModule) -> None:
    """Drop unused view replays (in every body too); keep random ops so the RNG
    stream matches eager."""
    def impure(node: torch.fx.Node) -> bool:
        target = node.target
        if isinstance(target, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in target.tags:
            return True
        return node.is_impure()
    for _, sub in reversed(list(all_graph_modules(gm))):
        sub.graph.eliminate_dead_code(is_impure_node=impure)


def _lift_traced_constants(gm: torch.fx.GraphModule, slots: list[_InputSlot],
                           n_state: int) -> list[_InputSlot]:
    """Tensors created while tracing (``torch.tensor(...)``) become constant inputs."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    anchor = placeholders[n_state - 1] if n_state else None
    new_slots = []
    for node in list(gm.graph.nodes):
        if node.op != "get_attr" or not isinstance(getattr(gm, node.target, None), torch.Tensor):
            continue
        value = getattr(gm, node.target)
        fqn = f"lifted_tensor_{len(new_slots)}"
        ctx = (gm.graph.inserting_after(anchor) if anchor is not None
               else gm.graph.inserting_before(placeholders[0] if placeholders else None))
        with ctx:
            ph = gm.graph.placeholder(fqn)
        ph.meta.update(node.meta)
        node.replace_all_uses_with(ph)
        gm.graph.erase_node(node)
        delattr(gm, node.target)
        anchor = ph
        new_slots.append(_InputSlot("constant", fqn, value))
    return slots[:n_state] + new_slots + slots[n_state:]


def _name_placeholders(gm: torch.fx.GraphModule, slots: list[_InputSlot]) -> None:
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    assert len(placeholders) == len(slots), (len(placeholders), len(slots))
    for node, slot in zip(placeholders, slots):
        wanted = slot.target if slot.kind == "user" else placeholder_name(slot.kind, slot.target)
        tc.rename_node(node, wanted)
        node.target = node.name
        if slot.kind == "user" and not isinstance(slot.value, (torch.Tensor, torch.SymInt)):
            node.meta.setdefault("val", slot.value)  # a constant input, as torch.export records it


def _written_placeholders(gm: torch.fx.GraphModule,
                          signature: ExportGraphSignature) -> dict[torch.fx.Node, torch.fx.Node]:
    by_name = {n.name: n for n in gm.graph.nodes}
    input_name = {(s.target or s.arg.name): s.arg.name for s in signature.input_specs
                  if s.kind != InputKind.USER_INPUT}
    input_name.update({s.arg.name: s.arg.name for s in signature.input_specs
                       if s.kind == InputKind.USER_INPUT})
    return {by_name[input_name[s.target]]: by_name[s.arg.name] for s in signature.output_specs
            if s.kind != OutputKind.USER_OUTPUT and s.arg.name in by_name}


def _view_root(node: Any) -> Any:
    """The node a chain of view ops starts from (``node`` itself if it is no view)."""
    while (isinstance(node, torch.fx.Node) and isinstance(node.target, torch._ops.OpOverload)
           and node.target.is_view and node.args and isinstance(node.args[0], torch.fx.Node)):
        node = node.args[0]
    return node if isinstance(node, torch.fx.Node) else None


def _copy_outputs_reading_written_inputs(gm: torch.fx.GraphModule, signature: ExportGraphSignature,
                                         output_is_input: list[int | None]) -> bool:
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
    ``output_is_input[k]`` is the mutation position user output ``k`` really is, if any.
    Returns whether the graph changed."""
    written = _written_placeholders(gm, signature)
    rewritten = {p for p, v in written.items() if v is not p}
    out_node = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    outputs = list(out_node.args[0])
    n_mut = len(signature.output_specs) - len(output_is_input)
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
        root = _view_root(node)
        if getattr(root, "op", None) == "placeholder" and root is not targets[j]:
            outputs[j] = copy_of(f"mutation {j}", node)
        elif node in outputs[:j]:
            outputs[j] = copy_of(f"mutation {j}", node)
    mutation_nodes = set(outputs[:n_mut])
    for k, real in enumerate(output_is_input):
        node = outputs[n_mut + k]
        if real is not None:  # eager returned the written input itself
            outputs[n_mut + k] = outputs[real]
        elif _view_root(node) in rewritten or node in mutation_nodes:
            outputs[n_mut + k] = copy_of("output", node)
    if copies:
        out_node.args = (tuple(outputs),)
    return bool(copies)


def _grad_sources(gm: torch.fx.GraphModule, signature: ExportGraphSignature) -> set[torch.fx.Node]:
    by_name = {n.name: n for n in gm.graph.nodes}
    sources = set()
    for spec in signature.input_specs:
        node = by_name[spec.arg.name]
        val = node.meta.get("val")
        floating = isinstance(val, torch.Tensor) and (val.is_floating_point() or val.is_complex())
        if spec.kind == InputKind.PARAMETER or (spec.kind == InputKind.USER_INPUT and floating):
            sources.add(node)
    return sources


def _argument(node: Any) -> Any:
    if isinstance(node, torch.fx.Node):
        val = node.meta.get("val")
        if isinstance(val, torch.SymInt):
            return SymIntArgument(name=node.name)
        if isinstance(val, torch.Tensor) or val is None:
            return TensorArgument(name=node.name)
        return ConstantArgument(name=node.name, value=val)
    return ConstantArgument(name="", value=node)


def _build_signature(gm: torch.fx.GraphModule, slots: list[_InputSlot],
                     mutated: list[_InputSlot]) -> ExportGraphSignature:
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    input_specs = []
    for node, slot in zip(placeholders, slots):
        if slot.kind == "user":
            arg = (_argument(node) if isinstance(slot.value, (torch.Tensor, torch.SymInt))
                   else ConstantArgument(name=node.name, value=slot.value))
            input_specs.append(InputSpec(InputKind.USER_INPUT, arg, target=None))
        else:
            input_specs.append(InputSpec(_INPUT_KIND[slot.kind], TensorArgument(node.name),
                                         target=slot.target, persistent=slot.persistent))
    outputs = list(next(n for n in reversed(gm.graph.nodes) if n.op == "output").args[0])
    output_specs = []
    for slot, out in zip(mutated, outputs):
        output_specs.append(OutputSpec(_MUTATION_KIND[slot.kind], _argument(out), target=slot.target))
    for out in outputs[len(mutated):]:
        output_specs.append(OutputSpec(OutputKind.USER_OUTPUT, _argument(out), target=None))
    return ExportGraphSignature(input_specs, output_specs)
