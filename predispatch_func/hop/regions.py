"""Turn grad-mode / autocast marker nodes into regions (see package docstring)."""

from __future__ import annotations

import torch

from .. import _torch_compat as tc
from ..errors import UnsupportedError


def _is_marker(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and node.target in (
        tc.SET_GRAD_ENABLED, tc.ENTER_AUTOCAST, tc.EXIT_AUTOCAST)


def _changes_mode(node: torch.fx.Node, grad_enabled: bool) -> bool:
    if node.target is tc.SET_GRAD_ENABLED:
        return bool(node.args[0]) != grad_enabled
    if node.target is tc.ENTER_AUTOCAST:
        return bool(node.args[2]) if len(node.args) > 2 else True
    return False


def outline_regions(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Drop markers that change nothing; refuse the ones that do (for now)."""
    grad_enabled = True
    for node in list(gm.graph.nodes):
        if not _is_marker(node):
            continue
        if _changes_mode(node, grad_enabled):
            raise UnsupportedError(
                "the model changes grad mode or autocast; region export is not supported yet",
                op=node.target.__name__, source=node.meta.get("stack_trace", "").strip() or None)
        if node.target is tc.SET_GRAD_ENABLED:
            grad_enabled = bool(node.args[0])
    exits = [n for n in gm.graph.nodes if n.target is tc.EXIT_AUTOCAST]
    for node in exits + [n for n in gm.graph.nodes if _is_marker(n) and n not in exits]:
        gm.graph.erase_node(node)
    gm.recompile()
    return gm
