"""The program's inputs and its graph signature.

:class:`Inputs` (built by ``lift.collect_inputs``) says what each placeholder
is, in order: lifted state, then the flat user inputs. Tracing adds what the
model wrote (``mutations.Mutations``). From both and the finished graph,
:func:`build_signature` builds the ``ExportGraphSignature`` once, at the end;
the passes before it read the same two artifacts, never a signature.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import TYPE_CHECKING, Any

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

from .. import _torch_compat as tc
from ..autograd_facts import may_carry_grad

if TYPE_CHECKING:
    from .mutations import Mutations


class SlotKind(enum.Enum):
    """What a graph input is, and how torch's signature names it and a write to it."""

    PARAMETER = ("p", InputKind.PARAMETER, OutputKind.PARAMETER_MUTATION)
    BUFFER = ("b", InputKind.BUFFER, OutputKind.BUFFER_MUTATION)
    CONSTANT = ("c", InputKind.CONSTANT_TENSOR, None)
    USER = ("", InputKind.USER_INPUT, OutputKind.USER_INPUT_MUTATION)

    def __init__(self, prefix: str, input_kind: InputKind, mutation_kind: OutputKind | None):
        self.prefix = prefix  # placeholder names: p_<fqn>, b_<fqn>, c_<fqn>
        self.input_kind = input_kind
        self.mutation_kind = mutation_kind


@dataclasses.dataclass(frozen=True, eq=False)  # one slot per input: compared by identity
class InputSlot:
    """One graph input: what it is, its name (fqn, or the user input's name), its value."""

    kind: SlotKind
    target: str
    value: Any
    persistent: bool | None = None  # buffers only


@dataclasses.dataclass(frozen=True)
class Inputs:
    """Every graph input in placeholder order: lifted state (parameters, buffers,
    constants), then the flat user inputs; and how to rebuild the user's call."""

    slots: tuple[InputSlot, ...]
    n_state: int
    in_spec: tc.pytree.TreeSpec
    forward_arg_names: tuple[str, ...]
    # other names of a lifted tensor (tied weights: ``head.weight`` of ``emb.weight``), as
    # (alias, the slot's target): the graph reads one placeholder, the program's state
    # dict (and ``module()``, ``unflatten``) has every name the model's has
    aliases: tuple[tuple[str, str], ...] = ()

    def with_constants(self, lifted: list[InputSlot]) -> Inputs:
        """These inputs with constants created while tracing, placed after the state."""
        slots = (*self.slots[:self.n_state], *lifted, *self.slots[self.n_state:])
        return dataclasses.replace(self, slots=slots, n_state=self.n_state + len(lifted))

    def positions(self) -> dict[InputSlot, int]:
        """Each slot's placeholder position."""
        return {s: i for i, s in enumerate(self.slots)}

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self._with_aliases({s.target: s.value for s in self.slots
                                   if s.kind is SlotKind.PARAMETER or (s.kind is SlotKind.BUFFER and s.persistent)})

    def constants(self) -> dict[str, torch.Tensor]:
        return self._with_aliases({s.target: s.value for s in self.slots
                                   if s.kind is SlotKind.CONSTANT or (s.kind is SlotKind.BUFFER and not s.persistent)})

    def _with_aliases(self, named: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return named | {alias: named[target] for alias, target in self.aliases if target in named}


def _placeholders(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "placeholder"]


def _returned(gm: torch.fx.GraphModule) -> list[Any]:
    return list(gm.graph.output_node().args[0])  # type: ignore[arg-type]


def written_placeholders(gm: torch.fx.GraphModule, inputs: Inputs, mutations: Mutations,
                         skip: set[InputSlot] | frozenset[InputSlot] = frozenset()
                         ) -> dict[torch.fx.Node, torch.fx.Node]:
    """Each written input's placeholder (but those of ``skip``) -> the node holding its final value."""
    placeholders, returned, position = _placeholders(gm), _returned(gm), inputs.positions()
    return {placeholders[position[slot]]: returned[k] for k, slot in enumerate(mutations.mutated)
            if slot not in skip}


def placeholders_of(gm: torch.fx.GraphModule, inputs: Inputs, slots: Any) -> frozenset[torch.fx.Node]:
    """The placeholders of ``slots``."""
    placeholders, position = _placeholders(gm), inputs.positions()
    return frozenset(placeholders[position[slot]] for slot in slots)


def grad_sources(gm: torch.fx.GraphModule, inputs: Inputs) -> set[torch.fx.Node]:
    """The placeholders that may require grad: parameters and float user inputs."""
    sources = set()
    for node, slot in zip(_placeholders(gm), inputs.slots):
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


def build_signature(gm: torch.fx.GraphModule, inputs: Inputs, mutations: Mutations) -> ExportGraphSignature:
    input_specs = []
    for node, slot in zip(_placeholders(gm), inputs.slots):
        if slot.kind is SlotKind.USER:
            # an int input declared dynamic (Dim.DYNAMIC on a Python int) was traced as a SymInt
            symbolic = isinstance(slot.value, (torch.Tensor, torch.SymInt)) or isinstance(node.meta.get("val"),
                                                                                         torch.SymInt)
            arg = argument(node) if symbolic else ConstantArgument(name=node.name, value=slot.value)
            input_specs.append(InputSpec(InputKind.USER_INPUT, arg, target=None))
        else:
            input_specs.append(InputSpec(slot.kind.input_kind, TensorArgument(node.name),
                                         target=slot.target, persistent=slot.persistent))
    returned, placeholders, position = _returned(gm), _placeholders(gm), inputs.positions()
    n_mut = len(mutations.mutated)
    # a user input mutation names its placeholder, which fx may have renamed
    # (a forward argument called ``input`` shadows a builtin: ``input_1``)
    output_specs = [OutputSpec(slot.kind.mutation_kind, argument(out),  # type: ignore[arg-type]
                               target=placeholders[position[slot]].name if slot.kind is SlotKind.USER
                               else slot.target)
                    for slot, out in zip(mutations.mutated, returned)]
    output_specs += [OutputSpec(OutputKind.USER_OUTPUT, argument(out), target=None) for out in returned[n_mut:]]
    return ExportGraphSignature(input_specs, output_specs)
