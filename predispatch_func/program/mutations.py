"""The traced call of the model, and what it learned about mutations.

:class:`ModelCall` is the function ``trace.trace_functional`` traces: it runs
the user's ``forward`` over the functional wrappers of the graph inputs and
returns the graph outputs, the final values of the inputs it wrote first, then
the user outputs. What it found is one frozen ``artifacts.Mutations``, written once.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import _torch_compat as tc
from ..artifacts import Inputs, InputSlot, Mutations, SlotKind
from ..errors import Refusal, UnsupportedError
from ..mode_capabilities import TracingMode
from ..passes import node_meta
from ..trace import environment
from ..trace.environment import CallRecorders
from .output_check import check_output_leaves


class ModelCall:
    """``mod(*args, **kwargs)`` over traced inputs; sets :attr:`mutations` once."""

    __slots__ = ("_mod", "_inputs", "_aliased", "_mutations", "_recorders")

    def __init__(self, mod: torch.nn.Module, inputs: Inputs, fake_inputs: list[Any], recorders: CallRecorders):
        self._mod = mod
        self._recorders = recorders  # what later stages record around the call (node metadata, ...)
        self._inputs = inputs
        self._aliased = _inputs_sharing_memory(fake_inputs)
        self._mutations: Mutations | None = None

    @property
    def mutations(self) -> Mutations:
        assert self._mutations is not None, "the model has not been traced"
        return self._mutations

    def __call__(self, traced: list[Any], mode: TracingMode) -> list[Any]:
        slots, n_state = self._inputs.slots, self._inputs.n_state
        by_fqn = {s.target: t for s, t in zip(slots[:n_state], traced[:n_state])}
        # a tensor constant under a second name reads the same input (torch ties parameters and buffers itself)
        constants = {s.target for s in slots[:n_state] if s.kind is SlotKind.CONSTANT}
        by_fqn |= {alias: by_fqn[target] for alias, target in self._inputs.aliases if target in constants}
        call_args, call_kwargs = tc.pytree.tree_unflatten(traced[n_state:], self._inputs.in_spec)
        with environment.around_the_model_call(self._mod, by_fqn, self._recorders):
            out = node_meta.call_carrying_annotations(self._mod, call_args, call_kwargs)
            reassigned = _reassigned_state(self._mod, slots[:n_state], traced)
        check_output_leaves(self._mod, out)
        flat_out, out_spec = tc.pytree.tree_flatten(out)
        final = [reassigned.get(i, t) for i, t in enumerate(traced)]
        relaid = self._relaid(traced, mode)
        mutated = [i for i, t in enumerate(traced) if i in reassigned or i in relaid
                   or (isinstance(t, tc.FunctionalTensor) and tc.has_data_mutation(t))]
        for i in mutated:
            self._refuse_write(i)
        assert self._mutations is None, "one trace per call"
        self._mutations = Mutations(
            # a buffer replaced by assignment: eager's returned tensor is the old one, not the new value
            tuple(slots[i] for i in mutated), tuple(next((j for j, i in enumerate(mutated)
                                                          if o is traced[i] and i not in reassigned), None)
                                  for o in flat_out), out_spec, tuple(relaid.get(i) for i in mutated),
            frozenset(slots[i] for i in reassigned))
        return [final[i] for i in mutated] + flat_out

    def _relaid(self, traced: list[Any], mode: TracingMode) -> dict[int, tuple[tuple, tuple]]:
        """Inputs and buffers whose layout an in-place view op changed: index -> (before, after)."""
        changed = mode.metadata_writes.changed()
        found = {i: changed[id(t)] for i, t in enumerate(traced) if id(t) in changed}
        for i in found:
            if self._inputs.slots[i].kind not in (SlotKind.USER, SlotKind.BUFFER):
                raise UnsupportedError(
                    f"in-place metadata change (shape/stride) of {self._inputs.slots[i].target!r}, which "
                    "is neither a user input nor a buffer: its new layout cannot be written back; use "
                    "the out-of-place op instead", kind=Refusal.INPUT_METADATA_MUTATION)
        return found

    def _refuse_write(self, i: int) -> None:
        slots = self._inputs.slots
        if slots[i].kind is SlotKind.CONSTANT:
            raise UnsupportedError(
                f"Constant {slots[i].target} is mutated in the forward method: the model writes to tensor "
                f"attribute {slots[i].target!r}, which is neither a parameter nor a buffer; register it with "
                "register_buffer so the write can be carried in the signature",
                kind=Refusal.WRITE_TO_TENSOR_ATTRIBUTE)
        if sharing := self._aliased.get(i):
            raise UnsupportedError(
                f"the model writes to input {slots[i].target!r}, which shares memory with "
                f"{', '.join(repr(slots[j].target) for j in sharing)}; a functional program "
                "cannot carry a write through inputs that alias each other: pass distinct "
                "tensors (e.g. .clone() one of them)", kind=Refusal.WRITE_TO_ALIASED_INPUTS)


def _reassigned_state(mod: torch.nn.Module, state_slots: tuple[InputSlot, ...],
                      traced: list[Any]) -> dict[int, torch.Tensor]:
    """Buffers the forward replaced by assignment (``self.buf = self.buf + x``).

    Eager keeps the new tensor on the module, so it is a buffer mutation whose
    final value is the assigned tensor. Replacing a parameter, or a buffer by
    something of another shape or dtype, cannot be written back: refused.
    """
    found = {}
    for i, slot in enumerate(state_slots):
        if slot.kind not in (SlotKind.PARAMETER, SlotKind.BUFFER):
            continue
        prefix, _, name = slot.target.rpartition(".")
        owner = mod.get_submodule(prefix)
        is_param = slot.kind is SlotKind.PARAMETER
        current = (tc.module_parameters(owner) if is_param else tc.module_buffers(owner)).get(name)
        if current is traced[i]:
            continue
        # another shape is carried: ep.module() resizes the buffer before writing it back
        if is_param or not (isinstance(current, torch.Tensor) and current.dtype == traced[i].dtype
                            and current.device == traced[i].device):
            what = "parameter" if is_param else "buffer"
            raise UnsupportedError(
                f"the model replaces {what} {slot.target!r} by assignment"
                + ("" if is_param else " with a value of another dtype, device or type")
                + "; only buffers replaced by a tensor of the same dtype can be carried "
                "as a mutation (or write in place: self.buf.copy_(new))", kind=Refusal.STATE_REPLACED)
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


def _byte_span(t: torch.Tensor) -> tuple[Any, Any]:
    start = t.storage_offset() * t.element_size()
    extent = sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride())) if t.numel() else -1
    return start, start + (extent + 1) * t.element_size() - 1


def _byte_spans_overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    (lo, hi), (lo2, hi2) = _byte_span(a), _byte_span(b)
    return lo <= hi2 and lo2 <= hi
