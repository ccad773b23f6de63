"""The public entry point: ``export(model, args) -> torch.export.ExportedProgram``."""

from __future__ import annotations

from typing import Any

import torch
from torch.export.exported_program import ExportedProgram, ModuleCallEntry, ModuleCallSignature

from .aot import AotSignature, aot_export_module


def export(model: torch.nn.Module, args: tuple, kwargs: dict | None = None, *,
           pre_dispatch: bool = True, dynamic_shapes: Any = None,
           composite_overrides: dict[str, str] | None = None) -> ExportedProgram:
    """Export ``model`` into the functional pre-dispatch IR (see design.md's contract).

    ``pre_dispatch=False`` gives the same contract one level lower: after
    autograd, plain ATen. ``composite_overrides`` maps an op name such as
    ``"aten.linear.default"`` to ``"keep"`` or ``"decompose"``.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"export expects an nn.Module, got {type(model).__name__}")
    if not isinstance(args, tuple):
        args = (args,)
    gm, sig = aot_export_module(model, args, kwargs=kwargs, pre_dispatch=pre_dispatch,
                                dynamic_shapes=dynamic_shapes,
                                composite_overrides=composite_overrides)
    return to_exported_program(gm, sig, example_inputs=(args, dict(kwargs or {})))


def to_exported_program(gm: torch.fx.GraphModule, sig: AotSignature,
                        example_inputs: Any = None) -> ExportedProgram:
    call_signature = ModuleCallSignature(inputs=[], outputs=[], in_spec=sig.in_spec,
                                         out_spec=sig.out_spec,
                                         forward_arg_names=sig.forward_arg_names)
    ep = ExportedProgram(
        root=gm, graph=gm.graph, graph_signature=sig.graph_signature,
        state_dict=sig.state_dict, range_constraints=sig.range_constraints,
        module_call_graph=[ModuleCallEntry(fqn="", signature=call_signature)],
        example_inputs=example_inputs, constants=sig.constants,
    )
    ep.graph_module.meta["composite_decisions"] = sig.composite_decisions
    return ep
