"""``export_joint``: the driver of a joint (training) export, one straight line of stages.

    training_step (loss.py)            the model as a call returning (loss, *outputs)
      -> export(...)                   the functional forward program (regions, kept composites)
      -> trace_joint (differentiate.py) forward replayed above autograd + the backward autograd runs
      -> outline_regions, dead code    region markers back to region HOPs (regions/)
      -> joint_signature (signature.py) LOSS_OUTPUT, GRADIENT_TO_PARAMETER, GRADIENT_TO_USER_INPUT
      -> JointExportedProgram (program.py), whose module() runs one step
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.export.exported_program import ModuleCallEntry, ModuleCallSignature
from torch.export.graph_signature import InputKind, OutputKind

from .. import _torch_compat as tc
from ..artifacts import ProgramFacts, program_facts, with_program_facts
from ..autograd_facts import may_carry_grad
from ..errors import ExportError
from ..export import export
from ..frame_stack import on_a_reserved_frame_stack
from ..graphs import all_graph_modules
from ..opsets.lowering import Lowering
from ..passes import node_meta
from ..passes.graph_cleanup import eliminate_dead_code
from ..regions import outline_regions
from ..trace.composite_policy import decomposed_for_the_backward
from ..verify import check_contract
from .differentiate import trace_joint
from .errors import JointError, JointProblem
from .formula_fixes import backward_reads_what_the_forward_drew
from .loss import training_step
from .optimizer import OptimizerInTrace, OptimizerPlan, plan_for
from .program import JointExportedProgram
from .signature import joint_signature
from .temporary_writes import functional_writes


@on_a_reserved_frame_stack
def export_joint(model: torch.nn.Module, args: tuple, kwargs: dict | None = None, *,
                 loss_fn: Callable[..., Any] | None = None, optimizer: Any = None, dynamic_shapes: Any = None,
                 target: Any = None, python_state: str = "error",
                 composite_overrides: dict[str, str] | None = None,
                 clip_grad_norm: float | None = None) -> JointExportedProgram:
    """Export one training step of ``model``: forward, loss and backward in one functional program.

    Without ``loss_fn`` the model returns the loss (a scalar tensor, or a tuple/list whose first
    element is it); with it, the loss is ``loss_fn(model(*args, **kwargs))``. The program keeps the
    forward export's regions (HOP calls) and kept composites (single forward nodes); its backward
    is made of the ops eager's autograd runs. Outputs: the forward's mutations, the loss
    (``LOSS_OUTPUT``), the other outputs, then one gradient per parameter that requires grad
    (``GRADIENT_TO_PARAMETER``) and per user input that requires grad (``GRADIENT_TO_USER_INPUT``)
    the loss reaches. ``ep.module()`` runs one step: see docs/joint.md. ``target`` lowers forward
    and backward into an :class:`~predispatch_func.OpSet`. ``clip_grad_norm`` (with ``optimizer``):
    the step is eager's ``zero_grad(); loss.backward(); clip_grad_norm_(model.parameters(),
    clip_grad_norm); optimizer.step()``: the gradients returned and stepped with are the clipped ones.
    """
    if isinstance(model, torch.fx.GraphModule):
        raise JointError(
            f"export_joint of a torch.fx.GraphModule ({type(model).__name__}, e.g. an ep.module()) is not supported "
            "yet: its training step does not replay as eager's. Export the original nn.Module",
            kind=JointProblem.UNSUPPORTED_MODEL)
    if clip_grad_norm is not None and optimizer is None:
        raise JointError("export_joint: clip_grad_norm clips the gradients between the backward and the optimizer's "
                         "step (a training loop's zero_grad(); backward(); clip_grad_norm_(); step()): pass the "
                         "optimizer too", kind=JointProblem.BAD_ARGUMENT)
    plan = plan_for(optimizer, model, clip_grad_norm) if optimizer is not None else None
    args = tuple(args) if isinstance(args, (tuple, list)) else (args,)
    decomposed: dict[str, str] = {}
    while True:
        with node_meta.frames_recorded_of(loss_fn), decomposed_for_the_backward(decomposed):
            # the loss's nodes name the user's loss function
            forward = export(training_step(model, loss_fn), args, kwargs, dynamic_shapes=dynamic_shapes,
                             target=target, python_state=python_state, composite_overrides=composite_overrides)
        try:
            return differentiate_program(forward, args, kwargs, target=target, optimizer=plan)
        except JointError as error:
            op = _kept_op_to_decompose(error, decomposed)
            if op is None:
                raise
            decomposed[op] = " ".join(str(error).split())  # the refusal it answers, on one line, as the reason


def _kept_op_to_decompose(error: JointError, decomposed: dict[str, str]) -> str | None:
    """The kept composite whose saved value the backward cannot recompute (attention with dropout
    drew its mask inside the node), to export again with that op decomposed, so what the backward
    reads is a value of the forward's graph; None where decomposing would not help (another
    problem, an op decomposed already, or one the user asked to keep)."""
    op = getattr(error, "op", None)
    if error.kind is not JointProblem.SAVED_VALUE_NOT_RECOMPUTABLE or not isinstance(op, tc.OpOverload):
        return None
    return str(op) if str(op) not in decomposed else None


def differentiate_program(forward: Any, args: tuple, kwargs: dict | None, *, target: Any = None,
                          loss_index: int | None = None, optimizer: OptimizerPlan | None = None
                          ) -> JointExportedProgram:
    """The joint program of an exported forward whose user output ``loss_index`` (default: the
    first) is the loss; with ``optimizer`` (a plan, optimizer.py), the update after the backward."""
    sig = forward.graph_signature
    placeholders = [n for n in forward.graph.nodes if n.op == "placeholder"]
    user_inputs = iter(tc.pytree.tree_leaves((args, kwargs or {})))
    wants_grad = []
    hooks: dict[int, list[Any]] = {}
    for index, spec in enumerate(sig.input_specs):
        if spec.kind is InputKind.PARAMETER:
            parameter = forward.state_dict[spec.target]
            wants_grad.append(bool(parameter.requires_grad))
            hooks[index], post = tc.leaf_gradient_hooks(parameter)
            if post:
                raise JointError(
                    f"export_joint: parameter {spec.target!r} has a register_post_accumulate_grad_hook; the joint "
                    "program returns gradients and accumulates none, so it cannot run it. Remove the hook (or "
                    "run its work on ep.module()'s .grad after the step)", kind=JointProblem.UNSUPPORTED_HOOK)
        elif spec.kind is InputKind.USER_INPUT:
            value = next(user_inputs, None)
            wants_grad.append(isinstance(value, torch.Tensor) and value.requires_grad and may_carry_grad(value))
        else:
            wants_grad.append(False)
    n_mutations = sum(1 for s in sig.output_specs if s.kind.name.endswith("MUTATION"))
    lowering = Lowering(target) if target is not None else None
    update = OptimizerInTrace(optimizer, sig.input_specs) if optimizer is not None else None
    joint = trace_joint(forward.graph_module, [n.meta["val"] for n in placeholders],
                        loss_index=n_mutations + (loss_index or 0), wants_grad=wants_grad,
                        read_after_hidden_writes=_final_values_of_hidden_writes(forward, placeholders),
                        written_inputs=_final_values_of_writes(forward, placeholders),
                        decompositions=lowering.proxy_table() if lowering is not None else None,
                        n_mutations=n_mutations, extra_inputs=list(optimizer.initial.values()) if optimizer else (),
                        after_backward=update, clip_gradients=update.clip if update is not None else None,
                        gradient_hooks={i: h for i, h in hooks.items() if h},
                        state_writes={i: (f"buffer {s.target!r}" if s.kind is OutputKind.BUFFER_MUTATION
                                          else f"input {s.target!r}")
                                      for i, s in enumerate(sig.output_specs[:n_mutations])
                                      if s.kind in (OutputKind.BUFFER_MUTATION, OutputKind.USER_INPUT_MUTATION)})
    gm = joint.graph_module
    traced = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for node, named in zip(traced, placeholders):
        tc.rename_node(node, named.name)
        node.target = node.name
        if "val" not in node.meta and "val" in named.meta:  # a constant input (None, a flag)
            node.meta["val"] = named.meta["val"]
    grad_sources = {n for n, w in zip(traced, wants_grad) if w}
    if optimizer is not None:
        _place_state_inputs(gm, traced[len(placeholders):], list(optimizer.initial), sig)
    outline_regions(gm, grad_enabled=True, grad_sources=grad_sources)
    functional_writes(gm.graph, allows=lowering.allows if lowering is not None else None)  # the backward's temporaries
    backward_reads_what_the_forward_drew(gm)
    eliminate_dead_code(gm)
    _refuse_unrecorded_values(gm)
    if lowering is not None:
        lowering.check(gm)
    node_meta.fill_missing(gm, type(forward.graph_module))
    for _, sub in all_graph_modules(gm):
        sub.recompile()
    signature = joint_signature(gm, sig, joint.grad_of, loss_index=loss_index or 0,
                                state_buffers=list(optimizer.initial) if optimizer else (),
                                writes=update.writes if update is not None else ())
    state_dict = {**forward.state_dict, **(optimizer.initial if optimizer else {})}
    entry = forward.module_call_graph[0].signature
    call = ModuleCallSignature(inputs=[], outputs=[], in_spec=entry.in_spec, out_spec=entry.out_spec,
                               forward_arg_names=entry.forward_arg_names)
    with tc.exported_program_code_on_first_use():
        ep = JointExportedProgram(
            root=gm, graph=gm.graph, graph_signature=signature, state_dict=state_dict,
            range_constraints=forward.range_constraints, module_call_graph=[ModuleCallEntry(fqn="", signature=call)],
            example_inputs=forward.example_inputs, constants=forward.constants)
    facts = program_facts(forward.graph_module)
    with_program_facts(ep.graph_module, ProgramFacts(
        composite_decisions=facts.composite_decisions, grad_enabled_on_return=facts.grad_enabled_on_return,
        ambient=facts.ambient, input_layouts=dict(facts.input_layouts),
        output_views_of_written=facts.output_views_of_written))
    contract = check_contract(ep)  # e.g. an in-place gradient accumulation the engine chose: never shipped
    if not contract.ok:
        raise ExportError(f"export_joint made a program that breaks the IR contract (a bug; please report it):\n"
                          f"{contract}")
    ep.recomputed_in_backward = joint.recomputed  # type: ignore[attr-defined]
    ep.optimizer_plan = optimizer  # type: ignore[attr-defined]
    return ep


def _refuse_unrecorded_values(gm: torch.fx.GraphModule) -> None:
    """A value the trace met without a graph value for it is recorded as a constant holding a
    fake tensor: a program that cannot run. Where a torch HOP's backward traces its own body
    (``map``), a value that body reads from outside it ends up so; refused, naming the HOP,
    rather than a program that fails when called."""
    for name, module in all_graph_modules(gm):
        for node in module.graph.nodes:
            value = getattr(module, str(node.target), None) if node.op == "get_attr" else None
            if isinstance(value, tc.FakeTensor) and value.layout != torch.strided:
                raise JointError(
                    f"export_joint: the backward reads a {value.layout} tensor autograd saved ({node.name}, "
                    f"{tuple(value.shape)}; e.g. to_dense's input): a sparse tensor has no storage the trace can "
                    "map to a graph value, so the joint program cannot carry it. Densify before the op that "
                    "saves it, or train this model eagerly (ep.module() of pf.export trains it)",
                    kind=JointProblem.UNSUPPORTED_MODEL)
            if isinstance(value, tc.FakeTensor):
                hop = _caller_of(gm, name.split(".")[0])
                raise JointError(
                    f"export_joint: {f'the backward of `{hop}`' if hop else 'the backward'} reads a value its "
                    f"trace did not record ({node.name} in {name}): the joint program cannot carry it. A limit of "
                    "export_joint with torch's control-flow ops: compute the value outside the op's body, or "
                    "train this model eagerly (ep.module() of pf.export trains it)",
                    kind=JointProblem.UNSUPPORTED_HOP)


def _caller_of(gm: torch.fx.GraphModule, subgraph: str) -> str | None:
    """The op of ``gm`` that calls subgraph module ``subgraph`` (``map_impl``, ``cond``), if any."""
    for node in gm.graph.nodes:
        if node.op == "call_function" and any(getattr(a, "op", None) == "get_attr" and a.target == subgraph
                                              for a in tc.pytree.tree_leaves((node.args, node.kwargs))):
            return getattr(node.target, "__name__", str(node.target))
    return None


def _final_values_of_hidden_writes(forward: Any, placeholders: list[torch.fx.Node]) -> dict[int, int]:
    """Input index -> forward output index of its final value, for each input written only
    through ``.data``: eager's backward reads such a write (no version bump, no error), so the
    joint backward reads that input's saved values at their final value too."""
    names = program_facts(forward.graph_module).written_through_data
    return {i: m for i, m in _final_values_of_writes(forward, placeholders).items() if placeholders[i].name in names}


def _final_values_of_writes(forward: Any, placeholders: list[torch.fx.Node]) -> dict[int, int]:
    """Input index -> forward output index of its final value, for each input the forward writes."""
    sig = forward.graph_signature
    target_of = [s.target if s.target is not None else s.arg.name for s in sig.input_specs]
    output_of = {s.target: i for i, s in enumerate(sig.output_specs) if s.kind.name.endswith("MUTATION")}
    return {i: output_of[target_of[i]] for i in range(len(placeholders)) if target_of[i] in output_of}


def _place_state_inputs(gm: torch.fx.GraphModule, state: list[torch.fx.Node], names: list[str],
                        forward: Any) -> None:
    """The optimizer's state placeholders, named as torch names buffers, after the forward's
    buffers and before the user inputs (torch's placeholder order)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder" and n not in state]
    kinds = [s.kind for s in forward.input_specs]
    first_user = next((n for n, k in zip(placeholders, kinds) if k is InputKind.USER_INPUT), None)
    for node, name in zip(state, names):
        tc.rename_node(node, "b_" + name.replace(".", "_"))
        node.target = node.name
        if first_user is not None:
            first_user.prepend(node)


__all__ = ["differentiate_program", "export_joint"]
