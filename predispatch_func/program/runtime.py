"""What ``ep.module()`` runs: the program class whose module writes mutations back as
eager does (grad-requiring leaves under ``no_grad``, relaid-out inputs restored, tied
aliases kept one object), its assembly from the traced artifacts, and ``load``.
torch keeps the same apart from export (``torch/export/_unlift.py``)."""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Collection
from typing import Any

import torch
from torch.export.exported_program import ExportedProgram, ModuleCallEntry, ModuleCallSignature
from torch.export.graph_signature import InputKind, OutputKind

from .. import _torch_compat as tc
from ..artifacts import AotSignature, ProgramFacts, program_facts, with_program_facts
from ..errors import Refusal, UnsupportedError
from ..graphs import calls_view_op
from ..passes.graph_cleanup import impure
from ..regions.ops import region_body_and_operands
from .returned_views import adopt_memory, view_of_destination

Layout = tuple  # (sizes, strides, storage offset)


class FunctionalExportedProgram(ExportedProgram):
    """An ExportedProgram whose ``module()`` writes mutations back as eager would.

    torch's unlifted module writes each mutated input back with a plain
    ``copy_`` after the forward. When the destination is a leaf that requires
    grad (a parameter clamped under ``no_grad``, an input updated under
    ``no_grad``) that ``copy_`` raises, while eager allowed the in-place
    update. Such write-backs run under ``no_grad`` here; all others are
    torch's own. A forward that leaves grad mode off leaves it off here too.
    """

    def module(self, *args: Any, **kwargs: Any) -> torch.nn.Module:  # type: ignore[override]
        with tc.calls_kept_by_dead_code_elimination(_impure_region_call):
            mod = super().module(*args, **kwargs)
        facts = program_facts(self.graph_module)
        layouts = facts.input_layouts
        # Our graphs hold no copy_ (contract point 2): every copy_ here is a write-back.
        for node in mod.graph.nodes:
            if node.op == "call_function" and node.target is torch.ops.aten.copy_.default:
                node.target = write_back
                layout = layouts.get(node.args[0].target)  # placeholder name or buffer fqn
                if layout is not None:
                    node.args = (*node.args[:2], *layout)
                    with mod.graph.inserting_before(_first_call(mod.graph)):
                        mod.graph.call_function(expect_layout, (node.args[0], *layout))
        _return_views_of_written_inputs(mod.graph, facts.output_views_of_written)
        for name, line in facts.inputs_without_grad.items():
            read = next((n for n in mod.graph.nodes if (n.op == "placeholder" and n.name == name)
                         or (n.op == "get_attr" and n.target == name)), None)
            if read is None:  # never silently unchecked
                raise RuntimeError(f"internal error: the program checks that {name} does not require grad, "
                                   "and its module reads no input or attribute of that name")
            with mod.graph.inserting_before(_first_call(mod.graph)):
                mod.graph.call_function(expect_no_grad, (read, name, line))
        for name, shape in state_reshaped(self, relaid=set(layouts)).items():
            read = next((n for n in mod.graph.nodes if n.op == "get_attr" and n.target == name), None)
            if read is None:  # never silently unchecked
                raise RuntimeError(f"internal error: the program checks the shape of {name}, and its module "
                                   "reads no attribute of that name")
            with mod.graph.inserting_before(_first_call(mod.graph)):
                mod.graph.call_function(expect_state_shape, (read, name, shape))
        for group in facts.input_aliasing:
            names = tuple(name for name, _, _ in group)
            reads = tuple(next(n for n in mod.graph.nodes if n.op == "placeholder" and n.name == name) for name in names)
            with mod.graph.inserting_before(_first_call(mod.graph)):
                mod.graph.call_function(expect_aliasing, (reads, names, tuple(g for _, g, _ in group),
                                                          tuple(same for _, _, same in group)))
        if not facts.grad_enabled_on_return:
            with mod.graph.inserting_before(mod.graph.output_node()):
                mod.graph.call_function(tc.SET_GRAD_ENABLED, (False,))
        _place_in_the_root_module(mod.graph)
        mod.recompile()
        tie_aliases(mod, self)
        return mod


