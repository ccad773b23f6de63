"""The joint program: an ExportedProgram whose ``module()`` runs one training step.

torch's own joint programs (``_export_forward_backward``) cannot be run through
``module()``. Ours can: :class:`TrainingStepModule` calls the graph once (under
``no_grad``: the graph computes its gradients itself), writes buffers and inputs back as
eager would, accumulates each gradient into ``.grad`` as eager's ``loss.backward()``
does, and returns ``(loss, *user outputs)`` (the forward's structure), detached.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.export.exported_program import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind

from .. import _torch_compat as tc
from ..artifacts import program_facts
from ..program.returned_views import view_of_destination
from ..program.runtime import expect_state_shape, state_reshaped, write_back


class JointExportedProgram(ExportedProgram):
    """A joint program (see module docstring); ``module()`` gives a :class:`TrainingStepModule`."""

    def module(self, *args: Any, **kwargs: Any) -> torch.nn.Module:  # type: ignore[override]
        return TrainingStepModule(self)


class TrainingStepModule(torch.nn.Module):
    """One training step of a joint program, over parameters and buffers it owns."""

    def __init__(self, ep: ExportedProgram):
        super().__init__()
        self.graph_module = torch.fx.GraphModule(ep.graph_module, ep.graph_module.graph)
        self._inputs = [(s.kind, s.target) for s in ep.graph_signature.input_specs]
        self._outputs = [(s.kind, s.target) for s in ep.graph_signature.output_specs]
        self._user_names = [s.arg.name for s in ep.graph_signature.input_specs if s.kind is InputKind.USER_INPUT]
        entry = ep.module_call_graph[0].signature
        self._in_spec, self._out_spec = entry.in_spec, entry.out_spec
        self._constants = dict(ep.constants)
        self._views_of_writes = _views_of_writes(ep, self._outputs)
        self._reshaped = state_reshaped(ep)  # checked each step: the next one meets the new shape
        # with the optimizer step in the program, each step's gradient replaces .grad (eager's
        # zero_grad(); backward(); step()); without it gradients accumulate as eager's backward
        self._steps_optimizer = any(kind is InputKind.BUFFER and str(target).startswith("optim.group")
                                    for kind, target in self._inputs)
        for kind, target in self._inputs:
            if kind is InputKind.PARAMETER:
                _register(self, target, torch.nn.Parameter(ep.state_dict[target].detach().clone(),
                                                           requires_grad=ep.state_dict[target].requires_grad))
            elif kind is InputKind.BUFFER:
                value = ep.state_dict[target] if target in ep.state_dict else ep.constants[target]
                _register(self, target, value.detach().clone(), persistent=target in ep.state_dict)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        flat, _ = tc.pytree.tree_flatten((args, kwargs))
        user = iter(flat)
        state: list[Any] = []
        by_name: dict[str, Any] = {}
        for (kind, target), name in zip(self._inputs, _names(self._inputs, self._user_names)):
            if kind is InputKind.PARAMETER:
                state.append(self.get_parameter(target))
            elif kind is InputKind.BUFFER:
                state.append(self.get_buffer(target))
            elif kind in (InputKind.CONSTANT_TENSOR, InputKind.CUSTOM_OBJ):
                state.append(self._constants[target])
            else:
                state.append(next(user))
            by_name[name] = state[-1]
        for target, shape in self._reshaped.items():
            expect_state_shape(by_name[target], target, shape)
        with torch.no_grad():
            outs = self.graph_module(*state)
        results = []
        # a user output that is a written input's own value is that input, as eager returned it
        # (graph_cleanup lets the two share a node only then): the live tensor, which a later
        # write of the step (the optimizer's) updates as eager's step updates what it returned
        written: dict[int, torch.Tensor] = {}
        destinations: dict[int, torch.Tensor] = {}
        for index, ((kind, target), value) in enumerate(zip(self._outputs, outs)):
            if kind in _WRITES:
                into = (self.get_buffer(target) if kind is OutputKind.BUFFER_MUTATION
                        else self.get_parameter(target) if kind is OutputKind.PARAMETER_MUTATION
                        else by_name[target])
                write_back(into, value)
                written.setdefault(id(value), into)
                destinations[index] = into
            elif kind is OutputKind.GRADIENT_TO_PARAMETER:
                parameter = self.get_parameter(target)
                if self._steps_optimizer:
                    parameter.grad = None
                accumulate_grad(parameter, value)
            elif kind is OutputKind.GRADIENT_TO_USER_INPUT:
                accumulate_grad(by_name[target], value)
        for index, ((kind, _), value) in enumerate(zip(self._outputs, outs)):
            if kind in (OutputKind.LOSS_OUTPUT, OutputKind.USER_OUTPUT):
                write = self._views_of_writes.get(index)
                results.append(written.get(id(value), value) if write is None
                               else view_of_destination(value, outs[write], destinations[write]))
        return tc.pytree.tree_unflatten(results, self._out_spec)

    def set_lr(self, lr: float, group: int = 0) -> None:
        """The learning rate of optimizer group ``group`` for the next steps (a scheduler's job)."""
        self.get_buffer(f"optim.group{group}.lr").fill_(lr)

    def optimizer_state(self, parameter: str, key: str) -> torch.Tensor:
        """The optimizer's state ``key`` (torch's name: ``exp_avg``, ``momentum_buffer``, ...) of ``parameter``."""
        return self.get_buffer(f"optim.{parameter}.{key}")


_WRITES = (OutputKind.BUFFER_MUTATION, OutputKind.PARAMETER_MUTATION, OutputKind.USER_INPUT_MUTATION)


def _views_of_writes(ep: ExportedProgram, outputs: list[tuple[OutputKind, Any]]) -> dict[int, int]:
    """For each user output eager returned as a view of an input the step writes
    (``ProgramFacts.output_views_of_written``, user outputs counted as the forward's, the
    loss first): the index of the write's output. The view is taken of the live tensor, so it
    shows every later write of the step, the optimizer's included, as eager's view does."""
    users = [i for i, (kind, _) in enumerate(outputs) if kind in (OutputKind.LOSS_OUTPUT, OutputKind.USER_OUTPUT)]
    first_write: dict[Any, int] = {}
    for i, (kind, target) in enumerate(outputs):
        if kind in _WRITES:
            first_write.setdefault(target, i)
    return {users[k]: first_write[name] for k, name in program_facts(ep.graph_module).output_views_of_written}


def _names(inputs: list[tuple[InputKind, Any]], user_names: list[str]) -> list[str]:
    users = iter(user_names)
    return [str(target) if kind is not InputKind.USER_INPUT else next(users) for kind, target in inputs]


def accumulate_grad(leaf: torch.Tensor, grad: torch.Tensor) -> None:
    """``leaf.grad`` as eager's backward leaves it: the new gradient (with the leaf's strides,
    eager's gradient layout contract) when there was none, else the sum. A gradient of a tensor
    subclass (a DTensor parameter's, with the placements the backward gave it) is kept as it
    is, as eager's AccumulateGrad keeps it: a plain buffer could not take it."""
    with torch.no_grad():
        if leaf.grad is None and type(grad) not in (torch.Tensor, torch.nn.Parameter):
            leaf.grad = grad.detach()
        elif leaf.grad is None:
            fresh = torch.empty_strided(leaf.shape, leaf.stride(), dtype=leaf.dtype, device=leaf.device)
            leaf.grad = fresh.copy_(grad)
        else:
            leaf.grad.add_(grad)  # in place, as eager accumulates under no_grad


def _register(root: torch.nn.Module, fqn: str, value: torch.Tensor, persistent: bool = True) -> None:
    *path, leaf = fqn.split(".")
    owner = root
    for part in path:
        if not hasattr(owner, part):
            owner.add_module(part, torch.nn.Module())
        owner = getattr(owner, part)
    if isinstance(value, torch.nn.Parameter):
        owner.register_parameter(leaf, value)
    else:
        owner.register_buffer(leaf, value, persistent=persistent)


__all__ = ["JointExportedProgram", "TrainingStepModule", "accumulate_grad"]
