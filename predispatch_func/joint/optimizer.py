"""The optimizer step in the joint program: SGD (momentum, nesterov), Adam and AdamW.

``torch.optim``'s ``step()`` writes parameters and state in place and reads the step
count with ``.item()``; neither fits a functional graph. Instead each supported
optimizer is restated here as functional tensor math, op for op as torch's single-tensor
path computes it (``_single_tensor_sgd`` / ``_single_tensor_adam``, the same formulas
for ``foreach`` on and off, which eager evaluates with other kernels: equal to rounding).
The program then carries:

* each parameter's new value (``PARAMETER_MUTATION``);
* the optimizer state as buffers of the program, named ``optim.<parameter>.<key>``
  with torch's keys (``momentum_buffer``, ``exp_avg``, ``exp_avg_sq``, ``max_exp_avg_sq``,
  ``step``), written as ``BUFFER_MUTATION``; SGD also counts ``step`` (its first momentum
  step copies the gradient, as eager's lazily created buffer);
* each parameter group's learning rate as a buffer input ``optim.group<i>.lr`` (float64),
  never written: a scheduler sets it on ``ep.module()`` (``set_lr``) without re-export.

Other hyperparameters are constants of the graph. What is refused (``JointProblem``):
another optimizer class, ``fused``/``capturable``/``differentiable``, complex parameters,
and an optimizer holding tensors that are not the model's parameters.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

from .errors import JointError, JointProblem

_SUPPORTED = ("SGD", "Adam", "AdamW")


@dataclasses.dataclass(frozen=True)
class ParameterUpdate:
    """One parameter under the optimizer: its name, group and state buffer names."""

    name: str
    group: int
    state: tuple[str, ...]  # torch's state keys this parameter carries, in buffer order


@dataclasses.dataclass(frozen=True)
class OptimizerPlan:
    """What the program needs to run ``optimizer.step()`` functionally."""

    kind: str
    hyper: tuple[dict[str, Any], ...]  # per group, constants of the graph
    updates: tuple[ParameterUpdate, ...]
    initial: dict[str, torch.Tensor]  # buffer name -> its value at export (state, then lrs)
    clip_grad_norm: float | None = None  # clip_grad_norm_(model.parameters(), it) before the step

    def buffer(self, update: ParameterUpdate, key: str) -> str:
        return f"optim.{update.name}.{key}"

    def step(self, params: dict[str, Any], grads: dict[str, Any], state: dict[str, Any]
             ) -> tuple[dict[str, Any], dict[str, Any]]:
        """New parameter values and new state values (by buffer name), traced as functional ops."""
        new_params: dict[str, Any] = {}
        new_state: dict[str, Any] = {}
        for update in self.updates:
            grad = grads.get(update.name)
            if grad is None:  # eager skips a parameter without a gradient
                continue
            hyper, lr = self.hyper[update.group], state[f"optim.group{update.group}.lr"]
            mine = {key: state[self.buffer(update, key)] for key in update.state}
            step = _sgd if self.kind == "SGD" else _adam
            new_params[update.name], written = step(params[update.name], grad, mine, lr, hyper)
            new_state.update({self.buffer(update, key): value for key, value in written.items()})
        return new_params, new_state


def plan_for(optimizer: Any, model: torch.nn.Module, clip_grad_norm: float | None = None) -> OptimizerPlan:
    """Read ``optimizer`` (a ``torch.optim`` instance over ``model``'s parameters) into a plan;
    ``clip_grad_norm``: the step clips the gradients first, as ``torch.nn.utils.clip_grad_norm_``."""
    if clip_grad_norm is not None and not (isinstance(clip_grad_norm, (int, float)) and not isinstance(
            clip_grad_norm, bool) and 0 < clip_grad_norm < float("inf")):
        raise JointError(f"export_joint: clip_grad_norm={clip_grad_norm!r}: give the largest total gradient norm, "
                         "a positive finite number (clip_grad_norm_'s max_norm)", kind=JointProblem.BAD_ARGUMENT)
    kind = type(optimizer).__name__
    if kind not in _SUPPORTED or type(optimizer).__module__.split(".")[:2] != ["torch", "optim"]:
        raise JointError(f"export_joint: optimizer {type(optimizer).__qualname__} is not supported; the joint "
                         f"program carries {', '.join(_SUPPORTED)} (torch.optim)",
                         kind=JointProblem.UNSUPPORTED_OPTIMIZER)
    names = {id(p): name for name, p in model.named_parameters()}  # a tied weight: its first name, as the program
    hyper, updates, initial = [], [], {}
    for g, group in enumerate(optimizer.param_groups):
        for option in ("fused", "capturable", "differentiable"):
            if group.get(option):
                raise JointError(f"export_joint: {kind}({option}=True) is not supported; export with "
                                 f"{option}=False (the program's update is one functional graph either way)",
                                 kind=JointProblem.UNSUPPORTED_OPTIMIZER)
        hyper.append({k: v for k, v in group.items() if k != "params"})
        initial[f"optim.group{g}.lr"] = torch.tensor(float(group["lr"]), dtype=torch.float64)
        for p in group["params"]:
            if id(p) not in names:
                raise JointError(
                    f"export_joint: the optimizer updates a tensor of shape {tuple(p.shape)} that is not a "
                    f"parameter of {type(model).__name__} (group {g}); build the optimizer over "
                    "model.parameters() (or a subset of them)", kind=JointProblem.FOREIGN_OPTIMIZER_PARAMETERS)
            if p.is_complex():
                raise JointError(f"export_joint: complex parameter {names[id(p)]!r} under {kind} is not supported",
                                 kind=JointProblem.UNSUPPORTED_OPTIMIZER)
            keys, values = _state_of(kind, group, p, optimizer.state.get(p, {}))
            update = ParameterUpdate(names[id(p)], g, keys)
            updates.append(update)
            initial.update({f"optim.{update.name}.{key}": value for key, value in zip(keys, values)})
    return OptimizerPlan(kind, tuple(hyper), tuple(updates), initial,
                         float(clip_grad_norm) if clip_grad_norm is not None else None)


def clipped_by_total_norm(grads: list[Any], max_norm: float) -> list[Any]:
    """``torch.nn.utils.clip_grad_norm_(..., max_norm)`` (2-norm) as functional ops, op for op as
    its per-tensor path: each gradient's norm, grouped by device and dtype in order of first
    appearance as torch groups them, the norm of their stack, the coefficient
    ``max_norm / (total + 1e-6)`` clamped at 1, and every gradient times it."""
    groups: dict[tuple[Any, Any], list[int]] = {}
    for i, g in enumerate(grads):
        groups.setdefault((g.device, g.dtype), []).append(i)
    order = [i for members in groups.values() for i in members]
    norms = [torch.linalg.vector_norm(grads[i], 2.0) for i in order]
    first = grads[order[0]].device
    total = torch.linalg.vector_norm(torch.stack([n.to(first) for n in norms]), 2.0)
    coefficient = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    return [g * coefficient.to(g.device) for g in grads]


def _state_of(kind: str, group: dict, p: torch.Tensor, state: dict) -> tuple[tuple[str, ...], list[torch.Tensor]]:
    """The state keys a parameter carries and their values now (eager's lazily made state: zeros)."""
    def have(key: str, like: torch.Tensor | None = None, scalar: bool = False) -> torch.Tensor:
        value = state.get(key)
        if isinstance(value, torch.Tensor):
            return value.detach().clone()
        if scalar:
            return torch.tensor(float(value or 0.0), dtype=torch.float32)
        return torch.zeros_like(p if like is None else like, memory_format=torch.preserve_format)

    if kind == "SGD":
        if not group["momentum"]:
            return (), []
        started = state.get("momentum_buffer") is not None
        return ("momentum_buffer", "step"), [have("momentum_buffer"),
                                             torch.tensor(1.0 if started else 0.0, dtype=torch.float32)]
    keys = ["exp_avg", "exp_avg_sq", "step"] + (["max_exp_avg_sq"] if group.get("amsgrad") else [])
    return tuple(keys), [have(k, scalar=(k == "step")) for k in keys]


def _sgd(param: Any, grad: Any, state: dict[str, Any], lr: Any, h: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """torch's ``_single_tensor_sgd`` for one parameter."""
    grad = -grad if h.get("maximize") else grad
    if h["weight_decay"] != 0:
        grad = grad.add(param, alpha=h["weight_decay"])
    written: dict[str, Any] = {}
    if h["momentum"] != 0:
        buf, step = state["momentum_buffer"], state["step"]
        continued = buf.mul(h["momentum"]).add(grad, alpha=1 - h["dampening"])
        buf = torch.where(step > 0, continued, grad)  # the first step's buffer is the gradient
        written = {"momentum_buffer": buf, "step": step + 1}
        grad = grad.add(buf, alpha=h["momentum"]) if h["nesterov"] else buf
    return param - grad * lr.to(grad.dtype), written


def _adam(param: Any, grad: Any, state: dict[str, Any], lr: Any, h: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """torch's ``_single_tensor_adam`` for one parameter (AdamW: decoupled weight decay)."""
    beta1, beta2 = h["betas"]
    grad = -grad if h.get("maximize") else grad
    step = state["step"] + 1
    if h["weight_decay"] != 0:
        if h.get("decoupled_weight_decay", False):
            param = param * (1 - lr * h["weight_decay"]).to(param.dtype)
        else:
            grad = grad.add(param, alpha=h["weight_decay"])
    exp_avg = state["exp_avg"].lerp(grad, 1 - beta1)
    exp_avg_sq = state["exp_avg_sq"].mul(beta2).addcmul(grad, grad, value=1 - beta2)
    step64 = step.to(torch.float64)
    bias_correction1 = 1 - torch.pow(beta1, step64)
    bias_correction2_sqrt = (1 - torch.pow(beta2, step64)).sqrt()
    step_size = lr / bias_correction1
    written = {"exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq, "step": step}
    second = exp_avg_sq
    if h.get("amsgrad"):
        second = written["max_exp_avg_sq"] = torch.maximum(state["max_exp_avg_sq"], exp_avg_sq)
    denom = (second.sqrt() / bias_correction2_sqrt.to(param.dtype)).add(h["eps"])
    return param + (-step_size).to(param.dtype) * exp_avg / denom, written


def optimizer_names(plan: OptimizerPlan, forward_params: Sequence[str]) -> list[str]:
    """The parameters the plan updates, in the forward's parameter order."""
    updated = {u.name for u in plan.updates}
    return [name for name in forward_params if name in updated]


__all__ = ["OptimizerPlan", "ParameterUpdate", "clipped_by_total_norm", "optimizer_names", "plan_for"]


class OptimizerInTrace:
    """The plan as the joint trace's ``after_backward``: maps the forward's parameter inputs,
    their gradients and the state inputs to the plan's names, and records what it wrote."""

    def __init__(self, plan: OptimizerPlan, forward_inputs: Sequence[Any]):
        self.plan = plan
        self.param_index = {s.target: i for i, s in enumerate(forward_inputs) if s.kind.name == "PARAMETER"}
        self.state_names = list(plan.initial)
        self.writes: list[tuple[Any, str]] = []

    def clip(self, grads: dict[int, Any]) -> dict[int, Any]:
        """The parameters' gradients clipped by their total norm (the plan's ``clip_grad_norm``);
        a user input's gradient is not clipped (``clip_grad_norm_`` is over the parameters)."""
        if self.plan.clip_grad_norm is None:
            return grads
        of_parameters = [i for i in self.param_index.values() if grads.get(i) is not None]
        if not of_parameters:
            return grads
        clipped = clipped_by_total_norm([grads[i] for i in of_parameters], self.plan.clip_grad_norm)
        return {**grads, **dict(zip(of_parameters, clipped))}

    def __call__(self, flat: Sequence[Any], grads: dict[int, Any], extras: Sequence[Any]) -> list[Any]:
        from torch.export.graph_signature import OutputKind

        params = {name: flat[i] for name, i in self.param_index.items()}
        by_name = {name: grads[i] for name, i in self.param_index.items() if i in grads}
        new_params, new_state = self.plan.step(params, by_name, dict(zip(self.state_names, extras)))
        order_p = [n for n in self.param_index if n in new_params]
        order_s = [n for n in self.state_names if n in new_state]
        self.writes = ([(OutputKind.PARAMETER_MUTATION, n) for n in order_p]
                       + [(OutputKind.BUFFER_MUTATION, n) for n in order_s])
        return [new_params[n] for n in order_p] + [new_state[n] for n in order_s]


__all__ += ["OptimizerInTrace"]