def _return_views_of_written_inputs(graph: torch.fx.Graph, views: tuple[tuple[int, str], ...]) -> None:
    """Each user output that eager returned as a view of an input the program writes
    (``ProgramFacts.output_views_of_written``) becomes the same view of that input, taken
    after its write-back (program/returned_views.py)."""
    if not views:
        return
    write_of = {}
    for node in graph.nodes:
        if node.op == "call_function" and node.target is write_back:
            write_of[node.args[0].target] = node  # placeholder name or state fqn
    output = graph.output_node()
    outputs = list(output.args[0])  # type: ignore[arg-type]  # torch's unlift: the flat user outputs
    for index, name in views:
        write = write_of.get(name)
        if write is None or not isinstance(outputs[index], torch.fx.Node):
            raise RuntimeError(f"internal error: user output {index} views the written input {name}, and the "
                               "module writes no input of that name back")
        chain = _view_chain(outputs[index], write.args[1])
        with graph.inserting_before(output):
            if chain is None:  # where the output lies in the memory is read at run time, in the
                # written value (a region's or HOP's result) or in the value `.data =` gave the input
                root = _view_root(outputs[index])
                value = root if root.op == "call_function" and root.target is not operator.getitem else write.args[1]
                outputs[index] = graph.call_function(view_of_destination, (outputs[index], value, write))
                continue
            view = graph.call_function(torch.ops.aten.detach.default, (write,))
            for node in chain:  # the graph's own view ops, from the written value out: any layout
                view = graph.call_function(node.target,  # type: ignore[arg-type]  # calls_view_op: an OpOverload
                                           (view, *node.args[1:]), dict(node.kwargs))
            outputs[index] = graph.call_function(adopt_memory, (outputs[index], view))
    output.args = (tuple(outputs), *output.args[1:])


def _view_root(node: torch.fx.Node) -> torch.fx.Node:
    while calls_view_op(node):
        node = node.args[0]  # type: ignore[assignment]  # calls_view_op checked it is a Node
    return node


def _view_chain(node: torch.fx.Node, value: Any) -> list[torch.fx.Node] | None:
    """The view ops taking ``value`` to ``node``, in order; None where ``node`` is not so made."""
    chain = []
    while node is not value and calls_view_op(node):
        chain.append(node)
        node = node.args[0]  # type: ignore[assignment]  # calls_view_op checked it is a Node
    return chain[::-1] if node is value and chain else None


def _place_in_the_root_module(graph: torch.fx.Graph) -> None:
    """Give the calls ``module()`` adds (write-backs, input checks) the root module's
    ``nn_module_stack``: they run at the program's boundary, and consumers that outline
    submodules from that metadata (``torch.export.unflatten``, ``torch.distributed.pipelining``'s
    split, which raises "Unable to find nn_module_stack") need one on every call."""
    root = next((dict([next(iter(n.meta["nn_module_stack"].items()))]) for n in graph.nodes
                 if n.op == "call_function" and n.meta.get("nn_module_stack")), None)
    if root is None:
        return
    for node in graph.nodes:
        if node.op == "call_function" and not node.meta.get("nn_module_stack"):
            node.meta["nn_module_stack"] = dict(root)


def _impure_region_call(node: torch.fx.Node) -> bool:
    """A region (or torch HOP) call whose body draws random numbers or checks values: kept
    by ``module()``'s dead-code elimination even when its results are unused, as eager runs it."""
    owner = node.graph.owning_module
    return owner is not None and region_body_and_operands(node) is not None and impure(node, owner)


