"""Trace a call of a custom ``torch.autograd.Function`` into one ``pf_autograd_function`` call.

Eager runs ``forward`` with grad off and remembers ``backward``; a plain trace
records forward's ops inline and the program's gradient becomes autograd of
the forward body (a straight-through estimator gets 0 instead of 1). Here,
while our trace runs, ``Function.apply`` is routed to :func:`trace_call`:

1. ``forward`` (or ``forward`` + ``setup_context``) is traced by our own
   pipeline into a functional subgraph, over fresh fake operands, with grad
   off as eager runs it. It returns the outputs, the operands it wrote
   without ``mark_dirty`` and every tensor the backward may read
   (``save_for_backward`` and tensors stashed on ``ctx``).
2. ``backward`` is traced the same way over those saved tensors and one
   gradient per tensor output, with a ``ctx`` that hands them back.
3. One HOP call goes into the caller's graph. A ``mark_dirty`` operand takes
   the output's value (as eager rebases it); an operand written without
   ``mark_dirty`` takes its new value under ``no_grad`` (eager's forward ran
   with grad off, so it keeps its autograd identity).

What cannot be carried is refused: a backward that reads tensor data
(``.item()``, data-dependent branches), symbolic values stashed on ``ctx``.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import Any, Protocol

import torch

from .. import _torch_compat as tc
from ..errors import Refusal, UnsupportedError, user_source_line
from .autograd_function import fresh_like as _fresh
from .autograd_function import pf_autograd_function
from .hooks import route_register_hook, route_requires_grad_


class TraceBody(Protocol):
    """How a body is traced into a functional subgraph: the driver's pipeline
    (``pipeline.TraceSettings.trace_body``), handed down through the trace."""

    def __call__(self, body: Callable[[list[Any], Any], list[Any]], inputs: list[Any], *,
                 grad_enabled: bool) -> torch.fx.GraphModule: ...


@dataclasses.dataclass(frozen=True)
class _Settings:
    trace_body: TraceBody
    pre_dispatch: bool


_active: list[_Settings] = []


@contextlib.contextmanager
def tracing_autograd_functions(trace_body: TraceBody, *, pre_dispatch: bool = True):
    """While active (and a trace is running), user Functions become HOP calls, and
    tensor hooks and ``requires_grad_()`` are recorded (``hooks.py``); their bodies
    are traced by ``trace_body``."""
    _active.append(_Settings(trace_body, pre_dispatch))
    try:
        if len(_active) > 1:
            yield
            return

        def register_hook(original, tensor, hook, *args):
            return route_register_hook(original, tensor, hook, *args, trace_call=trace_call,
                                       settings=_active[-1] if _active else None)

        with tc.patched_function_apply(_route), tc.dynamo_function_capture_refused(_refuse_in_hop_body), \
                tc.patched_tensor_methods(
                register_hook=register_hook, requires_grad_=route_requires_grad_):
            yield
    finally:
        _active.pop()


def _route(cls: type, original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    if _active and not _active[-1].pre_dispatch:
        raise UnsupportedError(
            f"autograd.Function {cls.__name__} with pre_dispatch=False: a program after autograd "
            "has no backward of its own, so the Function's backward would be replaced by autograd "
            "of its forward; export with pre_dispatch=True", kind=Refusal.AUTOGRAD_FUNCTION_AFTER_AUTOGRAD,
            op=f"{cls.__name__}.apply",
            source=user_source_line())
    if not _active or tc.current_proxy_tracer() is None:
        return original(*args, **kwargs)
    return trace_call(cls, args, kwargs, _active[-1])


def _refuse_in_hop_body(cls: type) -> None:
    raise UnsupportedError(
        f"autograd.Function {cls.__name__} is called inside the body of one of torch's "
        "higher-order ops (cond, map, scan, while_loop): torch captures such bodies with "
        "dynamo, which replaces the Function by its forward when no operand requires grad "
        "at capture, so its backward would be lost; call it outside the HOP and pass the "
        "result in", kind=Refusal.AUTOGRAD_FUNCTION_IN_HOP_BODY, op=f"{cls.__name__}.apply")


class TracingCtx:
    """Stands for ``ctx`` while forward and backward are traced.

    Holds what the user records (saved tensors, dirty and non-differentiable
    outputs, any attribute) so the backward trace can be handed the same.
    """

    _OWN = ("needs_input_grad", "to_save", "dirty_tensors", "non_differentiable",
            "materialize_grads", "_pf_saved")

    def __init__(self, needs_input_grad: tuple[bool, ...]):
        self.needs_input_grad = needs_input_grad
        self.to_save: tuple = ()
        self.dirty_tensors: tuple = ()
        self.non_differentiable: tuple = ()
        self.materialize_grads = True
        self._pf_saved: tuple = ()

    def save_for_backward(self, *tensors: Any) -> None:
        self.to_save = tensors

    def save_for_forward(self, *tensors: Any) -> None:
        pass  # forward-mode AD is not part of the program

    def mark_dirty(self, *tensors: Any) -> None:
        self.dirty_tensors = tensors

    def mark_non_differentiable(self, *tensors: Any) -> None:
        self.non_differentiable = tensors

    def set_materialize_grads(self, value: bool) -> None:
        self.materialize_grads = value

    @property
    def saved_tensors(self) -> tuple:
        return self._pf_saved

    saved_variables = saved_tensors

    def user_attributes(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if k not in self._OWN}


def _contains(group: tuple, t: Any) -> bool:
    return any(t is g for g in group)


def trace_call(cls: type, args: tuple, kwargs: dict, settings: _Settings) -> Any:
    """Record ``cls.apply(*args, **kwargs)`` as one ``pf_autograd_function`` call."""
    source = user_source_line()
    has_setup = tc.function_has_setup_context(cls)
    if has_setup:
        import inspect
        bound = inspect.signature(cls.forward).bind(*args, **kwargs)  # type: ignore[attr-defined]
        bound.apply_defaults()
        args, kwargs = tuple(bound.args), dict(bound.kwargs)
    flat, spec = tc.pytree.tree_flatten((args, kwargs))
    tensor_pos = [i for i, v in enumerate(flat) if isinstance(v, torch.Tensor)]
    operands = [flat[i] for i in tensor_pos]
    # operand index of each top-level positional tensor argument (eager differentiates only these)
    top_level: dict[int, int] = {}
    leaf = 0
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            top_level[i] = tensor_pos.index(leaf)
        leaf += len(tc.pytree.tree_leaves(a))
    needs = tuple(isinstance(a, torch.Tensor) and (a.is_floating_point() or a.is_complex()) for a in args)
    name = cls.__name__

    def fail(stage: str, exc: BaseException) -> UnsupportedError:
        return UnsupportedError(
            f"the {stage} of autograd.Function {name} cannot be traced into the program "
            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); a backward "
            "that reads tensor data (.item(), data-dependent branches) or state the program "
            "cannot carry is refused rather than replaced by autograd of the forward",
            kind=Refusal.AUTOGRAD_FUNCTION_NOT_TRACEABLE, op=f"{name}.{stage}", source=getattr(exc, "source", None) or source)

    inner = [tc.inner_of_functional(t) for t in operands]
    # --- forward -------------------------------------------------------------------
    fwd_info: dict[str, Any] = {}

    def forward_body(wrapped: list[Any], mode: Any) -> list[Any]:
        new_flat = list(flat)
        for pos, w in zip(tensor_pos, wrapped):
            new_flat[pos] = w
        a, k = tc.pytree.tree_unflatten(new_flat, spec)
        ctx = TracingCtx(needs)
        with tc.grad_mode_untraced(False):
            if has_setup:
                out = cls.forward(*a, **k)  # type: ignore[attr-defined]
                cls.setup_context(ctx, a, out)  # type: ignore[attr-defined]
            else:
                out = cls.forward(ctx, *a, **k)  # type: ignore[attr-defined]
        out_flat, out_spec = tc.pytree.tree_flatten(out)
        outs = [o for o in out_flat if isinstance(o, torch.Tensor)]
        dirty = {i: next(j for j, w in enumerate(wrapped) if w is o)
                 for i, o in enumerate(outs) if _contains(ctx.dirty_tensors, o)
                 and any(w is o for w in wrapped)}
        returned = {i: next(j for j, w in enumerate(wrapped) if w is o)
                    for i, o in enumerate(outs) if i not in dirty and any(w is o for w in wrapped)}
        mutated = [j for j, w in enumerate(wrapped)
                   if isinstance(w, tc.FunctionalTensor) and tc.has_data_mutation(w)]
        extra = [j for j in mutated if j not in dirty.values()]
        attrs = ctx.user_attributes()
        attr_flat, attr_spec = tc.pytree.tree_flatten(attrs)
        _refuse_symbolic_state(name, attr_flat, source)
        saved_slots = [s for s in ctx.to_save if isinstance(s, torch.Tensor)]
        saved_slots += [v for v in attr_flat if isinstance(v, torch.Tensor)]
        fwd_info.update(out_flat=out_flat, out_spec=out_spec, n_out=len(outs), dirty=dirty, extra=extra,
                        returned=returned,
                        to_save=[isinstance(s, torch.Tensor) for s in ctx.to_save],
                        to_save_values=[None if isinstance(s, torch.Tensor) else s for s in ctx.to_save],
                        attr_flat=[None if isinstance(v, torch.Tensor) else v for v in attr_flat],
                        attr_spec=attr_spec, materialize=ctx.materialize_grads,
                        non_diff=[i for i, o in enumerate(outs) if _contains(ctx.non_differentiable, o)
                                  or not (o.is_floating_point() or o.is_complex())])
        # an output that is an operand (not dirty) is a fresh value in a functional body;
        # the caller's graph makes it a view of the operand again (_reassemble)
        return outs + [wrapped[j] for j in extra] + saved_slots

    try:
        fwd_gm = settings.trace_body(forward_body, inner, grad_enabled=False)
    except UnsupportedError as exc:
        if exc.kind is not Refusal.DATA_DEPENDENT_BRANCH:  # a branch on data: the Function is untraceable
            raise
        raise fail("forward", exc) from exc
    except Exception as exc:
        raise fail("forward", exc) from exc
    n_out, extra = fwd_info["n_out"], fwd_info["extra"]
    n_results = n_out + len(extra)
    fwd_vals = _output_vals(fwd_gm)
    saved_vals = fwd_vals[n_results:]

    # --- backward ------------------------------------------------------------------
    grads_for: list[int] = []

    def backward_body(wrapped: list[Any], mode: Any) -> list[Any]:
        saved, grads = wrapped[:len(saved_vals)], list(wrapped[len(saved_vals):])
        ctx = TracingCtx(needs)
        it = iter(saved)
        ctx._pf_saved = tuple(next(it) if is_tensor else value  # noqa: SLF001 (our own tracing ctx)
                              for is_tensor, value in zip(fwd_info["to_save"], fwd_info["to_save_values"]))
        attr_flat = [next(it) if v is None else v for v in fwd_info["attr_flat"]]
        for key, value in tc.pytree.tree_unflatten(attr_flat, fwd_info["attr_spec"]).items():
            setattr(ctx, key, value)
        ctx.set_materialize_grads(fwd_info["materialize"])
        grad_args = _grads_as_eager_passes(grads, fwd_info)
        result = cls.backward(ctx, *grad_args)  # type: ignore[attr-defined]
        result = result if isinstance(result, tuple) else (result,)
        if len(result) < len(args):
            raise UnsupportedError(
                f"autograd.Function {name}.backward returned {len(result)} gradients for "
                f"{len(args)} inputs", kind=Refusal.AUTOGRAD_FUNCTION_NOT_TRACEABLE,
                op=f"{name}.backward", source=source)
        returned = []
        for i, j in top_level.items():
            grad = result[i]
            if grad is None:
                continue
            operand = wrapped_inputs[j]
            if tuple(grad.shape) != tuple(operand.shape):
                grad = grad.sum_to_size(operand.shape)  # autograd's validate_outputs
            if grad.dtype != operand.dtype:
                grad = grad.to(operand.dtype)
            grads_for.append(j)
            returned.append(grad)
        return returned

    _refuse_unmaterialized_grads(name, fwd_info, source)
    wrapped_inputs = inner
    grad_vals = [_fresh(v, contiguous=True) for v in fwd_vals[:n_out]]
    try:
        bwd_gm = settings.trace_body(backward_body, [_fresh(v) for v in saved_vals] + grad_vals,
                                     grad_enabled=True)
    except UnsupportedError as exc:
        if exc.kind is not Refusal.DATA_DEPENDENT_BRANCH:  # a branch on data: the Function is untraceable
            raise
        raise fail("backward", exc) from exc
    except Exception as exc:
        raise fail("backward", exc) from exc

    # --- the call in the caller's graph -------------------------------------------------
    non_diff = tuple(fwd_info["non_diff"]) + tuple(range(n_out, n_results))
    with tc.outside_trace():
        results = [_fresh(v) for v in fwd_vals]
    tc.record_hop_call(pf_autograd_function,
                       [("autograd_function_fwd", fwd_gm), ("autograd_function_bwd", bwd_gm)],
                       (name, n_out, n_results, non_diff, tuple(grads_for)), inner, results)
    wrapped_results = [tc.to_functional(r) for r in results[:n_results]]
    observe = getattr(tc.active_functional_mode(), "observe_opaque_call", None)
    if observe is not None:  # reads and results as an op's (a `.data` write must not slip past what it saved)
        observe(f"autograd.Function {name}", operands, wrapped_results, keeps_inputs=True,
                non_differentiable=non_diff)
    return _reassemble(wrapped_results, operands, fwd_info)


def retrace_call(fwd: Callable[..., Any], bwd: Callable[..., Any], constants: tuple,
                 operands: list[Any]) -> tuple | None:
    """A ``pf_autograd_function`` call met while our trace runs (re-exporting a program
    that holds one): both bodies traced again by our pipeline, recorded as the same
    call. None when no trace of ours is running (torch's rules then apply)."""
    if not _active or tc.current_proxy_tracer() is None:
        return None
    settings = _active[-1]
    _, n_outputs, n_results, _, _ = constants
    inner = [tc.inner_of_functional(t) for t in operands]
    fwd_gm = settings.trace_body(lambda wrapped, mode: list(fwd(*wrapped)), inner, grad_enabled=False)
    vals = _output_vals(fwd_gm)
    grads = [_fresh(v, contiguous=True) for v in vals[:n_outputs]]
    bwd_gm = settings.trace_body(lambda wrapped, mode: list(bwd(*wrapped)),
                                 [_fresh(v) for v in vals[n_results:]] + grads, grad_enabled=True)
    with tc.outside_trace():
        results = [_fresh(v) for v in vals]
    tc.record_hop_call(pf_autograd_function,
                       [("autograd_function_fwd", fwd_gm), ("autograd_function_bwd", bwd_gm)],
                       constants, inner, results)
    wrapped = [tc.to_functional(r) for r in results]
    observe = getattr(tc.active_functional_mode(), "observe_opaque_call", None)
    if observe is not None:  # results as an op's, as in the first trace
        observe(f"autograd.Function {constants[0]}", operands, wrapped, keeps_inputs=True,
                non_differentiable=constants[3])
    return tuple(wrapped)


def _grads_as_eager_passes(grads: list[Any], info: dict[str, Any]) -> list[Any]:
    """One argument per forward output: a gradient per tensor output, ``None`` for the
    others, and, after ``ctx.set_materialize_grads(False)``, ``None`` for the
    non-differentiable outputs (eager never defines their gradient)."""
    args: list[Any] = []
    g, k = iter(grads), 0
    for o in info["out_flat"]:
        if not isinstance(o, torch.Tensor):
            args.append(None)
            continue
        grad = next(g)
        args.append(None if not info["materialize"] and k in info["non_diff"] else grad)
        k += 1
    return args


def _refuse_unmaterialized_grads(name: str, info: dict[str, Any], source: str | None) -> None:
    """With ``set_materialize_grads(False)`` eager passes ``None`` for each output whose
    gradient the loss leaves undefined, which depends on code after the program: a
    backward traced once cannot hold every pattern when two outputs are differentiable."""
    differentiable = info["n_out"] - len(info["non_diff"])
    if not info["materialize"] and differentiable > 1:
        raise UnsupportedError(
            f"autograd.Function {name} calls ctx.set_materialize_grads(False) and has "
            f"{differentiable} differentiable outputs: its backward receives None for each "
            "output the loss does not use, which only the caller's later code decides; "
            "keep grads materialized (zeros), or mark all outputs but one non-differentiable",
            kind=Refusal.UNMATERIALIZED_GRADS, op=f"{name}.backward", source=source)


def _reassemble(results: list[Any], operands: list[Any], info: dict[str, Any]) -> Any:
    """The user's output structure over the HOP's results; operands written in forward take
    their new values (a ``mark_dirty`` one is the output itself, as in eager).

    An operand returned as-is is, in eager, a view of it whose gradient is the
    Function's: here a view of the operand (writes through either reach the
    other) whose reads, until one of them is written, are the HOP's result."""
    n_out = info["n_out"]
    outs = results[:n_out]
    for i, j in info["dirty"].items():
        operands[j].copy_(outs[i])
        outs[i] = operands[j]
    for i, j in info["returned"].items():
        view = operands[j].view_as(operands[j])
        tc.redirect_traced_tensor(tc.inner_of_functional(view),
                                  tc.proxy_node_of(tc.inner_of_functional(outs[i])))  # type: ignore[arg-type]
        outs[i] = view
    with torch.no_grad():
        for value, j in zip(results[n_out:], info["extra"]):
            operands[j].copy_(value)
    it = iter(outs)
    out_flat = [next(it) if isinstance(o, torch.Tensor) else o for o in info["out_flat"]]
    return tc.pytree.tree_unflatten(out_flat, info["out_spec"])


def _output_vals(gm: torch.fx.GraphModule) -> list[Any]:
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    return [a.meta["val"] if isinstance(a, torch.fx.Node) else a for a in out.args[0]]


def _refuse_symbolic_state(name: str, leaves: list[Any], source: str | None) -> None:
    for v in leaves:
        if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            raise UnsupportedError(
                f"autograd.Function {name} stores a symbolic value ({v}) on ctx; its backward "
                "would read a value the program does not carry: save it as a tensor with "
                "ctx.save_for_backward", kind=Refusal.AUTOGRAD_FUNCTION_NOT_TRACEABLE,
                op=f"{name}.forward", source=source)


__all__ = ["retrace_call", "trace_call", "tracing_autograd_functions"]
