"""``torch.profiler.record_function`` in forward: the program drops the range, as
torch.export does (its handle is a ScriptObject no program value may be, and a
runtime profiles the program its own way); the values are eager's."""

from __future__ import annotations

import torch

from predispatch_func.graphs import all_graph_modules
from tests.support.reference import export_checked


def _profiler_nodes(ep: torch.export.ExportedProgram) -> list[str]:
    return [str(n.target) for _, gm in all_graph_modules(ep.graph_module) for n in gm.graph.nodes
            if n.op == "call_function" and str(n.target).startswith("profiler.")]


class Ranged(torch.nn.Module):
    def forward(self, x):
        with torch.profiler.record_function("outer"):
            y = x.sin()
            with torch.no_grad(), torch.profiler.record_function("inner"):
                z = y.cos()
        return y + z


def test_record_function_ranges_are_dropped():
    x = torch.randn(5, 5, requires_grad=True)
    ep = export_checked(Ranged(), (x,))
    assert _profiler_nodes(ep) == []
    # torch.export drops them too: the drop-in keeps its program free of them
    assert _profiler_nodes(torch.export.export(Ranged(), (x,))) == []
