"""``export_joint(..., optimizer=, clip_grad_norm=)``: the training loop's
``zero_grad(); loss.backward(); clip_grad_norm_(model.parameters(), max_norm); optimizer.step()``
as one program. Replayed against that loop over 3 steps: loss, clipped gradients, parameters and
optimizer state."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import predispatch_func as pf
from predispatch_func.joint.optimizer import clipped_by_total_norm
from tests.joint.reference import export_joint_checked


def _mean_square(out):
    return out.pow(2).mean()


def _step(scale: float = 10.0):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.GELU(), nn.Linear(8, 1))
    return model, (torch.randn(16, 4) * scale,)


OPTIMIZERS = {
    "sgd_momentum": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
    "adamw": lambda params: torch.optim.AdamW(params, lr=0.01),
}


@pytest.mark.parametrize("target", [None, "core_aten"])
@pytest.mark.parametrize("max_norm", [0.05, 1e4], ids=["clipping", "below the norm"])
@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
def test_clipped_step_equals_eagers_loop(optimizer, max_norm, target):
    model, args = _step()
    opt = OPTIMIZERS[optimizer](model.parameters())
    export_joint_checked(model, args, loss_fn=_mean_square, optimizer=opt, calls=3, clip_grad_norm=max_norm,
                         target=pf.OpSet.core_aten() if target else None)


def test_the_program_returns_the_clipped_gradients_and_they_differ_from_the_unclipped():
    model, args = _step()
    opt = OPTIMIZERS["sgd_momentum"](model.parameters())
    ep = pf.export_joint(model, args, loss_fn=_mean_square, optimizer=opt, clip_grad_norm=0.05)
    step = ep.module()
    step(*args)
    grads = [p.grad for p in step.parameters() if p.grad is not None]
    total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    assert total == pytest.approx(0.05, rel=1e-4)
    unclipped = pf.verify_joint(ep, model, args, loss_fn=_mean_square, optimizer=opt, calls=1, clip_grad_norm=1e9)
    assert not unclipped.ok  # the reference without clipping differs: the clipping is in the program


def test_user_input_gradients_are_not_clipped():
    """clip_grad_norm_ runs over the parameters; an input's gradient stays as the backward left it."""
    model, (x,) = _step()
    x.requires_grad_(True)
    opt = OPTIMIZERS["adamw"](model.parameters())
    export_joint_checked(model, (x,), loss_fn=_mean_square, optimizer=opt, calls=2, clip_grad_norm=0.05)


def test_parameters_of_two_dtypes_are_grouped_as_torch_groups_them():
    torch.manual_seed(0)
    grads = [torch.randn(3), torch.randn(4, dtype=torch.float64), torch.randn(5), torch.randn(2, dtype=torch.float64)]
    expected = [g.clone() for g in grads]
    params = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
    for p, g in zip(params, expected):
        p.grad = g
    torch.nn.utils.clip_grad_norm_(params, 0.5)
    for ours, theirs in zip(clipped_by_total_norm(grads, 0.5), expected):
        assert torch.equal(ours, theirs)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), float("nan"), "1.0", True])
def test_a_clip_norm_out_of_range_is_refused(bad):
    model, args = _step()
    opt = OPTIMIZERS["adamw"](model.parameters())
    with pytest.raises(pf.JointError, match="clip_grad_norm") as caught:
        pf.export_joint(model, args, loss_fn=_mean_square, optimizer=opt, clip_grad_norm=bad)
    assert caught.value.kind is pf.JointProblem.BAD_ARGUMENT


def test_clipping_without_an_optimizer_is_refused():
    model, args = _step()
    with pytest.raises(pf.JointError, match="pass the optimizer too"):
        pf.export_joint(model, args, loss_fn=_mean_square, clip_grad_norm=1.0)
