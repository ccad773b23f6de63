"""``Tensor.register_hook`` and ``requires_grad_()`` inside a traced forward.

Neither reaches the dispatcher, so a plain trace drops them. While our trace
runs, both are routed here:

* ``y.register_hook(h)`` becomes a ``pf_autograd_function`` call whose forward
  is the identity and whose backward is ``h`` traced into a subgraph. It is
  placed right after ``y`` is computed and every use of ``y`` (before and
  after the registration) reads it: eager's hook sees ``y``'s whole gradient.
  A hook that returns ``None`` only has side effects, which the program cannot
  carry: refused. So is removing the hook inside forward.
* ``v.requires_grad_()`` becomes ``pf_require_grad(v)``: ``v`` itself when it
  already requires grad, else a new leaf that does (eager's flag). On a graph
  input, ``requires_grad_(False)`` would change the caller's tensor: refused;
  on anything else it is ``detach``.
"""

from __future__ import annotations

from typing import Any

import torch

from ... import _torch_compat as tc
from ...autograd_facts import may_carry_grad
from ...errors import Refusal, UnsupportedError, user_source_line
from .autograd_function import pf_autograd_function
from .fakes import fresh_like


def _traced(t: Any) -> bool:
    return isinstance(t, tc.FunctionalTensor) and tc.current_proxy_tracer() is not None


class _HookHandle:
    def remove(self) -> None:
        raise UnsupportedError(
            "a tensor hook registered and removed inside forward never runs in eager; the "
            "program cannot express a hook removed before backward", kind=Refusal.TENSOR_HOOK_NOT_EXPRESSIBLE,
            op="RemovableHandle.remove",
            source=user_source_line())


def route_register_hook(original, tensor, hook, *args, trace_call=None, settings=None):
    """``tensor.register_hook(hook)`` while tracing (see the module docstring)."""
    if not _traced(tensor) or trace_call is None:
        return original(tensor, hook, *args)
    source = user_source_line()
    before = tc.proxy_node_of(tc.inner_of_functional(tensor))

    class TensorHook(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad):
            result = hook(grad)
            if result is None:
                raise UnsupportedError(
                    "a tensor hook that returns None only has side effects (logging, storing "
                    "gradients), which a program cannot carry; return the gradient to keep "
                    "the hook, or register it on the exported module's output instead",
                    kind=Refusal.TENSOR_HOOK_NOT_EXPRESSIBLE, op="Tensor.register_hook", source=source)
            return result

    TensorHook.__name__ = f"hook_{getattr(hook, '__name__', 'fn')}".replace("<", "").replace(">", "")
    trace_call(TensorHook, (tensor,), {}, settings)
    call = _last_hop_call()
    if before is not None and call is not None:
        _move_after(before, call)
    return _HookHandle()


def _last_hop_call() -> torch.fx.Node | None:
    graph = tc.current_proxy_tracer().graph
    return next((n for n in reversed(graph.nodes) if n.target is pf_autograd_function), None)


def _move_after(value: torch.fx.Node, call: torch.fx.Node) -> None:
    """Place the hook ``call`` (its subgraph refs and its result) right after ``value``
    and make every other reader of ``value``, and later ops, read its result."""
    item = next(iter(call.users))
    refs = [a for a in call.args if isinstance(a, torch.fx.Node) and a.op == "get_attr"]
    anchor = value
    if value.op == "placeholder":
        anchor = [n for n in value.graph.nodes if n.op == "placeholder"][-1]
    for node in [*refs, call, item]:
        anchor.append(node)
        anchor = node
    value.replace_all_uses_with(item, delete_user_cb=lambda user: user is not call)
    tc.redirect_traced_tensor(_inner_for(value), item)


def _inner_for(node: torch.fx.Node) -> Any:
    tracer = tc.current_proxy_tracer()
    for t, slot in list(tracer.tensor_tracker.items()):
        if slot.proxy.node is node:
            return t
    return None


class RequireGrad(tc.HigherOrderOperator):
    """``v`` if it requires grad, else a new leaf of its value that does."""

    def __init__(self) -> None:
        super().__init__("pf_require_grad")

    def __call__(self, value: torch.Tensor) -> torch.Tensor:
        if _traced(value):  # re-exporting a program that holds this call
            return tc.to_functional(_record_require_grad(value)[1])
        return super().__call__(value)


pf_require_grad = RequireGrad()


# torch's tracers (run_decompositions, torch.export.export of ep.module()) keep the call


@pf_require_grad.py_impl(tc.HopRules.AUTOGRAD)
def _require_grad_autograd(value: torch.Tensor) -> torch.Tensor:
    if value.requires_grad:
        return value
    with tc.below_autograd():
        leaf = pf_require_grad(value)
    return leaf.requires_grad_(True)


@pf_require_grad.py_impl(tc.HopRules.DENSE)
def _require_grad_dense(value: torch.Tensor) -> torch.Tensor:
    return value.detach()


@pf_require_grad.py_impl(tc.FakeTensorMode)
def _require_grad_fake(mode: Any, value: torch.Tensor) -> torch.Tensor:
    with mode:
        return value.detach()


@pf_require_grad.py_functionalize_impl
def _require_grad_functional(ctx: Any, value: torch.Tensor) -> torch.Tensor:
    unwrapped = ctx.unwrap_tensors(value)
    with ctx.redispatch_to_next():
        out = pf_require_grad(unwrapped)
    return ctx.wrap_tensors(out)


@pf_require_grad.py_impl(tc.HopRules.proxy_mode_type())
def _require_grad_proxy(mode: Any, value: torch.Tensor) -> torch.Tensor:
    result = fresh_like(value)
    tc.record_hop_call(pf_require_grad, [], (), [value], [result], single=True, tracer=mode.tracer)
    return result


def _record_require_grad(value: Any) -> Any:
    inner = tc.inner_of_functional(value)
    fake_mode = tc.fake_mode_of([inner])
    with tc.outside_trace(), fake_mode:
        result = torch.empty_strided(inner.shape, inner.stride(), dtype=inner.dtype, device=inner.device)
    node = tc.record_hop_call(pf_require_grad, [], (), [inner], [result], single=True)
    return node, result


def route_requires_grad_(original, tensor, requires_grad: bool = True):
    """``tensor.requires_grad_(flag)`` while tracing (see the module docstring)."""
    if not _traced(tensor):
        return original(tensor, requires_grad)
    inner = tc.inner_of_functional(tensor)
    node = tc.proxy_node_of(inner)
    if not requires_grad:
        if node is not None and node.op == "placeholder":
            raise UnsupportedError(
                "requires_grad_(False) on a parameter, buffer or input inside forward changes "
                "the caller's tensor, which a program cannot do; use .detach()",
                kind=Refusal.REQUIRES_GRAD_OFF_ON_INPUT, op="Tensor.requires_grad_", source=user_source_line())
        detached = tensor.detach()
        tc.redirect_traced_tensor(inner, tc.proxy_node_of(tc.inner_of_functional(detached)))  # type: ignore[arg-type]
        return tensor
    if not may_carry_grad(tensor):
        return original(tensor, requires_grad)  # eager raises: only float tensors can
    hop_node, _ = _record_require_grad(tensor)
    item = hop_node
    tc.redirect_traced_tensor(inner, item)
    return tensor
