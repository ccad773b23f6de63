"""The region stage of the pipeline: markers in, region HOP calls out.

``assign_frames`` (frames.py) reads the markers; an ``Outliner``
(outline.py) turns each frame into a HOP call and recurses into its body.
The bodies of torch's HOPs (``cond`` branches, ``while_loop`` bodies, ...)
are outlined the same way first, each under the grad mode of its call.
"""

from __future__ import annotations

import torch

from .. import _torch_compat as tc
from ..graphs import graph_pass
from .frames import assign_frames, is_marker
from .ops import REGION_HOPS
from .outline import Outliner


@graph_pass
def outline_regions(gm: torch.fx.GraphModule,
                    identity_edges: dict[torch.fx.Node, torch.fx.Node] | None = None,
                    *, grad_enabled: bool = True,
                    grad_sources: set[torch.fx.Node] | None = None) -> torch.fx.GraphModule:
    """Replace grad/autocast markers in ``gm`` by nested region HOP calls.

    ``identity_edges`` maps a node to the node whose autograd identity it
    keeps (the tensor's value before an in-place op done with grad off).
    ``grad_enabled`` is the grad mode ``gm`` runs under. ``grad_sources`` (the
    placeholders that may require grad) lets the outliner refuse an identity
    it cannot carry (see ``Outliner``).
    """
    frames_of = assign_frames(gm.graph, grad_enabled)
    _outline_hop_bodies(gm, frames_of, identity_edges or {}, grad_enabled)
    outliner = Outliner(gm, frames_of, identity_edges or {}, grad_sources)
    markers = [n for n in gm.graph.nodes if is_marker(n)]
    for node in reversed(markers):  # exits before the enters they read
        gm.graph.erase_node(node)
    outliner.outline(gm, grad_enabled=grad_enabled)
    return gm


def _outline_hop_bodies(gm: torch.fx.GraphModule, frames_of, identity_edges, grad_enabled: bool) -> None:
    """Outline the regions inside the subgraphs that torch's HOP calls of ``gm`` take."""
    for node in gm.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, tc.HigherOrderOperator) \
                or node.target in REGION_HOPS:
            continue
        grad_here = grad_enabled
        for frame in frames_of.get(node, ()):
            grad_here = frame.grad_inside(grad_here)
        for ref in node.all_input_nodes:
            body = getattr(gm, str(ref.target), None) if ref.op == "get_attr" else None
            if isinstance(body, torch.fx.GraphModule) and any(is_marker(n) for n in body.graph.nodes):
                outline_regions(body, identity_edges, grad_enabled=grad_here)
