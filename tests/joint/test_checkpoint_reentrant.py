"""``torch.utils.checkpoint(..., use_reentrant=True)``, transformers' default for gradient
checkpointing: its ``CheckpointFunction`` was captured as a custom Function whose forward runs
under ``no_grad``, and ``pf.export`` itself refused ("leaves grad mode changed") where
torch.export exports it. It is inlined now, as the non-reentrant kind (the training-step cases
run it through export_joint: tests/joint/cases.py ``activation_checkpoint_reentrant``)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import predispatch_func as pf
from tests.joint.cases import CASES


def test_the_forward_export_trains_through_its_module_as_eager():
    model, args, kwargs, _ = CASES["activation_checkpoint_reentrant"].build()
    reference = copy.deepcopy(model)
    ep = pf.export(model, args, kwargs)
    report = pf.verify(ep, reference, args, kwargs, calls=2)
    assert report.ok, report.problems


class _NoGradInput(nn.Module):
    """No tensor argument requires grad: eager's reentrant checkpoint gives ``a`` no gradient."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 1)

    def forward(self, x):
        h = torch.utils.checkpoint.checkpoint(lambda t: torch.relu(self.a(t)), x, use_reentrant=True)
        return self.b(h).pow(2).mean()


def test_with_no_input_requiring_grad_the_inner_parameters_get_none_as_in_eager():
    torch.manual_seed(0)
    model, x = _NoGradInput(), torch.randn(3, 4)
    ep = pf.export_joint(copy.deepcopy(model), (x,))
    grads = {s.target for s in ep.graph_signature.output_specs if s.kind.name == "GRADIENT_TO_PARAMETER"}
    with pytest.warns(UserWarning, match="None of the inputs have requires_grad=True"):
        model(x).backward()
    assert grads == {name for name, p in model.named_parameters() if p.grad is not None} == {"b.weight", "b.bias"}


def test_without_preserve_rng_state_it_is_refused():
    class Unpreserved(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(4, 4)

        def forward(self, x):
            return torch.utils.checkpoint.checkpoint(self.a, x, use_reentrant=True, preserve_rng_state=False).sum()

    with pytest.raises(pf.UnsupportedError, match="preserve_rng_state=False"):
        pf.export(Unpreserved(), (torch.randn(3, 4, requires_grad=True),))
