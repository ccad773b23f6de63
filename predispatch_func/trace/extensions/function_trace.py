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
import contextvars
import dataclasses
import inspect
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

import torch

from ... import _torch_compat as tc
from ...autograd_facts import may_carry_grad
from ...errors import Refusal, UnsupportedError, user_source_line
from ...mode_capabilities import TraceBody
from . import function_calls, function_reuse
from .autograd_function import pf_autograd_function
from .fakes import output_values
from .function_calls import FunctionTracing, backward_inputs, read_operands, record_call
from .function_ctx import TENSOR, SavedContext, TracingCtx, with_tensors, without_tensors
from .hooks import route_register_hook, route_requires_grad_

_T = TypeVar("_T")


@contextlib.contextmanager
def tracing_autograd_functions(trace_body: TraceBody, *, pre_dispatch: bool = True):
    """While active (and a trace is running), user Functions become HOP calls, and
    tensor hooks and ``requires_grad_()`` are recorded (``hooks.py``); their bodies
    are traced by ``trace_body``."""
    with function_calls.tracing(FunctionTracing(trace_body, pre_dispatch)) as outermost:
        if not outermost:
            yield
            return

        def register_hook(original, tensor, hook, *args):
            return route_register_hook(original, tensor, hook, *args, trace_call=trace_call,
                                       settings=function_calls.current())

        with function_reuse.reuse_within(), tc.patched_function_apply(_route), tc.dynamo_function_capture_refused(_refuse_in_hop_body), \
                tc.patched_tensor_methods(
                register_hook=register_hook, requires_grad_=route_requires_grad_):
            yield


