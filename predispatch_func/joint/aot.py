"""``aot_export_module(mod, args, trace_joint=True, output_loss_index=0)``: torch's calling
convention for a joint graph, which torch's own refuses with ``pre_dispatch=True``.

Returns ``(graph_module, graph_signature)``: the joint program's graph (outputs: mutated
buffers and inputs, the model's outputs with the loss among them, then gradients of
parameters and of user inputs that require grad) and its ``ExportGraphSignature``, whose
``backward_signature`` holds ``gradients_to_parameters``, ``gradients_to_user_inputs`` and
``loss_output`` as torch's ``GraphSignature.backward_signature`` does.
"""

from __future__ import annotations

from typing import Any

import torch

from ..export import export
from .export import differentiate_program


def aot_export_joint(mod: torch.nn.Module, args: Any, *, output_loss_index: int | None, kwargs: dict | None = None,
                     **export_kwargs: Any) -> tuple[torch.fx.GraphModule, Any]:
    if output_loss_index is None:
        raise ValueError("aot_export_module(trace_joint=True) needs output_loss_index: which flat output is the "
                         "loss (torch's convention)")
    args = tuple(args) if isinstance(args, (tuple, list)) else (args,)
    target = export_kwargs.get("target")
    forward = export(mod, args, kwargs, **export_kwargs)
    ep = differentiate_program(forward, args, kwargs, target=target, loss_index=output_loss_index)
    return ep.graph_module, ep.graph_signature


__all__ = ["aot_export_joint"]
