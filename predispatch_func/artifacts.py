"""The artifacts one stage of the export hands the next, in pipeline order.

Each is a frozen record; its docstring says which stage makes it and which
read it. Following one input from ``InputSlot`` through ``Mutations`` to
``AotSignature`` follows the pipeline (``aot.py``) without reading a pass.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import torch
from torch.export.graph_signature import ExportGraphSignature, InputKind, OutputKind

from . import _torch_compat as tc

if TYPE_CHECKING:
    from .trace.ambient import AmbientModes
    from .trace.composite_policy import Decision


class SlotKind(enum.Enum):
    """What a graph input is, and how torch's signature names it and a write to it."""

    PARAMETER = ("p", InputKind.PARAMETER, OutputKind.PARAMETER_MUTATION)
    BUFFER = ("b", InputKind.BUFFER, OutputKind.BUFFER_MUTATION)
    CONSTANT = ("c", InputKind.CONSTANT_TENSOR, None)
    USER = ("", InputKind.USER_INPUT, OutputKind.USER_INPUT_MUTATION)

    def __init__(self, prefix: str, input_kind: InputKind, mutation_kind: OutputKind | None):
        self.prefix = prefix  # placeholder names: p_<fqn>, b_<fqn>, c_<fqn>
        self.input_kind = input_kind
        self.mutation_kind = mutation_kind


@dataclasses.dataclass(frozen=True, eq=False)  # one slot per input: compared by identity
class InputSlot:
    """One graph input: what it is, its name (fqn, or the user input's name), its value."""

    kind: SlotKind
    target: str
    value: Any
    persistent: bool | None = None  # buffers only