def tie_aliases(mod: torch.nn.Module, ep: ExportedProgram) -> None:
    """Register each other name of a lifted parameter or buffer (a state-dict entry that is
    the same tensor as one the graph reads: tied weights) on ``mod``, as the model had it,
    so ``mod.state_dict()`` has the model's keys and ``load_state_dict`` takes its weights."""
    spec_targets = [s.target for s in ep.graph_signature.input_specs
                    if s.kind in (InputKind.PARAMETER, InputKind.BUFFER) and s.target is not None]
    named = {**ep.constants, **ep.state_dict}
    target_of = {_tensor_key(named[t]): t for t in spec_targets if t in named}
    persistent = set(ep.state_dict)
    for alias, value in named.items():
        target = target_of.get(_tensor_key(value))
        if target is None or alias == target or alias in spec_targets:
            continue
        *path, leaf = alias.split(".")
        owner = mod
        for part in path:
            if not hasattr(owner, part):
                owner.add_module(part, torch.nn.Module())
            owner = getattr(owner, part)
        tensor = mod.get_parameter(target) if isinstance(value, torch.nn.Parameter) else mod.get_buffer(target)
        if leaf in tc.module_parameters(owner) or leaf in tc.module_buffers(owner):  # torch's unlift did
            continue
        if hasattr(owner, leaf):  # torch's unlift set a non-persistent alias as a plain attribute
            delattr(owner, leaf)
        if isinstance(tensor, torch.nn.Parameter):
            owner.register_parameter(leaf, tensor)
        else:
            owner.register_buffer(leaf, tensor, persistent=alias in persistent)


def _tensor_key(t: torch.Tensor) -> Any:
    """The same key for one tensor and for its twin after ``torch.export.save``/``load``
    (a new object over the same storage, which the serializer keeps shared); by object
    where there is no storage to compare (meta, fake, a wrapper tensor subclass)."""
    if _storage_pointer(t) == 0:
        return id(t)
    return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)


def _storage_pointer(t: torch.Tensor) -> int:
    """Where ``t``'s storage starts; 0 where it has none to read (meta, fake, a wrapper subclass,
    whose storage torch refuses to hand out)."""
    if t.device.type == "meta" or isinstance(t, tc.FakeTensor):  # a fake's pointer: a warning, then 0
        return 0
    try:
        return t.untyped_storage().data_ptr()
    except RuntimeError:
        return 0


def write_back(destination: torch.Tensor, value: torch.Tensor, before: Layout | None = None,
               after: Layout | None = None) -> torch.Tensor:
    """``destination.copy_(value)``, under no_grad when it is a leaf requiring grad;
    a destination of another shape (a buffer the model resized) is resized first.
    With ``before``/``after`` (an in-place view op such as ``x.t_()`` relaid the input:
    ``ProgramFacts.input_layouts``), the destination, checked to have the exported layout,
    is given eager's new one first.

    Registered as a side effect, so fx's dead-code elimination (``recompile``
    passes, PT2E's ``prepare_pt2e``/``convert_pt2e``) keeps it although its
    result is unused, as it keeps torch's own ``aten.copy_`` write-backs.
    """
    if before is not None and after is not None:
        relayout(destination, before, after)
    elif destination.shape != value.shape:  # a buffer the model resized in place (QAT observers)
        with torch.no_grad():
            destination.resize_(value.shape)
    if destination.is_leaf and not destination.is_inference():  # inference tensors keep no version
        version = tc.version_of(destination)
        with torch.no_grad() if destination.requires_grad else contextlib.nullcontext():
            out = destination.copy_(value)
        if type(destination) in (torch.Tensor, torch.nn.Parameter):  # not while re-traced
            # eager wrote it with grad off (no_grad, .data): an op of the forward that saved
            # the tensor (``x * buf``) still runs its backward, as in eager after a .data write
            tc.set_version(destination, version)
        return out
    return destination.copy_(value)


tc.keep_calls_in_torch_dead_code_elimination(write_back)


def _layout_of(t: torch.Tensor) -> Layout:
    return tuple(t.shape), tuple(t.stride()), t.storage_offset()


def _first_call(graph: torch.fx.Graph) -> torch.fx.Node:
    return next(n for n in graph.nodes if n.op not in ("placeholder", "get_attr"))


def expect_layout(destination: torch.Tensor, before: Layout, after: Layout) -> None:
    """Refuse to run a program that relays ``destination`` (``x.t_()``) on a layout
    other than the exported one: its values and new layout were computed for that one
    (a second call on the same tensor or buffer meets the layout the first one left)."""
    if _layout_of(destination) != (tuple(before[0]), tuple(before[1]), before[2]):
        raise RuntimeError(
            f"this program changes the layout of an input or buffer in place (sizes, strides, offset "
            f"{before} -> {after}), exported for {before}; it is called with {_layout_of(destination)} "
            "(a second call on the same tensor?): export again for that layout")


