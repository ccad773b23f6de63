"""The region stage of the pipeline: markers in, region HOP calls out.

``assign_frames`` (frames.py) reads the markers; ``outline_level``
(outline.py) turns each frame into a HOP call and recurses into its body.
"""

from __future__ import annotations

import torch

from .frames import assign_frames, is_marker
from .outline import FLAT, FLAT_ORDER, outline_level
from ..graphs import all_graph_modules, graph_pass


@graph_pass
def outline_regions(gm: torch.fx.GraphModule,
                    identity_edges: dict[torch.fx.Node, torch.fx.Node] | None = None
                    ) -> torch.fx.GraphModule:
    """Replace grad/autocast markers in ``gm`` by nested region HOP calls.

    ``identity_edges`` maps a node to the node whose autograd identity it
    keeps (the tensor's value before an in-place op done with grad off).
    """
    frames_of = assign_frames(gm.graph)
    order = {node: i for i, node in enumerate(gm.graph.nodes)}
    for node in gm.graph.nodes:
        node.meta[FLAT] = node
        node.meta[FLAT_ORDER] = order
    markers = [n for n in gm.graph.nodes if is_marker(n)]
    for node in reversed(markers):  # exits before the enters they read
        gm.graph.erase_node(node)
    outline_level(gm, frames_of, identity_edges or {})
    for _, sub in all_graph_modules(gm):
        for node in sub.graph.nodes:
            node.meta.pop(FLAT, None)
            node.meta.pop(FLAT_ORDER, None)
    return gm
