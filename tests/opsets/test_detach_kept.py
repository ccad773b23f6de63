"""``detach`` stays in a program lowered to a target (opsets/lowering.py, AUTOGRAD_BOUNDARIES).

torch's Core ATen decomposition of ``detach`` is ``alias``, right only after autograd. Our
programs still train, so lowered that way every detached value passed gradients on:
``export(..., target=core_aten)`` of the model below gave parameter gradients 0.84 off eager's,
silently (the joint program inherited it). Replayed against eager with gradients.
"""

import pytest
import torch

import predispatch_func as pf
from predispatch_func.opsets.report import ops_report
from tests.support.reference import call_targets, export_checked


class DetachedFactor(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)
        return (h * h.detach()).sum() + h.mean()


class DetachInPlace(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)
        target = h.clone()
        target.detach_()  # a stop-gradient target, as in distillation losses
        return ((h - target.sigmoid()) ** 2).sum()


@pytest.mark.parametrize("model", [DetachedFactor, DetachInPlace], ids=lambda m: m.__name__)
def test_detach_keeps_cutting_gradients_in_a_program_lowered_to_core_aten(model):
    ep = export_checked(model(), (torch.randn(3, 4),), target=pf.OpSet.core_aten())
    assert "aten.detach.default" in call_targets(ep)
    assert "aten.alias.default" not in call_targets(ep)


def test_the_ops_report_lists_detach_for_the_backend():
    ep = pf.export(DetachedFactor(), (torch.randn(3, 4),), target=pf.OpSet.core_aten())
    assert "aten.detach.default" in {use.op for use in ops_report(ep, pf.OpSet.core_aten())}
