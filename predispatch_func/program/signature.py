"""The graph signature, built once at the end from the artifacts.

:class:`~predispatch_func.artifacts.Inputs` says what each placeholder is, in
order: lifted state, then the flat user inputs; tracing adds what the model
wrote (:class:`~predispatch_func.artifacts.Mutations`). From both and the
finished graph, :func:`build_signature` builds the ``ExportGraphSignature``;
the passes before it read the same artifacts (through
:class:`~predispatch_func.artifacts.Placeholders`), never a signature.
"""

from __future__ import annotations

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

from ..artifacts import Mutations, Placeholders, SlotKind
from ..autograd_facts import may_carry_grad


def _returned(gm: torch.fx.GraphModule) -> list[Any]:
    return list(gm.graph.output_node().args[0])  # type: ignore[arg-type]


def grad_sources(placeholders: Placeholders) -> set[torch.fx.Node]:
    """The placeholders that may require grad: parameters and float user inputs."""
    sources = set()
    for node, slot in placeholders.pairs():
        val = node.meta.get("val")
        if slot.kind is SlotKind.PARAMETER or (slot.kind is SlotKind.USER and may_carry_grad(val)):
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


def build_signature(gm: torch.fx.GraphModule, placeholders: Placeholders, mutations: Mutations
                    ) -> ExportGraphSignature:
    input_specs = []
    for node, slot in placeholders.pairs():
        if slot.kind is SlotKind.USER:
            # an int input declared dynamic (Dim.DYNAMIC on a Python int) was traced as a SymInt
            symbolic = isinstance(slot.value, (torch.Tensor, torch.SymInt)) or isinstance(node.meta.get("val"),
                                                                                         torch.SymInt)
            arg = argument(node) if symbolic else ConstantArgument(name=node.name, value=slot.value)
            input_specs.append(InputSpec(InputKind.USER_INPUT, arg, target=None))
        else:
            input_specs.append(InputSpec(slot.kind.input_kind, TensorArgument(node.name),
                                         target=slot.target, persistent=slot.persistent))
    returned = _returned(gm)
    n_mut = len(mutations.mutated)
    # a user input mutation names its placeholder, which fx may have renamed
    # (a forward argument called ``input`` shadows a builtin: ``input_1``)
    output_specs = [OutputSpec(slot.kind.mutation_kind, argument(out),  # type: ignore[arg-type]
                               target=placeholders[slot].name if slot.kind is SlotKind.USER
                               else slot.target)
                    for slot, out in zip(mutations.mutated, returned)]
    output_specs += [OutputSpec(OutputKind.USER_OUTPUT, argument(out), target=None) for out in returned[n_mut:]]
    return ExportGraphSignature(input_specs, output_specs)
