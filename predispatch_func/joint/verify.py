"""``verify_joint``: a joint program against the reference's training steps.

The contract checks of ``pf.check_contract`` (no mutable node in any graph, a signature
that names the graph's outputs), then ``calls`` steps replayed side by side, each under
the same RNG seed on fresh clones of the inputs: eager runs ``loss = model(...)`` (or
``loss_fn`` of it) and ``loss.backward()`` (then ``optimizer.step()`` and
``zero_grad()`` when the program holds the update); the program runs ``ep.module()``.
Compared after each step: the loss and other outputs, every parameter's ``.grad`` and
input's ``.grad`` (accumulating over the steps, as eager's do), every buffer, and, with
an optimizer, every parameter and optimizer state tensor.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch

from .. import _torch_compat as tc
from .. import output_aliasing
from ..errors import VerificationError
from ..frame_stack import on_a_reserved_frame_stack
from ..state.history_free_copy import rebind_closures
from ..verify import VerifyReport, check_contract


@on_a_reserved_frame_stack
def verify_joint(ep: Any, model: torch.nn.Module, args: tuple, kwargs: dict | None = None, *,
                 loss_fn: Callable[..., Any] | None = None, optimizer: Any = None, calls: int = 1,
                 rtol: float = 1e-5, atol: float = 1e-5, seed: int = 0, target: Any = None,
                 raise_on_failure: bool = False, judge_float64: bool = False,
                 clip_grad_norm: float | None = None) -> VerifyReport:
    """Check ``ep`` (from ``export_joint(model, args, kwargs, loss_fn=..., optimizer=...)``) against
    eager over ``calls`` steps. ``model`` and ``optimizer`` are as they were at export (they are
    copied, never stepped).

    ``judge_float64``: where values differ (and nothing else), say whether that is rounding:
    the program re-exported in float64 against eager in float64, and each float32 gradient's
    distance to the float64 one against eager's (``report.rounding``, joint/rounding.py). The
    report stays not ok: the float32 values do differ.

    ``clip_grad_norm``: eager clips (``clip_grad_norm_(model.parameters(), it)``) before its step;
    by default the program's own (``export_joint(..., clip_grad_norm=)``), where it was exported so."""
    if clip_grad_norm is None:
        clip_grad_norm = getattr(getattr(ep, "optimizer_plan", None), "clip_grad_norm", None)
    report = check_contract(ep)
    if target is not None:
        from ..opsets import Lowering

        report.checked.append(f"membership in {target.name!r}")
        report.problems += [f"{where}: node {node.format_node()} is not in the target op set"
                            for where, node in Lowering(target).outside(ep.graph_module)]
    eager = copy_with_gradient_hooks(model)
    eager_optimizer = _optimizer_over(optimizer, ep, eager) if optimizer is not None else None
    program = ep.module()
    args = tuple(args) if isinstance(args, (tuple, list)) else (args,)
    for step in range(calls):
        e_args, e_kwargs = _fresh((args, kwargs or {}))
        p_args, p_kwargs = _fresh((args, kwargs or {}))
        if eager_optimizer is not None:
            eager_optimizer.zero_grad(set_to_none=True)
        torch.manual_seed(seed + step)
        e_state = output_aliasing.state_tensors(eager)
        e_out = eager(*e_args, **e_kwargs)
        e_loss, e_rest = (loss_fn(e_out), e_out) if loss_fn is not None else _split(e_out)
        e_loss.backward()
        if eager_optimizer is not None:
            if clip_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(eager.parameters(), clip_grad_norm)
            eager_optimizer.step()
        torch.manual_seed(seed + step)
        p_loss, *p_rest = program(*p_args, **p_kwargs)
        where = f"step {step + 1}"
        _compare(f"{where}: loss", e_loss, p_loss, rtol, atol, report.problems)
        _compare(f"{where}: outputs", e_rest if loss_fn is not None else list(e_rest),
                 p_rest[0] if loss_fn is not None else p_rest, rtol, atol, report.problems)
        e_returned = (e_loss, e_rest) if loss_fn is not None else e_out
        p_returned = (p_loss, p_rest[0]) if loss_fn is not None else (p_loss, *p_rest)
        report.problems += [f"{where}: {problem}" for problem in output_aliasing.differences(
            output_aliasing.shared_memory(e_returned, (e_args, e_kwargs), eager, e_state),
            output_aliasing.shared_memory(p_returned, (p_args, p_kwargs), program))]
        for name, p in eager.named_parameters():
            q = program.get_parameter(name)
            _compare(f"{where}: {name}.grad", p.grad, q.grad, rtol, atol, report.problems)
            if eager_optimizer is not None:
                _compare(f"{where}: parameter {name}", p, q, rtol, atol, report.problems)
        for name, b in eager.named_buffers():
            _compare(f"{where}: buffer {name}", b, program.get_buffer(name), rtol, atol, report.problems)
        for i, (e, p) in enumerate(zip(tc.pytree.tree_leaves((e_args, e_kwargs)),
                                       tc.pytree.tree_leaves((p_args, p_kwargs)))):
            if isinstance(e, torch.Tensor):
                _compare(f"{where}: input {i}", e, p, rtol, atol, report.problems)
                if e.requires_grad != p.requires_grad:  # an input written with a value that requires grad
                    report.problems.append(f"{where}: input {i} requires_grad: eager {e.requires_grad}, "
                                           f"program {p.requires_grad}")
                elif e.is_leaf and p.is_leaf:  # only a leaf's .grad is filled
                    _compare(f"{where}: input {i}.grad", e.grad, p.grad, rtol, atol, report.problems)
        if eager_optimizer is not None:
            _compare_optimizer_state(where, eager, eager_optimizer, program, rtol, atol, report.problems)
    report.checked.append(f"{calls} training step(s) against eager: loss, outputs (and what each shares memory "
                          "with), gradients, buffers"
                          + (", parameters and optimizer state" if optimizer is not None else ""))
    if judge_float64 and report.problems and optimizer is None \
            and all("values differ" in p for p in report.problems):
        report.rounding = _judged(ep, model, args, kwargs or {}, loss_fn, target, seed, calls)
    if raise_on_failure and not report.ok:
        raise VerificationError(str(report))
    return report


