"""``aot_export_module``: the layer under :func:`predispatch_func.export`.

It owns lifting (parameters, buffers, tensor constants become placeholders),
functionalization (one trace through the mode stack) and the mutation
metadata (which inputs the model wrote, and their final values as outputs).

Pipeline: flatten -> lift -> fake-ify -> trace (modes/) -> lift traced
constants, name placeholders (graph_cleanup.py) -> outline regions (hop/) ->
dead code -> signature (signature.py) -> write-back guards.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch.export.graph_signature import ExportGraphSignature

from . import _torch_compat as tc
from .errors import UnsupportedError
from .fakeify import Fakeifier
from .graphs import all_graph_modules
from .hop import outline_regions
from .lift import lift_state, user_input_names
from .modes import CompositePolicy, trace_functional
from .opsets.lowering import Lowering
from .schema_audit import shipped_decision
from .graph_cleanup import (copy_outputs_reading_written_inputs, eliminate_dead_code,
                            lift_traced_constants, name_placeholders)
from .state_guard import StateGuard
from .signature import InputSlot, build_signature, grad_sources, written_placeholders
from .writeback_guard import guard_saved_mutated_inputs


@dataclasses.dataclass
class AotSignature:
    """What a caller needs to turn the graph into a program and call it."""

    graph_signature: ExportGraphSignature
    in_spec: tc.pytree.TreeSpec
    out_spec: tc.pytree.TreeSpec
    forward_arg_names: list[str]
    state_dict: dict[str, torch.Tensor]
    constants: dict[str, torch.Tensor]
    range_constraints: dict[Any, Any]
    composite_decisions: dict[str, tuple[str, str]]
    grad_enabled_on_return: bool = True


def aot_export_module(mod: torch.nn.Module, args: tuple, *, pre_dispatch: bool = True,
                      decompositions: dict | None = None, kwargs: dict | None = None,
                      dynamic_shapes: Any = None,
                      composite_overrides: dict[str, str] | None = None,
                      python_state: str = "error",
                      target: Any = None,
                      ) -> tuple[torch.fx.GraphModule, AotSignature]:
    """Trace ``mod`` into a functional graph over lifted state and flat user inputs.

    ``python_state="warn"`` turns the refusal of Python-level changes the program
    cannot carry (see :mod:`predispatch_func.state_guard`) into a warning.
    ``target`` (an :class:`~predispatch_func.opsets.OpSet`) lowers every op
    outside it while tracing (``opsets/lowering.py``), or refuses naming the
    ops it cannot lower.
    """
    kwargs = dict(kwargs or {})
    args = tuple(args)
    state = lift_state(mod)
    flat_user, in_spec = tc.pytree.tree_flatten((args, kwargs))
    user_names, arg_names = user_input_names(mod, args, kwargs)
    slots = [InputSlot(kind, fqn, t, (fqn not in state.non_persistent) if kind == "buffer" else None)
             for kind, fqn, t in state.items()]
    slots += [InputSlot("user", n, v) for n, v in zip(user_names, flat_user)]

    fakeify = Fakeifier(dynamic_shapes, mod, args, kwargs)
    fake_inputs = [fakeify.state(s.value) if s.kind != "user" else fakeify.user(i, s.value)
                   for i, s in enumerate(slots)]
    n_state = len(slots) - len(flat_user)
    aliased = _inputs_sharing_memory(fake_inputs)
    lowering = Lowering(target) if target is not None else None
    policy = CompositePolicy(audit_lookup=shipped_decision, overrides=composite_overrides,
                             lowering=lowering)
    if lowering is not None:
        decompositions = {**lowering.proxy_table(), **(decompositions or {})}
    meta: dict[str, Any] = {}

    def body(inputs: list[Any], mode) -> list[Any]:
        by_fqn = {s.target: t for s, t in zip(slots[:n_state], inputs[:n_state])}
        call_args, call_kwargs = tc.pytree.tree_unflatten(inputs[n_state:], in_spec)
        with tc.reparametrize(mod, by_fqn):
            out = mod(*call_args, **call_kwargs)
            reassigned = _reassigned_buffers(mod, slots[:n_state], inputs)
        flat_out, meta["out_spec"] = tc.pytree.tree_flatten(out)
        final = [reassigned.get(i, t) for i, t in enumerate(inputs)]
        mutated = [i for i, t in enumerate(inputs) if i in reassigned
                   or (isinstance(t, tc.FunctionalTensor) and tc.has_data_mutation(t))]
        for i in mutated:
            if slots[i].kind == "constant":
                raise UnsupportedError(
                    f"the model writes to tensor attribute {slots[i].target!r}, which is neither a "
                    "parameter nor a buffer; register it with register_buffer so the write can be "
                    "carried in the signature")
            if sharing := aliased.get(i):
                raise UnsupportedError(
                    f"the model writes to input {slots[i].target!r}, which shares memory with "
                    f"{', '.join(repr(slots[j].target) for j in sharing)}; a functional program "
                    "cannot carry a write through inputs that alias each other: pass distinct "
                    "tensors (e.g. .clone() one of them)")
        meta["mutated"] = [slots[i] for i in mutated]
        meta["output_is_input"] = [next((j for j, i in enumerate(mutated) if o is inputs[i]), None)
                                   for o in flat_out]
        return [final[i] for i in mutated] + flat_out

    with StateGuard(mod, (args, kwargs), python_state=python_state) as guard:
        trace = trace_functional(body, fake_inputs, policy=policy,
                                 pre_dispatch=pre_dispatch, decompositions=decompositions)
        guard.refuse_uncarried_changes()
    gm = trace.graph_module
    slots = lift_traced_constants(gm, slots, n_state)
    name_placeholders(gm, slots)
    gm = outline_regions(gm, trace.identity_edges)
    eliminate_dead_code(gm)
    if lowering is not None:
        lowering.check(gm)
        lowering.warn_decomposed_members(policy.decisions)
    signature = build_signature(gm, slots, meta["mutated"])
    if copy_outputs_reading_written_inputs(gm, signature, meta["output_is_input"]):
        signature = build_signature(gm, slots, meta["mutated"])
    guard_saved_mutated_inputs(gm, written_placeholders(gm, signature), grad_sources(gm, signature))
    for _, sub in all_graph_modules(gm):  # the passes above edit graphs; generate code once
        sub.recompile()
    state_dict = {**state.parameters,
                  **{k: v for k, v in state.buffers.items() if k not in state.non_persistent}}
    constants = {**{k: v for k, v in state.buffers.items() if k in state.non_persistent},
                 **{s.target: s.value for s in slots if s.kind == "constant"}}
    return gm, AotSignature(
        graph_signature=signature, in_spec=in_spec, out_spec=meta["out_spec"],
        forward_arg_names=arg_names, state_dict=state_dict, constants=constants,
        range_constraints=fakeify.range_constraints(gm),
        composite_decisions=dict(policy.decisions),
        grad_enabled_on_return=trace.grad_enabled_on_return)


def _reassigned_buffers(mod: torch.nn.Module, state_slots: list[InputSlot],
                        inputs: list[Any]) -> dict[int, torch.Tensor]:
    """Buffers the forward replaced by assignment (``self.buf = self.buf + x``).

    Eager keeps the new tensor on the module, so it is a buffer mutation whose
    final value is the assigned tensor (of any shape). Replacing a parameter, or
    a buffer by something of another dtype, cannot be written back: refused.
    """
    found = {}
    for i, slot in enumerate(state_slots):
        if slot.kind not in ("parameter", "buffer"):
            continue
        prefix, _, name = slot.target.rpartition(".")
        owner = mod.get_submodule(prefix)
        current = (owner._parameters if slot.kind == "parameter" else owner._buffers).get(name)
        if current is inputs[i]:
            continue
        # another shape is carried: ep.module() resizes the buffer before writing it back
        same_kind = (slot.kind == "buffer" and isinstance(current, torch.Tensor)
                     and current.dtype == inputs[i].dtype and current.device == inputs[i].device)
        if not same_kind:
            raise UnsupportedError(
                f"the model replaces {slot.kind} {slot.target!r} by assignment"
                + ("" if slot.kind == "parameter" else " with a value of another dtype, device or type")
                + "; only buffers replaced by a tensor of the same dtype can be carried "
                "as a mutation (or write in place: self.buf.copy_(new))")
        found[i] = current
    return found


def _inputs_sharing_memory(inputs: list[Any]) -> dict[int, list[int]]:
    """For each input index, the other inputs whose memory overlaps it (fakes keep
    storages). Disjoint pieces of one storage (``base[:4]``, ``base[4:]``) are
    independent: a write to one is invisible to the other, as in the program."""
    by_storage: dict[Any, list[int]] = {}
    for i, t in enumerate(inputs):
        if isinstance(t, torch.Tensor) and t.layout == torch.strided:
            by_storage.setdefault(tc.StorageWeakRef(t.untyped_storage()), []).append(i)
    sharing: dict[int, list[int]] = {}
    for group in by_storage.values():
        for i in group:
            others = [j for j in group if j != i and _byte_spans_overlap(inputs[i], inputs[j])]
            if others:
                sharing[i] = others
    return sharing


def _byte_span(t: torch.Tensor) -> tuple[int, int]:
    start = t.storage_offset() * t.element_size()
    extent = sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride())) if t.numel() else -1
    return start, start + (extent + 1) * t.element_size() - 1


def _byte_spans_overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    (lo, hi), (lo2, hi2) = _byte_span(a), _byte_span(b)
    return lo <= hi2 and lo2 <= hi