tc.keep_calls_in_torch_dead_code_elimination(expect_layout)


def state_reshaped(ep: ExportedProgram, relaid: Collection[str] = ()) -> dict[str, tuple[int, ...]]:
    """Buffers and parameters the program writes with another shape (``self.buf =
    torch.cat([self.buf, x])``) -> their exported shape: the next call meets the new shape,
    which the program, traced for the old one, may compute wrongly with (a slice's bounds,
    a reduction's size are baked), so each call checks it (:func:`expect_state_shape`). A buffer
    the model relays in place (``relaid``: ``x.t_()``) is checked by :func:`expect_layout`."""
    sig = ep.graph_signature
    read = {n.name: n.meta.get("val") for n in ep.graph.nodes if n.op == "placeholder"}
    placeholder_of = {s.target: s.arg.name for s in sig.input_specs
                      if s.kind in (InputKind.PARAMETER, InputKind.BUFFER) and hasattr(s.arg, "name")}
    outputs = ep.graph.output_node().args[0]
    found: dict[str, tuple[int, ...]] = {}
    for spec, node in zip(sig.output_specs, outputs):
        if spec.kind not in (OutputKind.BUFFER_MUTATION, OutputKind.PARAMETER_MUTATION) or spec.target in relaid:
            continue
        before = read.get(placeholder_of.get(spec.target, ""))
        after = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
        if isinstance(before, torch.Tensor) and isinstance(after, torch.Tensor) and before.shape != after.shape:
            found[spec.target] = tuple(int(d) for d in before.shape)
    return found


def expect_state_shape(value: torch.Tensor, name: str, shape: tuple[int, ...]) -> None:
    """Refuse to run on a buffer or parameter whose shape is not the exported one (see
    :func:`state_reshaped`)."""
    if tuple(value.shape) != shape:
        raise UnsupportedError(
            f"this program was exported with {name} of shape {shape} and writes it with another shape; it is "
            f"called with {name} of shape {tuple(value.shape)} (a second call meets the shape the first one left), "
            "and a program traced for one shape can compute wrongly with another (slice bounds and sizes are "
            "baked in). Export again for the new shape, or keep the buffer's shape (write into it in place)",
            kind=Refusal.STATE_REPLACED, op=name)


tc.keep_calls_in_torch_dead_code_elimination(expect_state_shape)


def expect_no_grad(value: torch.Tensor, name: str, line: str) -> None:
    """Refuse to run, with grad on, on ``value`` requiring grad where the program was exported
    with it not requiring grad and writes a value computed from it through a ``detach()``-ed
    alias (``passes/grad_free_inputs.py``): eager would give that alias its own history."""
    if torch.is_grad_enabled() and isinstance(value, torch.Tensor) and value.requires_grad:
        raise UnsupportedError(
            f"this program was exported with {name} not requiring grad, and the model writes a value computed "
            "from it through a detach()-ed alias: with it requiring grad, eager gives that alias its own "
            "autograd history, which the program cannot carry. Call it with inputs and parameters that do "
            f"not require grad (or under torch.no_grad()), or export with {name} requiring grad to see "
            "what to change", kind=Refusal.GRAD_VALUE_THROUGH_DETACH, op=name, source=line or None)


tc.keep_calls_in_torch_dead_code_elimination(expect_no_grad)