def _judged(ep: Any, model: torch.nn.Module, args: tuple, kwargs: dict, loss_fn: Any, target: Any, seed: int,
            calls: int) -> Any:
    """The same program exported from float64 copies, verified against eager in float64 (1e-9),
    then one float32 step's gradients, ours and eager's, against float64 eager's
    (joint/rounding.py)."""
    from .export import export_joint
    from .rounding import judge_rounding, not_measured

    def widened(t: torch.Tensor) -> torch.Tensor:
        return t.detach().double().requires_grad_(t.requires_grad) if t.is_floating_point() else t

    try:
        wide_model = copy_with_gradient_hooks(model).double()
        wide_args, wide_kwargs = tc.pytree.tree_map_only(torch.Tensor, widened, (args, kwargs))
        wide_ep = export_joint(copy_with_gradient_hooks(wide_model), wide_args, wide_kwargs, loss_fn=loss_fn,
                               target=target)
        wide = verify_joint(wide_ep, wide_model, wide_args, wide_kwargs, loss_fn=loss_fn, calls=calls, seed=seed,
                            rtol=1e-9, atol=1e-10)
        exact = _step_gradients(copy_with_gradient_hooks(wide_model), wide_args, wide_kwargs, loss_fn, seed)
    except Exception as exc:  # noqa: BLE001 (a model that cannot run in float64: raft builds float32 grids)
        return not_measured(exc)
    eager = _step_gradients(copy_with_gradient_hooks(model), args, kwargs, loss_fn, seed)
    ours = _step_gradients(ep.module(), args, kwargs, None, seed, program=True)
    return judge_rounding(ours, eager, exact, wide.problems)


def _step_gradients(module: torch.nn.Module, args: tuple, kwargs: dict, loss_fn: Any, seed: int,
                    program: bool = False) -> dict[str, torch.Tensor]:
    """One step's parameter gradients on fresh inputs: a joint program's module places them; eager's
    backward runs from ``loss_fn`` of the output, or from the loss the model returns first."""
    fresh_args, fresh_kwargs = _fresh((args, kwargs))
    torch.manual_seed(seed)
    out = module(*fresh_args, **fresh_kwargs)
    if not program:
        (loss_fn(out) if loss_fn is not None else _split(out)[0]).backward()
    return {n: p.grad.detach() for n, p in module.named_parameters() if p.grad is not None}


