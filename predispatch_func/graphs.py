"""Small fx helpers shared by the region pass, the verifier and the renderer."""

from __future__ import annotations

from typing import Iterator

import torch


def all_graph_modules(gm: torch.fx.GraphModule, prefix: str = "") -> Iterator[tuple[str, torch.fx.GraphModule]]:
    """The graph and, recursively, every subgraph module it holds (region bodies)."""
    yield prefix or "<top>", gm
    for name, child in gm.named_children():
        if isinstance(child, torch.fx.GraphModule):
            yield from all_graph_modules(child, f"{prefix}.{name}" if prefix else name)