def _route(cls: type, original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    settings = function_calls.current()
    if settings is not None and _steps_between_dtensor_and_shard(cls) and _DTENSOR_STEPS_INLINE.get() \
            and not settings.pre_dispatch:
        return cls.forward(_Unused(), *args, **kwargs)  # type: ignore[attr-defined]
    if settings is not None and _steps_between_dtensor_and_shard(cls):
        raise UnsupportedError(
            f"DTensor's {cls.__name__} (DTensor.from_local, to_local or redistribute; the input and output hooks "
            "of parallelize_module's plans call them) in forward: the trace records ops on a DTensor and cannot "
            "also record its local shard's (torch.export fails on it too); give the model DTensor inputs in the "
            "layouts its parameters need and let forward stay on DTensors (parameters placed with "
            "distribute_tensor, no input/output hooks), or take each rank's inference program over local "
            "shards with pf.distributed.export_local, which traces below DTensor",
            kind=Refusal.DTENSOR_BOUNDARY_IN_FORWARD, op=f"{cls.__name__}.apply", source=user_source_line())
    if settings is not None and cls is torch.utils.checkpoint.CheckpointFunction:
        return _reentrant_checkpoint_inlined(*args)
    if settings is not None and tc.is_module_backward_hook_function(cls):
        raise UnsupportedError(
            "a module's full backward hook (register_full_backward_hook or register_full_backward_pre_hook, "
            "or a global one) runs on this call: torch calls it from the autograd nodes around the module's "
            "inputs and outputs, which a program has no place for, so its gradients would differ from eager's "
            "(torch.export drops the hook). Remove the hook before exporting, or register a tensor hook in "
            "forward (out.register_hook(fn)), which the program carries",
            kind=Refusal.MODULE_BACKWARD_HOOK, op="Module.register_full_backward_hook", source=user_source_line())
    if settings is not None and not settings.pre_dispatch:
        raise UnsupportedError(
            f"autograd.Function {cls.__name__} with pre_dispatch=False: a program after autograd "
            "has no backward of its own, so the Function's backward would be replaced by autograd "
            "of its forward; export with pre_dispatch=True", kind=Refusal.AUTOGRAD_FUNCTION_AFTER_AUTOGRAD,
            op=f"{cls.__name__}.apply",
            source=user_source_line())
    if settings is None or tc.current_proxy_tracer() is None or tc.active_functional_mode() is None:
        # not tracing, or inside a HOP rule's own trace of a body below functionalization
        # (flex_attention's mask_mod indexing a captured tensor: torch's ModIndex): torch's Function
        return original(*args, **kwargs)
    return trace_call(cls, args, kwargs, settings)


def _reentrant_checkpoint_inlined(run_function: Callable[..., Any], preserve_rng_state: bool, *args: Any) -> Any:
    """``checkpoint(fn, *args, use_reentrant=True)`` (transformers' default for gradient
    checkpointing) as ``fn(*args)``, as the non-reentrant kind is inlined: eager runs ``fn`` under
    ``no_grad`` and again with grad in its backward, under the forward's RNG state, so values and
    gradients are ``fn``'s; the memory trade-off is not carried (docs/joint.md). As eager's, the
    outputs require grad only if a tensor argument does (else ``fn``'s parameters get no
    gradient). Without ``preserve_rng_state`` eager's recomputation draws other numbers than its
    forward: refused, as a program cannot draw both."""
    if not preserve_rng_state:
        raise UnsupportedError(
            "torch.utils.checkpoint(..., use_reentrant=True, preserve_rng_state=False): eager recomputes the "
            "function in its backward with other random numbers than its forward drew, which one program "
            "cannot do; keep preserve_rng_state=True (the default) or use use_reentrant=False",
            kind=Refusal.AUTOGRAD_FUNCTION_NOT_TRACEABLE, op="CheckpointFunction.apply", source=user_source_line())
    if any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
        return run_function(*args)
    with torch.no_grad():
        return run_function(*args)


_DTENSOR_STEPS_INLINE: contextvars.ContextVar[bool] = contextvars.ContextVar("dtensor_steps_inline", default=False)


@contextlib.contextmanager
def dtensor_steps_inline() -> Iterator[None]:
    """While active, a trace below autograd (``pre_dispatch=False``) runs DTensor's own Functions'
    ``forward`` as plain code: there each is only ops on the local shard (a view, a DTensor built
    around it, a redistribution's collectives), and the trace records those. Only for inference
    programs (``pf.distributed.export_local``): the Function's backward is not kept."""
    token = _DTENSOR_STEPS_INLINE.set(True)
    try:
        yield
    finally:
        _DTENSOR_STEPS_INLINE.reset(token)


class _Unused:
    """The ``ctx`` of a Function forward run inline: it keeps what backward would read, unread,
    and takes ctx's calls about the backward (``set_materialize_grads``, ``mark_*``) as no-ops."""

    def set_materialize_grads(self, value: bool) -> None:
        pass

    def mark_non_differentiable(self, *tensors: Any) -> None:
        pass

    def save_for_backward(self, *tensors: Any) -> None:
        pass


def _steps_between_dtensor_and_shard(cls: type) -> bool:
    """One of DTensor's own Functions (``_FromTorchTensor``, ``_ToTorchTensor``, ``Redistribute``):
    each unwraps a DTensor to its local shard or wraps a shard, inside its forward."""
    return cls.__module__.startswith("torch.distributed.tensor.")


def _refuse_in_hop_body(cls: type) -> None:
    raise UnsupportedError(
        f"autograd.Function {cls.__name__} is called inside the body of one of torch's "
        "higher-order ops (cond, map, scan, while_loop): torch captures such bodies with "
        "dynamo, which replaces the Function by its forward when no operand requires grad "
        "at capture, so its backward would be lost; call it outside the HOP and pass the "
        "result in", kind=Refusal.AUTOGRAD_FUNCTION_IN_HOP_BODY, op=f"{cls.__name__}.apply")


@dataclasses.dataclass(frozen=True)
class FunctionCall:
    """One ``cls.apply(*args, **kwargs)`` met while tracing: its operands (the tensor leaves
    of the arguments) and how to rebuild the arguments around traced stand-ins."""

    cls: type
    leaves: tuple  # the flat arguments
    spec: Any  # their pytree spec
    tensor_positions: tuple[int, ...]  # where in ``leaves`` the operands are
    top_level: dict[int, int]  # positional argument -> its operand (eager differentiates only these)
    needs_input_grad: tuple[bool, ...]
    n_args: int
    source: str | None

    @classmethod
    def bind(cls, function: type, args: tuple, kwargs: dict) -> FunctionCall:
        source = user_source_line()
        if tc.function_has_setup_context(function):  # forward(*args): apply's defaults are forward's
            bound = inspect.signature(function.forward).bind(*args, **kwargs)  # type: ignore[attr-defined]
            bound.apply_defaults()
            args, kwargs = tuple(bound.args), dict(bound.kwargs)
        flat, spec = tc.pytree.tree_flatten((args, kwargs))
        positions = tuple(i for i, v in enumerate(flat) if isinstance(v, torch.Tensor))
        top_level: dict[int, int] = {}
        leaf = 0
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                top_level[i] = positions.index(leaf)
            leaf += len(tc.pytree.tree_leaves(a))
        needs = tuple(may_carry_grad(a) for a in args)
        return cls(function, tuple(flat), spec, positions, top_level, needs, len(args), source)

    @property
    def name(self) -> str:
        return self.cls.__name__

    @property
    def operands(self) -> list[Any]:
        return [self.leaves[i] for i in self.tensor_positions]

    def arguments(self, operands: list[Any]) -> tuple[tuple, dict]:
        """The call's ``(args, kwargs)`` with ``operands`` in place of its tensors."""
        flat = list(self.leaves)
        for position, operand in zip(self.tensor_positions, operands):
            flat[position] = operand
        return tc.pytree.tree_unflatten(flat, self.spec)

    def failed(self, stage: str, exc: BaseException) -> UnsupportedError:
        return UnsupportedError(
            f"the {stage} of autograd.Function {self.name} cannot be traced into the program "
            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); a backward "
            "that reads tensor data (.item(), data-dependent branches) or state the program "
            "cannot carry is refused rather than replaced by autograd of the forward",
            kind=Refusal.AUTOGRAD_FUNCTION_NOT_TRACEABLE, op=f"{self.name}.{stage}",
            source=getattr(exc, "source", None) or self.source)


