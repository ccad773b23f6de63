"""A custom Function's body, traced into its own graph inside the trace, keeps the node
metadata the program's own nodes get: the user's line and the torch call that made the node
(the body's trace hides the caller's other torch-function modes: trace/environment.py). The
backward's nodes name the line that called the Function, where eager's autograd records it."""

from __future__ import annotations

import torch

from tests.support.reference import export_checked


class _Double(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.mul(2)  # the forward's line

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad.mul(2) + x.sin() * 0


class _Model(torch.nn.Module):
    def forward(self, x):
        return _Double.apply(x).cos()  # the call's line


def _body(ep: torch.export.ExportedProgram, name: str) -> torch.fx.GraphModule:
    return next(m for n, m in ep.graph_module.named_modules() if n.startswith(name))


def test_body_nodes_name_the_users_line_and_torch_call():
    ep = export_checked(_Model(), (torch.randn(3, requires_grad=True),))  # replayed against eager, gradients too
    for body, line in (("autograd_function_fwd", "the forward's line"), ("autograd_function_bwd", "the call's line")):
        ops = [n for n in _body(ep, body).graph.nodes if n.op == "call_function" and n.target is torch.ops.aten.mul.Tensor]
        assert ops, body
        for node in ops:
            assert line in (node.meta.get("stack_trace") or ""), (body, node.meta.get("stack_trace"))
            assert node.meta.get("torch_fn", (None, ""))[1].endswith("mul"), (body, node.meta.get("torch_fn"))
