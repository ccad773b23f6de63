"""The graph signature: which placeholder is which input, which output is which
mutation. Built last, from the finished graph and the input slots of the lift."""

from __future__ import annotations

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
    SymBoolArgument,
    SymFloatArgument,
    SymIntArgument,
    TensorArgument,
)

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
class InputSlot:
    """One graph input in the making: what it is and where its value came from."""

    kind: str  # parameter | buffer | constant | user
    target: str  # fqn, or the user input's name
    value: Any
    persistent: bool | None = None


def written_placeholders(gm: torch.fx.GraphModule,
                          signature: ExportGraphSignature) -> dict[torch.fx.Node, torch.fx.Node]:
    by_name = {n.name: n for n in gm.graph.nodes}
    input_name = {(s.target or s.arg.name): s.arg.name for s in signature.input_specs
                  if s.kind != InputKind.USER_INPUT}
    input_name.update({s.arg.name: s.arg.name for s in signature.input_specs
                       if s.kind == InputKind.USER_INPUT})
    return {by_name[input_name[s.target]]: by_name[s.arg.name] for s in signature.output_specs
            if s.kind != OutputKind.USER_OUTPUT and s.arg.name in by_name}


def grad_sources(gm: torch.fx.GraphModule, signature: ExportGraphSignature) -> set[torch.fx.Node]:
    by_name = {n.name: n for n in gm.graph.nodes}
    sources = set()
    for spec in signature.input_specs:
        node = by_name[spec.arg.name]
        val = node.meta.get("val")
        floating = isinstance(val, torch.Tensor) and (val.is_floating_point() or val.is_complex())
        if spec.kind == InputKind.PARAMETER or (spec.kind == InputKind.USER_INPUT and floating):
            sources.add(node)
    return sources


def argument(node: Any) -> Any:
    if isinstance(node, torch.fx.Node):
        val = node.meta.get("val")
        if isinstance(val, torch.SymInt):
            return SymIntArgument(name=node.name)
        if isinstance(val, torch.SymFloat):  # x.item() of a float tensor, returned
            return SymFloatArgument(name=node.name)
        if isinstance(val, torch.SymBool):
            return SymBoolArgument(name=node.name)
        if isinstance(val, torch.Tensor) or val is None:
            return TensorArgument(name=node.name)
        return ConstantArgument(name=node.name, value=val)
    return ConstantArgument(name="", value=node)


def build_signature(gm: torch.fx.GraphModule, slots: list[InputSlot],
                     mutated: list[InputSlot]) -> ExportGraphSignature:
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    input_specs = []
    for node, slot in zip(placeholders, slots):
        if slot.kind == "user":
            arg = (argument(node) if isinstance(slot.value, (torch.Tensor, torch.SymInt))
                   else ConstantArgument(name=node.name, value=slot.value))
            input_specs.append(InputSpec(InputKind.USER_INPUT, arg, target=None))
        else:
            input_specs.append(InputSpec(_INPUT_KIND[slot.kind], TensorArgument(node.name),
                                         target=slot.target, persistent=slot.persistent))
    outputs = list(next(n for n in reversed(gm.graph.nodes) if n.op == "output").args[0])
    output_specs = []
    # a user input mutation names its placeholder, which fx may have renamed
    # (a forward argument called ``input`` shadows a builtin: ``input_1``)
    user_placeholder = {id(slot): node.name for node, slot in zip(placeholders, slots) if slot.kind == "user"}
    for slot, out in zip(mutated, outputs):
        target = user_placeholder.get(id(slot), slot.target) if slot.kind == "user" else slot.target
        output_specs.append(OutputSpec(_MUTATION_KIND[slot.kind], argument(out), target=target))
    for out in outputs[len(mutated):]:
        output_specs.append(OutputSpec(OutputKind.USER_OUTPUT, argument(out), target=None))
    return ExportGraphSignature(input_specs, output_specs)