@dataclasses.dataclass(frozen=True)
class ForwardTrace:
    """What tracing a Function's forward learned. Made by :func:`_trace_forward`; read by
    the backward trace (saved context, which gradients eager passes), the recorded call
    (how many results) and :func:`_reassemble` (the user's output structure)."""

    out_leaves: tuple  # forward's flat output, tensors as TENSOR
    out_spec: Any
    n_out: int  # tensor outputs
    dirty: dict[int, int]  # output -> the operand it is (``mark_dirty``)
    returned: dict[int, int]  # output -> the operand it is (returned as-is, not dirty)
    written: tuple[int, ...]  # operands written without ``mark_dirty``: extra results
    non_differentiable: tuple[int, ...]  # outputs: marked, or not float
    saved: SavedContext
    graph: torch.fx.GraphModule | None = None
    values: tuple = ()  # the subgraph's results: outputs, written operands, saved tensors

    @property
    def n_results(self) -> int:
        return self.n_out + len(self.written)


class _Once(Generic[_T]):
    """What a body learns while it is traced, written once there and read after."""

    __slots__ = ("_value",)

    def set(self, value: _T) -> None:
        if hasattr(self, "_value"):
            raise RuntimeError("internal error: a Function's body was traced twice")
        self._value = value

    def get(self) -> _T:
        return self._value


def trace_call(cls: type, args: tuple, kwargs: dict, settings: FunctionTracing) -> Any:
    """Record ``cls.apply(*args, **kwargs)`` as one ``pf_autograd_function`` call."""
    call = FunctionCall.bind(cls, args, kwargs)
    inner = read_operands(call.operands)

    def trace() -> tuple[ForwardTrace, torch.fx.GraphModule, tuple[int, ...]]:
        forward = _traced_or_refused(call, "forward", lambda: _trace_forward(call, inner, settings))
        _refuse_unmaterialized_grads(call, forward)
        bwd_gm, grads_for = _traced_or_refused(call, "backward",
                                               lambda: _trace_backward(call, forward, inner, settings))
        return forward, bwd_gm, grads_for

    forward, bwd_gm, grads_for = function_reuse.reused_or_traced(
        cls, call.operands, call.needs_input_grad, call.leaves, call.spec, settings, trace,
        copied=_copied, graphs=lambda traced: [g for g in (traced[0].graph, traced[1]) if g is not None])
    non_diff = forward.non_differentiable + tuple(range(forward.n_out, forward.n_results))
    assert forward.graph is not None
    results = record_call(pf_autograd_function, (call.name, forward.n_out, forward.n_results, non_diff, grads_for),
                          forward.graph, bwd_gm, forward.values, call.operands, inner, exposed=forward.n_results)
    return _reassemble(results, call.operands, forward)


