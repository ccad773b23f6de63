"""The user's ``meta["custom"]`` annotations survive exporting a program's module again
(PT2E-style flows annotate ``ep.module()`` and re-export it), as in torch.export: on the
graph module, and on exactly the nodes traced from an annotated node."""

from __future__ import annotations

import torch

from tests.support.reference import export_checked


class LinearRelu(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(3, 4)

    def forward(self, x):
        return self.linear(x).relu()


def _annotated(ep: torch.export.ExportedProgram) -> torch.fx.GraphModule:
    gm = ep.module()
    gm.meta["custom"] = {"f": "bar"}
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.aten.linear.default:
            node.meta["custom"] = {"quantization_tag": "foo"}
    return gm


def test_annotations_survive_re_export():
    x = torch.randn(2, 3)
    gm = _annotated(export_checked(LinearRelu(), (x,)))
    again = export_checked(gm, (x,))
    assert again.graph_module.meta["custom"] == {"f": "bar"}
    tagged = [n for n in again.graph.nodes if "custom" in n.meta]
    assert [n.target for n in tagged] == [torch.ops.aten.linear.default]
    assert tagged[0].meta["custom"] == {"quantization_tag": "foo"}
    torch.testing.assert_close(again.module()(x), gm(x))


def test_no_annotation_appears_without_one():
    x = torch.randn(2, 3)
    again = export_checked(export_checked(LinearRelu(), (x,)).module(), (x,))
    assert "custom" not in again.graph_module.meta
    assert not any("custom" in n.meta for n in again.graph.nodes)
