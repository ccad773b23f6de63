"""Forward program -> joint graph: the forward replayed above autograd, then the backward
autograd runs on it, both recorded in one flat graph.

Takes the functional forward graph of ``export`` (regions as HOP calls, kept composites
as single nodes, mutations as outputs) and returns a graph over the same placeholders
whose outputs are the forward's, then one gradient per input asked for (None where the
loss does not reach it). The forward is replayed node by node under
``make_fx(pre_dispatch=True)``, which records ops above autograd: a kept composite stays
one node, a region HOP is entered as its grad/autocast mode (recorded as markers that
``regions.outline_regions`` outlines again). No functionalization is needed: the forward is
functional and backward ops are too. ``torch.autograd.grad`` then runs eager's autograd
engine on the fakes; the proxy mode records each backward op it dispatches
(``native_layer_norm_backward``, ``gelu_backward``, ...), with saved tensors mapped to
graph values by :mod:`.saved_values`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .. import _torch_compat as tc
from ..errors import user_line_of_recorded
from ..regions.ops import _carry, is_a_leaf_carried, pf_autocast_region, pf_grad_region
from ..trace.extensions.fakes import fresh_like
from .errors import JointError, JointProblem
from .extensions import replay_extension
from .saved_values import ForwardCall, SavedValues
from .step_meta import ForwardOrigins, attributed_backward, marked_as_the_update, stamped

_WHILE_LOOP = torch.ops.higher_order.while_loop
_SCAN = torch.ops.higher_order.scan


@dataclasses.dataclass(frozen=True)
class JointTrace:
    """The flat joint graph (region markers not yet outlined) and what it returns."""

    graph_module: torch.fx.GraphModule
    n_forward_outputs: int
    grad_of: tuple[int, ...]  # placeholder index of each gradient output, in output order
    recomputed: tuple[str, ...]  # forward calls the backward recomputes (saved_values.py)
    n_writes: int = 0  # values ``after_backward`` wrote, returned after the forward's mutations


# (forward inputs, gradient by input index, extra inputs) -> new values to write
AfterBackward = Callable[[Sequence[Any], dict[int, Any], Sequence[Any]], list[Any]]


class _ForwardReplay(torch.fx.Interpreter):
    """Runs the forward graph's nodes as calls the trace records; a region HOP is entered
    as its mode and its body replayed inline; each call is announced to ``saved``."""

    def __init__(self, gm: torch.fx.GraphModule, saved: SavedValues, tracer: Any, origins: ForwardOrigins):
        super().__init__(gm, garbage_collect_values=False)
        self._saved = saved
        self._tracer = tracer
        self._origins = origins
        self._node: torch.fx.Node | None = None

    def run_node(self, n: torch.fx.Node) -> Any:
        if n.op != "call_function":
            return super().run_node(n)
        self._node = n
        with stamped(n, self._tracer.graph), self._origins.replaying(n):
            return super().run_node(n)

    def call_function(self, target: Any, args: tuple, kwargs: dict) -> Any:
        if target is pf_grad_region:
            enabled, identity_of, body, *operands = args
            with torch.set_grad_enabled(enabled):
                outs = tuple(_ForwardReplay(body, self._saved, self._tracer, self._origins).run(*operands))
            return _carry(tuple(operands), outs, tuple(identity_of))
        if target is pf_autocast_region:
            device, dtype, enabled, cache, identity_of, body, *operands = args
            with torch.autocast(device, dtype, enabled, cache):
                outs = tuple(_ForwardReplay(body, self._saved, self._tracer, self._origins).run(*operands))
            return _carry(tuple(operands), outs, tuple(identity_of))
        replayed, result = replay_extension(target, args)
        if replayed:
            return result
        if target is _WHILE_LOOP:
            # torch's while_loop keeps its per-iteration values on its autograd ctx, computed below
            # the recorder the trace dispatches it to: its own autograd kernel runs the
            # Function here, so they are recorded (one ``while_loop_stack_output`` node)
            kernel = tc.hop_autograd_kernel(target)
            if kernel is not None:
                return kernel(*args, **kwargs)
        if target is _SCAN and any(isinstance(t, torch.Tensor) and t.requires_grad
                                   for t in tc.pytree.tree_leaves(args[1:])):
            # torch's pre-dispatch recorder of scan runs no autograd: its own autograd kernel runs
            # here (a forward scan saving each step's values, a backward scan over them), its body's
            # joint graph traced apart from this trace (tc.hop_joint_graphs_traced_apart says why)
            kernel = tc.hop_autograd_kernel(target)
            if kernel is None:
                raise JointError(
                    f"export_joint: `scan` with an operand that requires grad ({_where(self._node)}): this "
                    "torch's scan has no autograd kernel. Write the loop in Python (it unrolls), or train "
                    "this model eagerly (ep.module() of pf.export trains it)", kind=JointProblem.UNSUPPORTED_HOP)
            with tc.hop_joint_graphs_traced_apart():
                return kernel(*args, **kwargs)
        self._saved.call = ForwardCall(lambda: target(*args, **kwargs), where=_where(self._node), op=target,
                                       args=args)
        try:
            return target(*args, **kwargs)
        finally:
            self._saved.call = None


def _where(node: torch.fx.Node | None) -> str:
    """The forward node and the user's line that made it, for errors."""
    if node is None:
        return "the forward"
    line = user_line_of_recorded(node.meta.get("stack_trace"))
    target = node.target if isinstance(node.target, str) or hasattr(node.target, "overloadpacket") \
        else getattr(node.target, "__name__", node.target)  # operator.getitem: "getitem", not its repr
    return f"`{node.name}` ({target})" + (f" at {line}" if line else "")