def _copied(traced: tuple[ForwardTrace, torch.fx.GraphModule, tuple[int, ...]]
            ) -> tuple[ForwardTrace, torch.fx.GraphModule, tuple[int, ...]]:
    """An earlier call's bodies for a call that reuses them: each HOP call owns its subgraphs."""
    forward, bwd_gm, grads_for = traced
    assert forward.graph is not None
    fwd_gm = function_reuse.copy_graph_module(forward.graph)
    return (dataclasses.replace(forward, graph=fwd_gm, values=tuple(output_values(fwd_gm))),
            function_reuse.copy_graph_module(bwd_gm), grads_for)


def _traced_or_refused(call: FunctionCall, stage: str, trace: Callable[[], _T]) -> _T:
    """``trace()``; a failure (or a branch on data) refuses the Function, naming ``stage``."""
    try:
        return trace()
    except UnsupportedError as exc:
        if exc.kind is not Refusal.DATA_DEPENDENT_BRANCH:  # a branch on data: the Function is untraceable
            raise
        raise call.failed(stage, exc) from exc
    except Exception as exc:
        raise call.failed(stage, exc) from exc


def _trace_forward(call: FunctionCall, inner: list[Any], settings: FunctionTracing) -> ForwardTrace:
    """Forward (grad off, as eager runs it) as a subgraph returning its tensor outputs, the
    operands it wrote without ``mark_dirty`` and every tensor the backward may read."""
    learned: _Once[ForwardTrace] = _Once()

    def forward_body(wrapped: list[Any], mode: Any) -> list[Any]:
        a, k = call.arguments(wrapped)
        ctx = TracingCtx(call.needs_input_grad)
        with tc.grad_mode_untraced(False):
            if tc.function_has_setup_context(call.cls):
                out = call.cls.forward(*a, **k)  # type: ignore[attr-defined]
                call.cls.setup_context(ctx, a, out)  # type: ignore[attr-defined]
            else:
                out = call.cls.forward(ctx, *a, **k)  # type: ignore[attr-defined]
        out_flat, out_spec = tc.pytree.tree_flatten(out)
        outs = [o for o in out_flat if isinstance(o, torch.Tensor)]
        dirty = {i: _index_of(o, wrapped) for i, o in enumerate(outs)
                 if _contains(ctx.dirty_tensors, o) and _contains(wrapped, o)}
        returned = {i: _index_of(o, wrapped) for i, o in enumerate(outs) if i not in dirty and _contains(wrapped, o)}
        written = tuple(j for j, w in enumerate(wrapped) if isinstance(w, tc.FunctionalTensor)
                        and tc.has_data_mutation(w) and j not in dirty.values())
        saved, saved_tensors = SavedContext.of(ctx, call.name, call.source)
        non_diff = tuple(i for i, o in enumerate(outs)
                         if _contains(ctx.non_differentiable, o) or not may_carry_grad(o))
        learned.set(ForwardTrace(without_tensors(out_flat), out_spec, len(outs), dirty, returned, written,
                                 non_diff, saved))
        # an output that is an operand (not dirty) is a fresh value in a functional body;
        # the caller's graph makes it a view of the operand again (_reassemble)
        return outs + [wrapped[j] for j in written] + saved_tensors

    gm = settings.trace_body(forward_body, inner, grad_enabled=False)
    return dataclasses.replace(learned.get(), graph=gm, values=tuple(output_values(gm)))


