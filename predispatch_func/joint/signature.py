"""The joint program's signature, in torch's words for joint graphs.

Outputs, in torch's order (``_export_forward_backward``'s, which ExecuTorch's training
flow reads): the forward's mutations (``BUFFER_MUTATION`` / ``USER_INPUT_MUTATION``),
the loss (``LOSS_OUTPUT``), the forward's other outputs (``USER_OUTPUT``), the gradients
of parameters (``GRADIENT_TO_PARAMETER``, target: the parameter's name), then of user
inputs (``GRADIENT_TO_USER_INPUT``, target: the input's placeholder name). A parameter
the loss does not reach has no gradient output (eager leaves its ``.grad`` untouched).
"""

from __future__ import annotations

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


def joint_signature(gm: torch.fx.GraphModule, forward: ExportGraphSignature, grad_of: tuple[int, ...],
                    *, loss_index: int = 0) -> ExportGraphSignature:
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    outputs = list(gm.graph.output_node().args[0])  # type: ignore[arg-type]
    input_specs = [InputSpec(s.kind, argument(node) if isinstance(s.arg, TensorArgument) else s.arg, s.target,
                             s.persistent)
                   for s, node in zip(forward.input_specs, placeholders)]
    output_specs = []
    n_forward = len(forward.output_specs)
    users = 0
    for spec, node in zip(forward.output_specs, outputs[:n_forward]):
        kind = spec.kind
        if kind is OutputKind.USER_OUTPUT:
            kind = OutputKind.LOSS_OUTPUT if users == loss_index else kind
            users += 1
        output_specs.append(OutputSpec(kind, argument(node), spec.target))
    for index, node in zip(grad_of, outputs[n_forward:]):
        source = forward.input_specs[index]
        if source.kind is InputKind.PARAMETER:
            output_specs.append(OutputSpec(OutputKind.GRADIENT_TO_PARAMETER, argument(node), source.target))
        else:
            output_specs.append(OutputSpec(OutputKind.GRADIENT_TO_USER_INPUT, argument(node),
                                           placeholders[index].name))
    return ExportGraphSignature(input_specs=input_specs, output_specs=output_specs)


__all__ = ["joint_signature"]