def trace_joint(forward: torch.fx.GraphModule, inputs: Sequence[Any], *, loss_index: int,
                wants_grad: Sequence[bool], decompositions: dict | None = None, n_mutations: int = 0,
                extra_inputs: Sequence[Any] = (), after_backward: AfterBackward | None = None,
                clip_gradients: Callable[[dict[int, Any]], dict[int, Any]] | None = None,
                gradient_hooks: dict[int, list[Callable[..., Any]]] | None = None,
                state_writes: dict[int, str] | None = None,
                read_after_hidden_writes: dict[int, int] | None = None,
                written_inputs: dict[int, int] | None = None) -> JointTrace:
    """Trace ``forward`` (over ``inputs``, fakes) and the gradients of its output ``loss_index``
    with respect to each input flagged in ``wants_grad``.

    ``clip_gradients`` maps the gradients (by input index) to the ones the program returns and the
    update reads (``clip_grad_norm``). ``after_backward`` (an optimizer step, optimizer.py) runs after the backward, over the
    gradients and ``extra_inputs`` (placeholders after the forward's; the caller moves them);
    the values it returns are outputs right after the forward's ``n_mutations`` mutations.
    ``gradient_hooks``: per input index, the hooks the user registered on that leaf
    (``p.register_hook``); they run on its gradient in the trace, as eager's engine runs them.
    ``state_writes``: the forward's mutation outputs that write buffers or the caller's inputs
    (index -> what, for the error). ``read_after_hidden_writes``: input index -> the forward output
    of its final value, for inputs written only through ``.data``: what autograd saved of them
    reads that value, as eager's backward reads the storage the write changed.
    ``written_inputs``: input index -> the forward output of its final value, for every input the
    forward writes: ``after_backward`` (the optimizer) starts from that value, as eager's step
    updates the parameter the forward left (a weight clamped in forward)."""
    state: dict[str, Any] = {}
    n_forward_outputs = len(next(n for n in reversed(forward.graph.nodes) if n.op == "output").args[0])
    asked = [i for i, w in enumerate(wants_grad) if w]

    def joint(*everything: Any) -> tuple:
        flat, extras = everything[:len(inputs)], everything[len(inputs):]
        mode = tc.pre_dispatch_proxy_mode()
        saved = SavedValues(mode)
        origins = ForwardOrigins()
        with saved.hooks():
            outs = _ForwardReplay(forward, saved, mode.tracer, origins).run(*flat)
        saved.read_at_final_value([(flat[i], outs[m]) for i, m in (read_after_hidden_writes or {}).items()])
        loss = outs[loss_index]
        _check_loss(forward, loss, loss_index)
        _check_state_writes(forward, outs, state_writes or {})
        with tc.untracked_arguments_resolved(mode, saved.resolve), \
                attributed_backward([loss.grad_fn], origins, mode.tracer.graph):
            grads: tuple[Any, ...] = torch.autograd.grad(loss, [flat[i] for i in asked], allow_unused=True)
        if clip_gradients is not None:  # after the engine (and the leaves' hooks), before the step
            with marked_as_the_update(mode.tracer.graph):
                clipped = clip_gradients({i: g for i, g in zip(asked, grads) if g is not None})
            grads = tuple(clipped.get(i) for i in asked)
        state["grad_of"] = tuple(i for i, g in zip(asked, grads) if g is not None)
        state["recomputed"] = tuple(saved.recomputed_calls)
        writes = []
        if after_backward is not None:
            after_forward = list(flat)
            for i, m in (written_inputs or {}).items():
                after_forward[i] = outs[m]
            with marked_as_the_update(mode.tracer.graph):
                writes = after_backward(after_forward, {i: g for i, g in zip(asked, grads) if g is not None},
                                        extras)
        state["n_writes"] = len(writes)
        return (*outs[:n_mutations], *writes, *outs[n_mutations:], *(g for g in grads if g is not None))

    fake_mode = tc.fake_mode_of([t for t in inputs if isinstance(t, torch.Tensor)])
    fresh = [fresh_like(t).requires_grad_(w) if isinstance(t, torch.Tensor) else t
             for t, w in zip(inputs, wants_grad)]
    for index, hooks in (gradient_hooks or {}).items():
        for hook in hooks:
            fresh[index].register_hook(hook)
    # no stack traces recorded: a forward node takes its forward node's (step_meta.stamped); a backward
    # node's would point into autograd and this module, and extracting them was half the trace
    tracer = tc.make_fx(joint, decomposition_table=decompositions or {}, tracing_mode="real", pre_dispatch=True,
                        record_stack_traces=False)
    # speed, as the forward trace (trace/environment.py says what each does)
    with fake_mode, tc.pre_dispatch_pushes_without_uncache(), tc.lazy_graph_modules(), tc.rnn_decompositions_as_eager(), \
            tc.tensor_metadata_recorded_through(tc.static_tensor_metadata), \
            tc.op_calls_recorded_through(tc.record_op_call):
        gm = tracer(*fresh, *(fake_mode.from_tensor(t) for t in extra_inputs))
    return JointTrace(gm, n_forward_outputs, state["grad_of"], state["recomputed"], state["n_writes"])


