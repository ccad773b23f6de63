"""The public entry point: ``export(model, args) -> torch.export.ExportedProgram``."""

from __future__ import annotations

from typing import Any

import torch
from torch.export.exported_program import ExportedProgram

from . import _torch_compat as tc
from .aot import aot_export_module
from .autograd_facts import may_carry_grad
from .errors import ExportError
from .frame_stack import on_a_reserved_frame_stack
from .inputs import tensor_subclasses
from .inputs.dynamic_shapes_spec import int_inputs_unwrapped
from .inputs.input_check import checked_call
from .program.runtime import to_exported_program
from .trace import environment


@on_a_reserved_frame_stack
def export(model: torch.nn.Module, args: tuple, kwargs: dict | None = None, *,
           pre_dispatch: bool = True, dynamic_shapes: Any = None,
           composite_overrides: dict[str, str] | None = None,
           python_state: str = "error", target: Any = None,
           preserve_module_call_signature: tuple[str, ...] = (), strict: bool = False,
           prefer_deferred_runtime_asserts_over_guards: bool = False) -> ExportedProgram:
    """Export ``model`` into the functional pre-dispatch IR (see design.md's contract).

    Takes ``torch.export.export``'s arguments, so it can replace it in a pipeline:
    ``dynamic_shapes`` in any of torch's forms (dict, tuple/list in forward's signature
    order, ``ShapesCollection``, ``AdditionalInputs``); ``strict`` is accepted and the
    trace is always torch's non-strict one (Python runs as in eager, which is
    torch.export's default; our state guard reports what strict mode's capture would
    refuse); ``prefer_deferred_runtime_asserts_over_guards`` turns what the trace assumes
    of a dynamic size into runtime asserts of the program instead of guards, as in torch.export.

    ``pre_dispatch=False`` gives the same contract one level lower: after
    autograd, plain ATen. ``composite_overrides`` maps an op name such as
    ``"aten.linear.default"`` to ``"keep"`` or ``"decompose"``. A Python-level
    change of the model (an attribute written in ``forward``) is refused unless
    ``python_state="warn"``; the model is left as it was either way. ``target`` (an
    :class:`~predispatch_func.opsets.OpSet`, e.g. ``OpSet.core_aten()``) restricts
    every graph to that op set, decomposing what lies outside it while tracing.
    ``preserve_module_call_signature``: submodule paths whose calling convention
    ``torch.export.unflatten`` keeps (so they can be swapped), as in torch.export.
    """
    del strict  # see the docstring
    with environment.around_the_export():
        args, kwargs, dynamic_shapes = int_inputs_unwrapped(model, args, kwargs or {}, dynamic_shapes)
        with environment.around_the_call((args, kwargs)) as leak_watch:
            args, kwargs = checked_call(model, args, kwargs)
            try:
                gm, sig = aot_export_module(model, args, kwargs=kwargs, pre_dispatch=pre_dispatch,
                                            dynamic_shapes=dynamic_shapes,
                                            composite_overrides=composite_overrides,
                                            python_state=python_state, target=target,
                                            preserve_module_call_signature=tuple(preserve_module_call_signature),
                                            prefer_deferred_runtime_asserts_over_guards=(
                                                prefer_deferred_runtime_asserts_over_guards))
            except ExportError as err:
                refusal = tensor_subclasses.refusal_for(err)
                if refusal is None:
                    raise
                raise refusal from err.__cause__
        ep = to_exported_program(gm, sig, example_inputs=_detached((args, kwargs)))
        if leak_watch is not None:
            leak_watch.report(tc.fake_mode_of([n.meta.get("val") for n in ep.graph.find_nodes(op="placeholder")]))
        if isinstance(dynamic_shapes, torch.export.AdditionalInputs):
            # as torch.export: every example the spec was inferred from must run (a size the trace fixed,
            # a relation it found, fails here, not in the caller's pipeline)
            dynamic_shapes.verify(ep)
        return ep


def _detached(inputs: Any) -> Any:
    """The example inputs as the program keeps them: aliases without autograd history,
    so the program can be deep-copied (torch refuses to deep-copy a non-leaf) and
    keeps no activation graph alive; a leaf that required grad still does."""
    def one(t: torch.Tensor) -> torch.Tensor:
        return t.detach().requires_grad_(t.requires_grad and may_carry_grad(t))
    return tc.pytree.tree_map_only(torch.Tensor, one, inputs)


def functionalize(ep: ExportedProgram, args: tuple | None = None,
                  kwargs: dict | None = None) -> ExportedProgram:
    """Bring any ExportedProgram (e.g. torch.export's non-functional training IR) to our contract.

    Its region HOPs (torch's ``wrap_with_set_grad_enabled`` / ``wrap_with_autocast``
    or ours) inline their bodies when called, so re-tracing records their
    grad/autocast markers and our region pass outlines them again, with every
    mutation inside threaded out.
    """
    if args is None:
        if ep.example_inputs is None:
            raise ValueError("functionalize needs args when the program has no example inputs")
        args, kwargs = ep.example_inputs
    return export(ep.module(), tuple(args), dict(kwargs or {}))
