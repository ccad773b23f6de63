"""The joint program's signature, in torch's words for joint graphs.

Inputs: the forward's, with the optimizer's state and learning rates (if any) as buffers
after the forward's buffers. Outputs, in torch's order (``_export_forward_backward``'s,
which ExecuTorch's training flow reads): the forward's mutations
(``BUFFER_MUTATION`` / ``USER_INPUT_MUTATION``), the optimizer's writes
(``PARAMETER_MUTATION``, ``BUFFER_MUTATION``), the loss (``LOSS_OUTPUT``), the forward's
other outputs (``USER_OUTPUT``), the gradients of parameters (``GRADIENT_TO_PARAMETER``,
target: the parameter's name), then of user inputs (``GRADIENT_TO_USER_INPUT``, target:
the input's placeholder name). A parameter the loss does not reach has no gradient
output (eager leaves its ``.grad`` untouched).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.export.graph_signature import (
    ExportGraphSignature,
    InputKind,
    InputSpec,
    OutputKind,
    OutputSpec,
    TensorArgument,
)

from ..program.signature import argument


def joint_signature(gm: torch.fx.GraphModule, forward: ExportGraphSignature, grad_of: tuple[int, ...], *,
                    loss_index: int = 0, state_buffers: Sequence[str] = (),
                    writes: Sequence[tuple[OutputKind, str]] = ()) -> ExportGraphSignature:
    placeholders = iter(n for n in gm.graph.nodes if n.op == "placeholder")
    outputs = list(gm.graph.output_node().args[0])  # type: ignore[arg-type]
    input_specs: list[InputSpec] = []
    state_placed = not state_buffers
    for spec in forward.input_specs:
        if spec.kind is InputKind.USER_INPUT and not state_placed:
            input_specs += _state_specs(placeholders, state_buffers)
            state_placed = True
        node = next(placeholders)
        arg = argument(node) if isinstance(spec.arg, TensorArgument) else spec.arg
        input_specs.append(InputSpec(spec.kind, arg, spec.target, spec.persistent))
    if not state_placed:
        input_specs += _state_specs(placeholders, state_buffers)
    forward_outputs = list(forward.output_specs)
    n_mutations = sum(1 for s in forward_outputs if s.kind is not OutputKind.USER_OUTPUT)
    values = iter(outputs)
    output_specs = [OutputSpec(s.kind, argument(next(values)), s.target) for s in forward_outputs[:n_mutations]]
    output_specs += [OutputSpec(kind, argument(next(values)), target) for kind, target in writes]
    for users, out in enumerate(forward_outputs[n_mutations:]):
        kind = OutputKind.LOSS_OUTPUT if users == loss_index else out.kind
        output_specs.append(OutputSpec(kind, argument(next(values)), out.target))
    for index in grad_of:
        source = forward.input_specs[index]
        if source.kind is InputKind.PARAMETER:
            output_specs.append(OutputSpec(OutputKind.GRADIENT_TO_PARAMETER, argument(next(values)), source.target))
        else:
            output_specs.append(OutputSpec(OutputKind.GRADIENT_TO_USER_INPUT, argument(next(values)),
                                           source.arg.name))
    return ExportGraphSignature(input_specs=input_specs, output_specs=output_specs)


def _state_specs(placeholders, names: Sequence[str]) -> list[InputSpec]:
    return [InputSpec(InputKind.BUFFER, argument(next(placeholders)), name, True) for name in names]


__all__ = ["joint_signature"]
