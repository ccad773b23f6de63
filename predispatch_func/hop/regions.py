"""The region stage of the pipeline: markers in, region HOP calls out.

``assign_frames`` (frames.py) reads the markers; an ``Outliner``
(outline.py) turns each frame into a HOP call and recurses into its body.
"""

from __future__ import annotations

import torch

from ..graphs import graph_pass
from .frames import assign_frames, is_marker
from .outline import Outliner


@graph_pass
def outline_regions(gm: torch.fx.GraphModule,
                    identity_edges: dict[torch.fx.Node, torch.fx.Node] | None = None
                    ) -> torch.fx.GraphModule:
    """Replace grad/autocast markers in ``gm`` by nested region HOP calls.

    ``identity_edges`` maps a node to the node whose autograd identity it
    keeps (the tensor's value before an in-place op done with grad off).
    """
    frames_of = assign_frames(gm.graph)
    outliner = Outliner(gm, frames_of, identity_edges or {})
    markers = [n for n in gm.graph.nodes if is_marker(n)]
    for node in reversed(markers):  # exits before the enters they read
        gm.graph.erase_node(node)
    outliner.outline(gm)
    return gm