def _trace_backward(call: FunctionCall, forward: ForwardTrace, inner: list[Any], settings: FunctionTracing
                    ) -> tuple[torch.fx.GraphModule, tuple[int, ...]]:
    """Backward as a subgraph from the saved tensors and one gradient per tensor output
    to the gradients of the operands it returns one for (which, the second result)."""
    n_saved = len(forward.values) - forward.n_results
    grads_for: _Once[tuple[int, ...]] = _Once()

    def backward_body(wrapped: list[Any], mode: Any) -> list[Any]:
        ctx = forward.saved.replayed(call.needs_input_grad, wrapped[:n_saved])
        result = call.cls.backward(ctx, *_grads_as_eager_passes(wrapped[n_saved:], forward))  # type: ignore[attr-defined]
        result = result if isinstance(result, tuple) else (result,)
        if len(result) < call.n_args:
            raise UnsupportedError(
                f"autograd.Function {call.name}.backward returned {len(result)} gradients for "
                f"{call.n_args} inputs", kind=Refusal.AUTOGRAD_FUNCTION_NOT_TRACEABLE,
                op=f"{call.name}.backward", source=call.source)
        grads = {j: _as_operand_grad(result[i], inner[j]) for i, j in call.top_level.items() if result[i] is not None}
        grads_for.set(tuple(grads))
        return list(grads.values())

    gm = settings.trace_body(backward_body, backward_inputs(forward.values, forward.n_out, forward.n_results),
                             grad_enabled=True)
    return gm, grads_for.get()


def _as_operand_grad(grad: Any, operand: Any) -> Any:
    """``grad`` in its operand's shape and dtype, as autograd's ``validate_outputs`` makes it."""
    if tuple(grad.shape) != tuple(operand.shape):
        grad = grad.sum_to_size(operand.shape)
    if grad.dtype != operand.dtype:
        grad = grad.to(operand.dtype)
    return grad


def _grads_as_eager_passes(grads: list[Any], forward: ForwardTrace) -> list[Any]:
    """One argument per forward output: a gradient per tensor output, ``None`` for the
    others, and, after ``ctx.set_materialize_grads(False)``, ``None`` for the
    non-differentiable outputs (eager never defines their gradient)."""
    args: list[Any] = []
    g, k = iter(grads), 0
    for o in forward.out_leaves:
        if o is not TENSOR:
            args.append(None)
            continue
        grad = next(g)
        args.append(None if not forward.saved.materialize_grads and k in forward.non_differentiable else grad)
        k += 1
    return args


def _refuse_unmaterialized_grads(call: FunctionCall, forward: ForwardTrace) -> None:
    """With ``set_materialize_grads(False)`` eager passes ``None`` for each output whose
    gradient the loss leaves undefined, which depends on code after the program: a
    backward traced once cannot hold every pattern when two outputs are differentiable."""
    differentiable = forward.n_out - len(forward.non_differentiable)
    if not forward.saved.materialize_grads and differentiable > 1:
        raise UnsupportedError(
            f"autograd.Function {call.name} calls ctx.set_materialize_grads(False) and has "
            f"{differentiable} differentiable outputs: its backward receives None for each "
            "output the loss does not use, which only the caller's later code decides; "
            "keep grads materialized (zeros), or mark all outputs but one non-differentiable",
            kind=Refusal.UNMATERIALIZED_GRADS, op=f"{call.name}.backward", source=call.source)


def _reassemble(results: list[Any], operands: list[Any], forward: ForwardTrace) -> Any:
    """The user's output structure over the HOP's results; operands written in forward take
    their new values (a ``mark_dirty`` one is the output itself, as in eager).

    An operand returned as-is is, in eager, a view of it whose gradient is the
    Function's: here a view of the operand (writes through either reach the
    other) whose reads, until one of them is written, are the HOP's result."""
    outs = results[:forward.n_out]
    for i, j in forward.dirty.items():
        operands[j].copy_(outs[i])
        outs[i] = operands[j]
    for i, j in forward.returned.items():
        view = operands[j].view_as(operands[j])
        tc.redirect_traced_tensor(tc.inner_of_functional(view),
                                  tc.proxy_node_of(tc.inner_of_functional(outs[i])))  # type: ignore[arg-type]
        outs[i] = view
    with torch.no_grad():
        for value, j in zip(results[forward.n_out:], forward.written):
            operands[j].copy_(value)
    out_flat = with_tensors(forward.out_leaves, iter(outs))
    return tc.pytree.tree_unflatten(out_flat, forward.out_spec)


def _contains(group: Any, t: Any) -> bool:
    return any(t is g for g in group)


def _index_of(t: Any, group: list[Any]) -> int:
    return next(j for j, g in enumerate(group) if g is t)


__all__ = ["ForwardTrace", "FunctionCall", "trace_call", "tracing_autograd_functions"]
