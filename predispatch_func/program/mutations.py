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
from ..mode_capabilities import SharedMemory, TracingMode
from ..passes import node_meta
from ..trace import environment
from ..trace.environment import CallRecorders
from .aliased_inputs import AliasGroup, SyntheticBases, alias_groups, refuse_uncarriable
from .output_check import check_output_leaves


class AliasedInputsWritten(UnsupportedError):
    """The model wrote inputs that share memory, traced apart: the export traces again with
    those groups over a synthetic base (aot.py, program/aliased_inputs.py). Only groups a base
    can carry are raised so; any other is refused."""

    def __init__(self, groups: tuple[AliasGroup, ...]):
        super().__init__("internal: inputs sharing memory were written; traced again over a synthetic base",
                         kind=Refusal.WRITE_TO_ALIASED_INPUTS)
        self.groups = groups


class ModelCall:
    """``mod(*args, **kwargs)`` over traced inputs; sets :attr:`mutations` once."""

    __slots__ = ("_mod", "_inputs", "_fakes", "_groups", "_bases", "_mutations", "_recorders")

    def __init__(self, mod: torch.nn.Module, inputs: Inputs, fake_inputs: list[Any], recorders: CallRecorders,
                 over_bases: tuple[AliasGroup, ...] = ()):
        self._mod = mod
        self._recorders = recorders  # what later stages record around the call (node metadata, ...)
        self._inputs = inputs
        # inputs sharing memory; those in ``over_bases`` (written in an earlier trace) are traced
        # over a synthetic base
        self._fakes = fake_inputs
        self._groups = alias_groups(fake_inputs)
        assert all(any(g.members == h.members for h in self._groups) for g in over_bases), "groups differ"
        self._bases = SyntheticBases(over_bases)
        self._mutations: Mutations | None = None

    @property
    def alias_groups(self) -> tuple[AliasGroup, ...]:
        """The groups of inputs traced over a synthetic base (``ep.module()`` checks them)."""
        return self._bases.groups

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
        given = self._bases.regenerate(traced)
        call_args, call_kwargs = tc.pytree.tree_unflatten(given[n_state:], self._inputs.in_spec)
        with environment.around_the_model_call(self._mod, by_fqn, self._recorders):
            out = node_meta.call_carrying_annotations(self._mod, call_args, call_kwargs)
            reassigned = _reassigned_state(self._mod, slots[:n_state], traced)
        check_output_leaves(self._mod, out)
        flat_out, out_spec = tc.pytree.tree_flatten(out)
        through_bases, relaid_members = self._bases.written()
        final = [through_bases.get(i, reassigned.get(i, t)) for i, t in enumerate(traced)]
        relaid = self._relaid(traced, mode) | relaid_members
        mutated = [i for i, t in enumerate(traced) if i in reassigned or i in relaid or i in through_bases
                   or (isinstance(t, tc.FunctionalTensor) and tc.has_data_mutation(t))]
        for i in mutated:
            self._refuse_write(i)
        self._refuse_aliased_writes([i for i in mutated if i not in through_bases and not self._bases.covers(i)])
        assert self._mutations is None, "one trace per call"
        # a buffer replaced by assignment: eager's returned tensor is the old one, not the new value
        written_in_place = [(j, i) for j, i in enumerate(mutated) if i not in reassigned]
        is_input = tuple(next((j for j, i in written_in_place if o is given[i]), None) for o in flat_out)
        self._mutations = Mutations(
            tuple(slots[i] for i in mutated), is_input, out_spec, tuple(relaid.get(i) for i in mutated),
            frozenset(slots[i] for i in reassigned),
            tuple(None if same is not None else _view_of(o, [(j, given[i]) for j, i in written_in_place],
                                                         mode.storage_aliases)
                  for o, same in zip(flat_out, is_input)))
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

    def _refuse_aliased_writes(self, written: list[int]) -> None:
        """Inputs sharing memory, written while traced apart: a group a synthetic base can carry
        is traced again over one (:class:`AliasedInputsWritten`), any other is refused."""
        groups = tuple(g for g in self._groups if any(i in g.members for i in written))
        if not groups:
            return
        for group in groups:
            refuse_uncarriable(group, self._inputs.slots, self._fakes)
        raise AliasedInputsWritten(groups)


def _view_of(output: Any, written: list[tuple[int, Any]], aliases: SharedMemory) -> int | None:
    """The position of the written input ``output`` shares memory with in eager, else None:
    functional tensors of one base share one storage (a ``copy_`` into an input joins none),
    and ``x.data = v`` makes ``v`` ``x``'s memory (``StorageAliases.sharing``)."""
    if not isinstance(output, tc.FunctionalTensor):
        return None
    memory = tc.storage_key(output)
    return next((j for j, t in written if isinstance(t, tc.FunctionalTensor) and memory in aliases.sharing(t)), None)


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