def copy_with_gradient_hooks(model: torch.nn.Module) -> torch.nn.Module:
    """``copy.deepcopy(model)`` with the hooks its parameters carry (``register_hook``), which
    deepcopy drops: the eager twin must run them as the program does."""
    memo: dict[int, Any] = {}
    twin = copy.deepcopy(model, memo)
    rebind_closures(twin, memo)  # a forward closing over the model runs the twin, not the caller's
    for name, p in model.named_parameters():
        for hook in tc.leaf_gradient_hooks(p)[0]:
            twin.get_parameter(name).register_hook(hook)
    return twin


def _split(out: Any) -> tuple[torch.Tensor, list[Any]]:
    if isinstance(out, (tuple, list)):
        return out[0], list(out[1:])
    return out, []


def _fresh(value: Any) -> Any:
    """Clones of the inputs, each a leaf requiring grad where the original did."""
    def one(t: torch.Tensor) -> torch.Tensor:
        return t.detach().clone().requires_grad_(t.requires_grad)
    return tc.pytree.tree_map_only(torch.Tensor, one, value)


def _optimizer_over(optimizer: Any, ep: Any, copy_of_model: torch.nn.Module) -> Any:
    """``optimizer``'s twin over ``copy_of_model``'s parameters (named as the program's plan names
    them, group by group), with its hyperparameters and state."""
    twin_params = dict(copy_of_model.named_parameters(remove_duplicate=False))
    names = [[u.name for u in ep.optimizer_plan.updates if u.group == g] for g in range(len(optimizer.param_groups))]
    groups = []
    for group, group_names in zip(optimizer.param_groups, names):
        groups.append({**{k: v for k, v in group.items() if k != "params"},
                       "params": [twin_params[name] for name in group_names]})
    twin = type(optimizer)(groups, **{k: v for k, v in optimizer.defaults.items()
                                      if k not in groups[0]})
    state = optimizer.state_dict()
    twin.load_state_dict(copy.deepcopy(state))
    return twin


def _compare_optimizer_state(where: str, eager: torch.nn.Module, optimizer: Any, program: torch.nn.Module,
                             rtol: float, atol: float, problems: list[str]) -> None:
    names = {id(p): name for name, p in eager.named_parameters()}
    held = getattr(program, "optimizer_state", None)
    if held is None:
        problems.append(f"{where}: the program's module holds no optimizer state")
        return
    for p, state in optimizer.state.items():
        name = names[id(p)]
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                mine = held(name, key).to(value.dtype)
                _compare(f"{where}: optimizer state {name}.{key}", value, mine, rtol, atol, problems)


def _compare(what: str, a: Any, b: Any, rtol: float, atol: float, problems: list[str]) -> None:
    a_leaves, b_leaves = tc.pytree.tree_leaves(a), tc.pytree.tree_leaves(b)
    if len(a_leaves) != len(b_leaves):
        problems.append(f"{what}: eager has {len(a_leaves)} values, the program {len(b_leaves)}")
        return
    for x, y in zip(a_leaves, b_leaves):
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            x, y = x.detach(), y.detach()
            if x.layout != y.layout:
                problems.append(f"{what}: eager's layout {x.layout}, the program's {y.layout}")
                continue
            if x.layout != torch.strided:  # a sparse output (to_sparse): compared by its values
                x, y = x.to_dense(), y.to_dense()
            if x.shape != y.shape or x.dtype != y.dtype:
                problems.append(f"{what}: eager {tuple(x.shape)} {x.dtype}, program {tuple(y.shape)} {y.dtype}")
            elif not torch.allclose(x, y, rtol=rtol, atol=atol, equal_nan=True):
                diff = (x.double() - y.double()).abs().max().item()
                problems.append(f"{what}: values differ (max abs diff {diff:.3g})")
        elif (x is None) != (y is None) or (not isinstance(x, torch.Tensor) and x != y):
            problems.append(f"{what}: eager {x!r}, program {y!r}")


__all__ = ["copy_with_gradient_hooks", "verify_joint"]
