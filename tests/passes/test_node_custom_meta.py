"""``node.meta["custom"]`` holds exactly the user's ``fx.traceback.annotate`` marks, as
torch.export's nodes do: compilers read it as the user's (partitioning, regional
compilation), so torch's own tracing annotations must not leak into it."""

import torch
import torch.fx.traceback as fx_traceback

from predispatch_func.graphs import all_graph_modules
from tests.support.reference import export_checked


class AnnotatedWithRegion(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x):
        with fx_traceback.annotate({"stage": "encoder"}):
            h = self.lin(x)
            with torch.no_grad():
                with fx_traceback.annotate({"cache": True}):
                    s = h.detach() * 2
        return h.relu() + s


def _customs(ep):
    """(graph, node target, custom) for every call node of every graph."""
    return [(where, str(n.target), n.meta.get("custom")) for where, gm in all_graph_modules(ep.graph_module)
            for n in gm.graph.nodes if n.op == "call_function"]


def test_no_torch_internal_annotations_on_any_node():
    class Plain(torch.nn.Module):
        def forward(self, x):
            with torch.no_grad():
                y = x * 2
            return torch.nn.functional.gelu(x) + y

    ep = export_checked(Plain(), (torch.randn(2, 3),))
    assert [c for c in _customs(ep) if c[2] is not None] == []
    assert "_torchdynamo" not in str(ep)  # the printed program showed it as "Annotation: ..."


def test_user_annotations_kept_on_the_nodes_they_cover_region_bodies_included():
    ep = export_checked(AnnotatedWithRegion(), (torch.randn(2, 3, requires_grad=True),))
    customs = _customs(ep)
    linear = [c for w, t, c in customs if t == "aten.linear.default"]
    assert linear == [{"stage": "encoder"}]
    body_mul = [c for w, t, c in customs if w != "<top>" and t == "aten.mul.Tensor"]
    assert body_mul == [{"stage": "encoder", "cache": True}]
    relu = [c for w, t, c in customs if t == "aten.relu.default"]
    assert relu == [None]  # outside every annotation
    for _, _, custom in customs:
        assert not custom or not any(k.startswith("_torchdynamo") for k in custom), custom


def test_torch_exports_nodes_carry_no_torch_annotation_either():
    """The reference: torch.export's own nodes hold none of torch's tracing annotations."""
    ep = torch.export.export(AnnotatedWithRegion(), (torch.randn(2, 3),))
    for _, gm in all_graph_modules(ep.graph_module):
        for n in gm.graph.nodes:
            assert not any(k.startswith("_torchdynamo") for k in n.meta.get("custom") or {}), n.format_node()
