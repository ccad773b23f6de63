"""``aot_export_module``: the layer under :func:`predispatch_func.export`.

It owns lifting (parameters, buffers, tensor constants become placeholders),
functionalization (one trace through the mode stack) and the mutation
metadata (which inputs the model wrote, and their final values as outputs).

Pipeline, one artifact per stage (the stages live in ``program/``): ``Inputs`` (lift.py: the graph inputs,
named) -> fakes (fakeify.py) -> ``Trace`` and ``Mutations`` (``pipeline.trace_subgraph``:
the trace (trace/) with the constants it made lifted, its regions outlined (regions/),
dead code dropped; mutations.py: what the model wrote) -> graph passes
(graph_cleanup.py, writeback_guard.py; each edits the graph and reads the
artifacts) -> the signature, built once (signature.py). The bodies of custom
Functions and hooks go through the same ``trace_subgraph``.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from .artifacts import AotSignature, Inputs, Placeholders, SlotKind, Trace
from .graphs import all_graph_modules
from .inputs.fakeify import Fakeifier
from .inputs.lift import collect_inputs
from .inputs.tied_names import with_tied_names
from .opsets.lowering import Lowering
from .passes import node_meta
from .passes.grad_free_inputs import inputs_without_grad
from .passes.graph_cleanup import (
    copy_outputs_reading_written_inputs,
    lift_traced_constants,
    name_placeholders,
    written_placeholders,
)
from .passes.writeback_guard import clone_relaid_inputs, guard_saved_mutated_inputs
from .pipeline import TraceSettings, trace_subgraph
from .program.aliased_inputs import AliasGroup
from .program.module_signatures import PreservedCalls
from .program.mutations import AliasedInputsWritten, ModelCall
from .program.signature import build_signature, grad_sources
from .schema_audit import shipped_decision, shipped_untested_layouts
from .state.state_guard import StateGuard
from .trace import CompositePolicy, environment, persisted_fake_dispatch
from .trace.environment import CallRecorders


def aot_export_module(mod: torch.nn.Module, args: Any, *, pre_dispatch: bool = True,
                      decompositions: dict | None = None, kwargs: dict | None = None,
                      dynamic_shapes: Any = None,
                      composite_overrides: dict[str, str] | None = None,
                      target: Any = None, python_state: str = "error",
                      preserve_module_call_signature: tuple[str, ...] = (),
                      prefer_deferred_runtime_asserts_over_guards: bool = False,
                      ) -> tuple[torch.fx.GraphModule, AotSignature]:
    """Trace ``mod`` into a functional graph over lifted state and flat user inputs.

    ``python_state="warn"`` turns the refusal of Python-level changes the program
    cannot carry (see :mod:`predispatch_func.state.state_guard`) into a warning.

    ``args`` is a tuple of positional arguments (a single tensor is one argument,
    as in :func:`~predispatch_func.export`). ``target`` (an
    :class:`~predispatch_func.opsets.OpSet`) lowers every op outside it while
    tracing (``opsets/lowering.py``), or refuses naming the ops it cannot lower.
    ``preserve_module_call_signature`` records each listed submodule's calling
    convention for ``torch.export.unflatten``, as torch.export.
    ``prefer_deferred_runtime_asserts_over_guards``: what the trace assumes about a dynamic
    size becomes a runtime assert in the program instead of a guard (or a narrowed range),
    as torch.export.

    Inputs that share memory and that the model writes are found by a first trace and
    traced again over a synthetic base (program/aliased_inputs.py).
    """
    export = functools.partial(
        _aot_export_module, mod, args, pre_dispatch=pre_dispatch, decompositions=decompositions, kwargs=kwargs,
        dynamic_shapes=dynamic_shapes, composite_overrides=composite_overrides, target=target,
        python_state=python_state, preserve_module_call_signature=preserve_module_call_signature,
        prefer_deferred_runtime_asserts_over_guards=prefer_deferred_runtime_asserts_over_guards)
    try:
        return export(over_bases=())
    except AliasedInputsWritten as written:
        return export(over_bases=written.groups)


def _aot_export_module(mod: torch.nn.Module, args: Any, *, pre_dispatch: bool, decompositions: dict | None,
                       kwargs: dict | None, dynamic_shapes: Any, composite_overrides: dict[str, str] | None,
                       target: Any, python_state: str, preserve_module_call_signature: tuple[str, ...],
                       prefer_deferred_runtime_asserts_over_guards: bool, over_bases: tuple[AliasGroup, ...],
                       ) -> tuple[torch.fx.GraphModule, AotSignature]:
    args, kwargs = (tuple(args) if isinstance(args, (tuple, list)) else (args,)), dict(kwargs or {})
    inputs = collect_inputs(mod, args, kwargs)
    fakeify = Fakeifier(dynamic_shapes, mod, args, kwargs,
                        prefer_deferred_runtime_asserts_over_guards=prefer_deferred_runtime_asserts_over_guards)
    fakes = [fakeify.user(s.value) if s.kind is SlotKind.USER else fakeify.state(s.value) for s in inputs.slots]
    fakeify.relate_derived_dims()
    lowering = Lowering(target) if target is not None else None
    policy = CompositePolicy(audit_lookup=shipped_decision, overrides=composite_overrides, lowering=lowering,
                             untested_layouts=shipped_untested_layouts)
    preserved = PreservedCalls(mod, preserve_module_call_signature)
    guard = StateGuard(mod, (args, kwargs), python_state=python_state)
    call = ModelCall(mod, inputs, fakes, CallRecorders(node_metadata=lambda: node_meta.recording(mod),
                                                       preserved_calls=preserved.bracketing,
                                                       after_the_call=guard.note_memo_entries),
                     over_bases=over_bases)
    settings = TraceSettings(policy, {**(lowering.proxy_table() if lowering else {}), **(decompositions or {})})
    with environment.around_the_model_state(guard, lambda: persisted_fake_dispatch.seeded(mod, fakes)):
        traced = trace_subgraph(call, fakes, grad_enabled=True, settings=settings, pre_dispatch=pre_dispatch,
                                fake_mode=fakeify.mode, prepare=functools.partial(_named_inputs, inputs, guard, call))
    trace, gm, mutations = traced.trace, traced.graph_module, call.mutations
    aliasing = tuple(tuple((traced.placeholders[inputs.slots[i]].name, geometry, same)
                           for i, geometry, same in zip(group.members, group.geometries, group.same_as))
                     for group in call.alias_groups)
    written_through_data = {inputs.slots[i] for i in trace.hidden_written}
    placeholders = traced.placeholders
    inputs = placeholders.inputs  # with the constants the trace created
    if lowering is not None:
        lowering.check(gm)
        lowering.warn_decomposed_members(policy.decisions)
    copy_outputs_reading_written_inputs(gm, placeholders, mutations)
    written = written_placeholders(gm, placeholders, mutations)
    guard_saved_mutated_inputs(gm, written_placeholders(gm, placeholders, mutations, skip=written_through_data),
                               grad_sources(placeholders), frozenset(placeholders[s] for s in mutations.rebound))
    clone_relaid_inputs(gm, [p for p, layout in zip(written, mutations.layouts) if layout is not None])
    signature = with_tied_names(gm, build_signature(gm, placeholders, mutations), placeholders)
    node_meta.resolve_captured_module_stacks(gm, mod)
    node_meta.placeholders_require_grad_as_inputs(placeholders.pairs())
    node_meta.fill_missing(gm, type(mod))
    node_meta.without_torch_annotations(gm)
    node_meta.keep_graph_annotations(gm, mod)
    module_call_signatures = preserved.collect(gm, signature)
    for _, sub in all_graph_modules(gm):  # the passes above edit graphs; generate code once
        sub.recompile()
    return gm, AotSignature(
        graph_signature=signature, in_spec=inputs.in_spec,
        out_spec=mutations.out_spec, forward_arg_names=list(inputs.forward_arg_names),
        state_dict=inputs.state_dict(), constants=inputs.constants(),
        range_constraints=fakeify.range_constraints(gm), composite_decisions=dict(policy.decisions),
        grad_enabled_on_return=trace.grad_enabled_on_return, ambient=trace.ambient,
        input_layouts={str(spec.target): layout for spec, layout in zip(signature.output_specs, mutations.layouts)
                       if layout is not None},
        module_call_signatures=module_call_signatures,
        inputs_without_grad=inputs_without_grad(trace.grad_free_writes, placeholders), input_aliasing=aliasing,
        written_through_data=frozenset(placeholders[s].name for s in written_through_data),
        output_views_of_written=tuple((k, str(signature.output_specs[j].target))
                                      for k, j in enumerate(mutations.output_views) if j is not None))


def _named_inputs(inputs: Inputs, guard: StateGuard, call: ModelCall, trace: Trace) -> Placeholders:
    """Between the trace and the regions: no Python-level change left uncarried, the
    constants the trace created lifted to inputs, the placeholders named (then
    ``pipeline.trace_subgraph`` makes the user's checks on unbacked values runtime asserts)."""
    written = {id(slot) for slot in call.mutations.mutated}
    placeholders = [n for n in trace.graph_module.graph.nodes if n.op == "placeholder"]
    guard.refuse_uncarried_changes(readable_state=frozenset(
        node for node, slot in zip(placeholders, inputs.slots)
        if slot.kind is not SlotKind.USER and id(slot) not in written))
    inputs = lift_traced_constants(trace.graph_module, inputs)
    name_placeholders(trace.graph_module, inputs)
    return Placeholders.of(trace.graph_module, inputs)