@dataclasses.dataclass(frozen=True)
class Inputs:
    """Every graph input in placeholder order: lifted state (parameters, buffers,
    constants), then the flat user inputs; and how to rebuild the user's call.

    Made by ``program/lift.collect_inputs``, completed by the trace stage with the
    constants the trace created (``graph_cleanup.lift_traced_constants``); read by
    the model call, the passes after the trace (through :class:`Placeholders`) and
    the signature."""

    slots: tuple[InputSlot, ...]
    n_state: int
    in_spec: tc.pytree.TreeSpec
    forward_arg_names: tuple[str, ...]
    # other names of a lifted tensor (tied weights: ``head.weight`` of ``emb.weight``), as
    # (alias, the slot's target): the graph reads one placeholder, the program's state
    # dict (and ``module()``, ``unflatten``) has every name the model's has
    aliases: tuple[tuple[str, str], ...] = ()

    def with_constants(self, lifted: list[InputSlot]) -> Inputs:
        """These inputs with constants created while tracing, placed after the state."""
        slots = (*self.slots[:self.n_state], *lifted, *self.slots[self.n_state:])
        return dataclasses.replace(self, slots=slots, n_state=self.n_state + len(lifted))

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self._with_aliases({s.target: s.value for s in self.slots
                                   if s.kind is SlotKind.PARAMETER or (s.kind is SlotKind.BUFFER and s.persistent)})

    def constants(self) -> dict[str, torch.Tensor]:
        return self._with_aliases({s.target: s.value for s in self.slots
                                   if s.kind is SlotKind.CONSTANT or (s.kind is SlotKind.BUFFER and not s.persistent)})

    def _with_aliases(self, named: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return named | {alias: named[target] for alias, target in self.aliases if target in named}


@dataclasses.dataclass(frozen=True)
class Placeholders:
    """The graph's placeholder of each input slot, built once the graph's inputs are final.

    Made by the trace stage's ``prepare`` step for the program (``aot.py``: after the
    constants are lifted and the placeholders named; no later pass adds or drops
    one); read by the region outliner (which may require grad), the passes after
    the trace and the signature."""

    nodes: tuple[torch.fx.Node, ...]  # in input order
    inputs: Inputs
    _node_of: dict[InputSlot, torch.fx.Node]

    @classmethod
    def of(cls, gm: torch.fx.GraphModule, inputs: Inputs) -> Placeholders:
        nodes = tuple(n for n in gm.graph.nodes if n.op == "placeholder")
        assert len(nodes) == len(inputs.slots), (len(nodes), len(inputs.slots))
        return cls(nodes, inputs, dict(zip(inputs.slots, nodes)))

    def __getitem__(self, slot: InputSlot) -> torch.fx.Node:
        return self._node_of[slot]

    def pairs(self) -> zip[tuple[torch.fx.Node, InputSlot]]:
        """(placeholder, slot) in input order."""
        return zip(self.nodes, self.inputs.slots)


@dataclasses.dataclass(frozen=True)
class Mutations:
    """Which inputs the model wrote, and how the user outputs relate to them.

    Made once by the model call (``program/mutations.ModelCall``) while it is traced;
    read by the passes after the trace (``graph_cleanup``, ``writeback_guard``), the
    signature and ``aot.py`` (layouts for ``ep.module()``).

    ``mutated`` lists the written inputs in graph-output order; ``output_is_input[k]``
    is the position in ``mutated`` of the input user output ``k`` is (eager
    returned the written tensor itself), else None. ``layouts[k]``: for an input
    whose layout an in-place view op changed (``x.t_()``), its (sizes, strides,
    storage offset) before and after the call, which ``ep.module()`` restores.
    """

    mutated: tuple[InputSlot, ...]
    output_is_input: tuple[int | None, ...]
    out_spec: tc.pytree.TreeSpec
    layouts: tuple[tuple[tuple, tuple] | None, ...] = ()
    # the buffers replaced by assignment (``self.buf = ...``), not written in place: eager's ops
    # that saved the old tensor keep reading it
    rebound: frozenset[InputSlot] = frozenset()
    # per user output: the position in ``mutated`` of the written input it is a view of (shares
    # memory with, not being the input itself), else None: ep.module() returns it as that view
    output_views: tuple[int | None, ...] = ()


@dataclasses.dataclass(frozen=True)
class GradFreeWrite:
    """A value written through a ``detach()``-ed alias with grad on, which may carry a gradient
    when the program runs but carries none in this export (no input or parameter it was
    computed from requires grad): exported as a write without autograd, so the program holds
    only while ``sources`` (the placeholders it was computed from) do not require grad.

    Made by ``trace.observers.IdentityEdges``; read by ``aot.py`` (``ep.module()`` checks
    those inputs) and the body tracer (a body's operands cannot be checked: refused)."""

    sources: tuple[torch.fx.Node, ...]
    op: str
    line: str | None


@dataclasses.dataclass(frozen=True)
class Trace:
    """The flat functional graph with its region markers, and what tracing learned.

    Made by ``trace.trace_functional``; read by ``pipeline.trace_subgraph`` (its
    ``prepare`` step, the region outliner: identity edges) and ``aot.py``."""

    graph_module: torch.fx.GraphModule
    identity_edges: dict[torch.fx.Node, torch.fx.Node]  # new value -> value it keeps identity of
    grad_enabled_on_return: bool  # False: forward called set_grad_enabled(False) and never restored
    # positions of the inputs written only through `.data` (their saved reads must see the write)
    hidden_written: frozenset[int] = frozenset()
    # the caller's grad/inference/autocast modes, traced as the program's outer regions
    ambient: AmbientModes | None = None
    grad_free_writes: tuple[GradFreeWrite, ...] = ()


# what the step between the trace and the regions returns: the graph's named placeholders,
# or None for a body (whose placeholders are its operands, none known to require grad)
Named = TypeVar("Named", bound="Placeholders | None")


@dataclasses.dataclass(frozen=True)
class Subgraph(Generic[Named]):
    """What ``pipeline.trace_subgraph`` returns: the trace (its graph now outlined) and
    the placeholders its ``prepare`` step named. Read by ``aot.py`` (the program) and
    ``pipeline.TraceSettings.trace_body`` (a Function's or hook's body)."""

    trace: Trace
    placeholders: Named

    @property
    def graph_module(self) -> torch.fx.GraphModule:
        return self.trace.graph_module


@dataclasses.dataclass(frozen=True)
class AotSignature:
    """What a caller needs to turn the graph into a program and call it.

    Made by ``aot.aot_export_module``; read by ``export.to_exported_program``."""

    graph_signature: ExportGraphSignature
    in_spec: tc.pytree.TreeSpec
    out_spec: tc.pytree.TreeSpec
    forward_arg_names: list[str]
    state_dict: dict[str, torch.Tensor]
    constants: dict[str, torch.Tensor]
    range_constraints: dict[Any, Any]
    composite_decisions: dict[str, tuple[Decision, str]]
    grad_enabled_on_return: bool = True
    ambient: AmbientModes | None = None  # the caller's modes, the program's outer regions
    # input or buffer name -> its (sizes, strides, offset) before and after the call, for
    # each one an in-place view op relaid (``x.t_()``); ep.module() restores the new layout
    input_layouts: dict[str, tuple[tuple, tuple]] = dataclasses.field(default_factory=dict)
    # preserve_module_call_signature: fqn -> the call's signature (module_signatures.py)
    module_call_signatures: dict[str, Any] = dataclasses.field(default_factory=dict)
    # user input (placeholder name) or parameter/buffer (fqn) -> the user's line of a write through
    # a detached alias that is right only while it does not require grad (GradFreeWrite)
    inputs_without_grad: dict[str, str] = dataclasses.field(default_factory=dict)
    # user inputs exported sharing memory and written (program/aliased_inputs.py): per group, each
    # member's placeholder name, (sizes, strides, offset from the group's lowest) and the position of
    # the first member that is the same tensor; ep.module() checks them
    input_aliasing: tuple[tuple[tuple[str, tuple, int], ...], ...] = ()
    # placeholder names of the inputs written only through ``.data`` (Trace.hidden_written): eager's
    # backward of an op that saved one reads the written value; export_joint's backward must too
    written_through_data: frozenset[str] = frozenset()
    # (user output position, written input: placeholder name or state fqn) for each user output
    # that is a view of an input the program writes (Mutations.output_views)
    output_views_of_written: tuple[tuple[int, str], ...] = ()


@dataclasses.dataclass(frozen=True)
class ProgramFacts:
    """What a program of ours knows about itself beyond its graph and signature.

    Made by ``export.to_exported_program`` from the :class:`AotSignature`, kept on
    the graph module (one metadata entry, :func:`program_facts` reads it; a program
    loaded from disk or made by torch has the defaults); read by ``ep.module()``
    (layouts, grad mode on return), ``verify`` (the caller's modes), the renderer
    and the ops report (composite decisions)."""

    composite_decisions: dict[str, tuple[Decision, str]] = dataclasses.field(default_factory=dict)
    # False when forward leaves grad mode off (set_grad_enabled(False) called and never
    # restored); the IR cannot hold that side effect, module() replays it
    grad_enabled_on_return: bool = True
    # the caller's grad/inference/autocast modes at export (the program's outer regions):
    # verify runs the eager model under them
    ambient: AmbientModes | None = None
    # input or buffer name -> (layout before, layout after) of each one an in-place view
    # op relaid; module() restores them
    input_layouts: dict[str, tuple[tuple, tuple]] = dataclasses.field(default_factory=dict)
    # inputs the program must not be called with requiring grad (AotSignature.inputs_without_grad):
    # module() checks them, verify replays them as exported
    inputs_without_grad: dict[str, str] = dataclasses.field(default_factory=dict)
    # AotSignature.input_aliasing: module() checks the caller's inputs share memory so
    input_aliasing: tuple[tuple[tuple[str, tuple, int], ...], ...] = ()
    # AotSignature.written_through_data: read by export_joint (its saved reads of them)
    written_through_data: frozenset[str] = frozenset()
    # AotSignature.output_views_of_written: module() returns those outputs as views of the input
    output_views_of_written: tuple[tuple[int, str], ...] = ()


_PROGRAM_FACTS = "pf_program_facts"  # the graph module's metadata entry


def program_facts(gm: torch.fx.GraphModule) -> ProgramFacts:
    """The facts ``gm`` (a program's graph module) carries; the defaults if none."""
    return gm.meta.get(_PROGRAM_FACTS) or ProgramFacts()


def with_program_facts(gm: torch.fx.GraphModule, facts: ProgramFacts) -> None:
    gm.meta[_PROGRAM_FACTS] = facts


__all__ = ["AotSignature", "GradFreeWrite", "InputSlot", "Inputs", "Mutations", "Placeholders", "ProgramFacts", "SlotKind",
           "Subgraph", "Trace", "program_facts", "with_program_facts"]
