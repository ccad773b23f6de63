"""Small fx helpers shared by the region pass, the verifier and the renderer."""

from __future__ import annotations

from typing import Iterator

import torch

from . import _torch_compat as tc


def calls_view_op(node: torch.fx.Node) -> bool:
    """``node`` calls an ATen view op on a node (its result aliases ``node.args[0]``)."""
    return (node.op == "call_function" and isinstance(node.target, tc.OpOverload)
            and node.target.is_view and bool(node.args) and isinstance(node.args[0], torch.fx.Node))


def all_graph_modules(gm: torch.fx.GraphModule, prefix: str = "") -> Iterator[tuple[str, torch.fx.GraphModule]]:
    """The graph and, recursively, every subgraph module it holds (region bodies)."""
    yield prefix or "<top>", gm
    for name, child in gm.named_children():
        if isinstance(child, torch.fx.GraphModule):
            yield from all_graph_modules(child, f"{prefix}.{name}" if prefix else name)