def expect_aliasing(tensors: tuple[torch.Tensor, ...], names: tuple[str, ...], geometries: tuple,
                    same_as: tuple[int, ...] = ()) -> None:
    """Refuse to run on inputs that do not share memory as the exported ones did (``f(x, x)``
    exported, ``f(x, y)`` called): the program carries the model's writes from one to the other
    through a synthetic base (program/aliased_inputs.py), which holds only for that aliasing; also
    where one tensor passed twice was exported as two tensors, or the other way (``x.t_()`` then
    relays both, or one)."""
    lowest = min(t.storage_offset() for t in tensors)
    found = tuple((tuple(t.shape), tuple(t.stride()), t.storage_offset() - lowest) for t in tensors)
    shared = all(_storage_pointer(t) == _storage_pointer(tensors[0]) for t in tensors)
    identity = tuple(next(k for k, u in enumerate(tensors) if u is t) for t in tensors)
    if (not shared or found != tuple((tuple(s), tuple(st), o) for s, st, o in geometries)
            or (same_as and identity != tuple(same_as))):
        raise RuntimeError(
            f"this program was exported with inputs {', '.join(names)} sharing memory (laid out "
            f"{list(geometries)}) and carries the model's writes through one into the others; it is "
            f"called with {'inputs that do not share memory' if not shared else list(found)}"
            f"{'' if not same_as or identity == tuple(same_as) else ' (one tensor passed twice differs from two)'}: export again "
            "with inputs aliased as they will be passed (distinct tensors for distinct inputs)")


tc.keep_calls_in_torch_dead_code_elimination(expect_aliasing)


def relayout(destination: torch.Tensor, before: Layout, after: Layout) -> None:
    """Give ``destination`` the layout ``after`` over its own storage (grown, keeping its
    data, where ``after`` reaches past it), as eager's in-place view op did."""
    expect_layout(destination, before, after)
    sizes, strides, offset = after
    needed = (offset + sum((n - 1) * st for n, st in zip(sizes, strides)) + 1) if all(sizes) else 0
    leaf_with_grad = destination.is_leaf and destination.requires_grad
    with torch.no_grad() if leaf_with_grad else contextlib.nullcontext():
        storage = destination.untyped_storage()
        if storage.nbytes() < needed * destination.element_size():
            storage.resize_(needed * destination.element_size())
        destination.as_strided_(sizes, strides, offset)


def load(f: Any) -> FunctionalExportedProgram:
    """``torch.export.load``, returning our program class so ``module()`` writes back as eager.

    A program saved by us loads with plain ``torch.export.load`` too; only
    write-backs to grad-requiring leaves (see :class:`FunctionalExportedProgram`)
    need this class.
    """
    ep = torch.export.load(f)
    ep.__class__ = FunctionalExportedProgram
    _one_object_per_tied_weight(ep.state_dict)
    return ep  # type: ignore[return-value]


def _one_object_per_tied_weight(state_dict: dict[str, torch.Tensor]) -> None:
    """Loading gives each name of a tied weight its own tensor over one storage; make them one
    object again, as in the saved program, so a deepcopy of the loaded program keeps them tied
    (``module()`` registers a tied weight's other names by finding the same tensor)."""
    seen: dict[Any, torch.Tensor] = {}
    for name, tensor in state_dict.items():
        if _storage_pointer(tensor) == 0:
            continue
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape),
               tuple(tensor.stride()), tensor.dtype, type(tensor))
        state_dict[name] = seen.setdefault(key, tensor)


def to_exported_program(gm: torch.fx.GraphModule, sig: AotSignature,
                        example_inputs: Any = None) -> ExportedProgram:
    call_signature = ModuleCallSignature(inputs=[], outputs=[], in_spec=sig.in_spec,
                                         out_spec=sig.out_spec,
                                         forward_arg_names=sig.forward_arg_names)
    with tc.exported_program_code_on_first_use():
        ep = FunctionalExportedProgram(
            root=gm, graph=gm.graph, graph_signature=sig.graph_signature,
            state_dict=sig.state_dict, range_constraints=sig.range_constraints,
            module_call_graph=[ModuleCallEntry(fqn="", signature=call_signature),
                               *(ModuleCallEntry(fqn=fqn, signature=signature)
                                 for fqn, signature in sig.module_call_signatures.items())],
            example_inputs=example_inputs, constants=sig.constants,  # type: ignore[arg-type]
        )
    with_program_facts(ep.graph_module, ProgramFacts(
        composite_decisions=sig.composite_decisions, grad_enabled_on_return=sig.grad_enabled_on_return,
        ambient=sig.ambient, input_layouts=dict(sig.input_layouts),
        inputs_without_grad=dict(sig.inputs_without_grad), input_aliasing=sig.input_aliasing,
        written_through_data=sig.written_through_data, output_views_of_written=sig.output_views_of_written))
    return ep