def _check_state_writes(forward: torch.fx.GraphModule, outs: Sequence[Any], state_writes: dict[int, str]) -> None:
    """A buffer or an input written with a value that requires grad keeps this step's autograd
    history in eager: the next step's backward runs through it into this step's graph and adds
    to the gradients again (a running statistic updated outside ``no_grad``), and the caller's
    input comes back requiring grad. A program's step writes back plain values, so it would
    silently differ from the second step on: refused."""
    output = next(n for n in reversed(forward.graph.nodes) if n.op == "output").args[0]
    for index, what in state_writes.items():
        value = outs[index]
        if isinstance(value, torch.Tensor) and value.requires_grad and not is_a_leaf_carried(value):
            node = output[index] if isinstance(output[index], torch.fx.Node) else None
            raise JointError(
                f"export_joint: {what} is written with a value that requires grad (made by {_where(node)}): in "
                "eager it keeps this step's autograd history, so the next step's backward runs into this "
                "step's graph and its gradients differ from a fresh step's, which is what a training program "
                "computes. Write it under torch.no_grad() or write a detach()-ed value (as BatchNorm updates "
                "its running statistics)", kind=JointProblem.STATE_WRITTEN_WITH_HISTORY)


def _check_loss(forward: torch.fx.GraphModule, loss: Any, index: int) -> None:
    output = next(n for n in reversed(forward.graph.nodes) if n.op == "output").args[0]
    node = output[index] if index < len(output) else None
    line = _where(node) if isinstance(node, torch.fx.Node) else "the model's output"
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.dtype.is_floating_point:
        met = (f"a tensor of shape {tuple(loss.shape)} and dtype {loss.dtype}" if isinstance(loss, torch.Tensor)
               else f"{type(loss).__name__} {loss!r}")
        raise JointError(
            f"export_joint needs a scalar floating-point loss (the model's first output, or loss_fn's result); "
            f"met {met}, made by {line}. Return the loss first (e.g. `return loss, logits`), reduce it "
            "(`.mean()`/`.sum()`), or pass loss_fn=", kind=JointProblem.NO_SCALAR_LOSS)
    if not loss.requires_grad:
        raise JointError(
            f"export_joint: the loss does not require grad (no parameter or input that requires grad reaches "
            f"it; made by {line}): nothing to differentiate. Check requires_grad of the parameters, or a "
            "no_grad/detach on the way to the loss", kind=JointProblem.LOSS_WITHOUT_GRAD)
