"""``pf.aot_export_module``: the forward layer (``predispatch_func.aot``) plus
``trace_joint=True, output_loss_index=0``, torch's calling convention for a joint graph, which
torch's own refuses with ``pre_dispatch=True``. (Here, not in aot.py: the joint export builds
on ``export``, which builds on aot.py.)

Returns ``(graph_module, graph_signature)``: the joint program's graph (outputs: mutated
buffers and inputs, the model's outputs with the loss among them, then gradients of
parameters and of user inputs that require grad) and its ``ExportGraphSignature``, whose
``backward_signature`` holds ``gradients_to_parameters``, ``gradients_to_user_inputs`` and
``loss_output`` as torch's ``GraphSignature.backward_signature`` does.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import aot
from ..export import export
from ..frame_stack import on_a_reserved_frame_stack
from .export import differentiate_program


@on_a_reserved_frame_stack
def aot_export_module(mod: torch.nn.Module, args: Any, *, trace_joint: bool = False,
                      output_loss_index: int | None = None, **kwargs: Any) -> tuple[torch.fx.GraphModule, Any]:
    """``predispatch_func.aot.aot_export_module`` (same arguments); with ``trace_joint=True`` the
    joint graph and its ``ExportGraphSignature`` (``backward_signature`` as torch's), the loss
    being flat output ``output_loss_index`` (docs/joint.md)."""
    if not trace_joint:
        return aot.aot_export_module(mod, args, **kwargs)
    joint_kwargs = {k: kwargs[k] for k in ("kwargs", "dynamic_shapes", "composite_overrides", "target",
                                           "python_state") if k in kwargs}
    return aot_export_joint(mod, args, output_loss_index=output_loss_index, **joint_kwargs)


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


__all__ = ["aot_export_joint", "aot_export_module"]
