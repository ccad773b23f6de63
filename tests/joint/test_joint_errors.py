"""What export_joint refuses: each a JointError with its JointProblem kind, the user's line, what to do."""

from __future__ import annotations

import pytest
import torch

import predispatch_func as pf
from predispatch_func.joint import JointError, JointProblem


class _Returns(torch.nn.Module):
    def __init__(self, what):
        super().__init__()
        self.fc = torch.nn.Linear(3, 3)
        self.what = what

    def forward(self, x):
        y = self.fc(x)
        return self.what(y)


def test_a_model_without_scalar_loss_is_refused_naming_its_line():
    with pytest.raises(JointError) as info:
        pf.export_joint(_Returns(lambda y: y * 2), (torch.randn(2, 3),))
    assert info.value.kind is JointProblem.NO_SCALAR_LOSS
    message = str(info.value)
    assert "shape (2, 3)" in message and "test_joint_errors.py" in message and "loss_fn=" in message


def test_an_integer_loss_is_refused():
    with pytest.raises(JointError) as info:
        pf.export_joint(_Returns(lambda y: y.argmax()), (torch.randn(2, 3),))
    assert info.value.kind is JointProblem.NO_SCALAR_LOSS


def test_a_loss_that_does_not_require_grad_is_refused():
    model = _Returns(lambda y: y.detach().sum())
    with pytest.raises(JointError) as info:
        pf.export_joint(model, (torch.randn(2, 3),))
    assert info.value.kind is JointProblem.LOSS_WITHOUT_GRAD
    assert "test_joint_errors.py" in str(info.value)


def test_a_model_with_every_parameter_frozen_is_refused():
    model = _Returns(lambda y: y.sum()).requires_grad_(False)
    with pytest.raises(JointError) as info:
        pf.export_joint(model, (torch.randn(2, 3),))
    assert info.value.kind is JointProblem.LOSS_WITHOUT_GRAD


def test_an_optimizer_over_parameters_the_model_does_not_own_is_refused():
    model = _Returns(lambda y: y.sum())
    stranger = torch.nn.Parameter(torch.randn(4, 5))
    optimizer = torch.optim.SGD([*model.parameters(), stranger], lr=0.1)
    with pytest.raises(JointError) as info:
        pf.export_joint(model, (torch.randn(2, 3),), optimizer=optimizer)
    assert info.value.kind is JointProblem.FOREIGN_OPTIMIZER_PARAMETERS
    assert "(4, 5)" in str(info.value) and "model.parameters()" in str(info.value)


def test_an_unsupported_optimizer_is_refused():
    model = _Returns(lambda y: y.sum())
    with pytest.raises(JointError) as info:
        pf.export_joint(model, (torch.randn(2, 3),), optimizer=torch.optim.RMSprop(model.parameters()))
    assert info.value.kind is JointProblem.UNSUPPORTED_OPTIMIZER


def test_refusals_leave_the_model_as_it_was():
    model = _Returns(lambda y: y * 2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(JointError):
        pf.export_joint(model, (torch.randn(2, 3),))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())


def test_a_kept_composite_whose_saved_values_are_random_draws_is_refused():
    """rrelu keeps its noise inside the kept node; recomputing it in the backward would draw new noise."""
    model = _Returns(lambda y: torch.nn.functional.rrelu(y, training=True).sum())
    with pytest.raises(JointError) as info:
        pf.export_joint(model, (torch.randn(2, 3),))
    assert info.value.kind is JointProblem.SAVED_VALUE_NOT_RECOMPUTABLE
    assert "aten.rrelu" in str(info.value) and "test_joint_errors.py" in str(info.value)


def test_an_fx_graph_module_is_refused():
    model = _Returns(lambda y: y.sum())
    module = pf.export(model, (torch.randn(2, 3),)).module()
    with pytest.raises(JointError) as info:
        pf.export_joint(module, (torch.randn(2, 3),))
    assert info.value.kind is JointProblem.UNSUPPORTED_MODEL


class _BuildsATwoTensor(torch.nn.Module):
    def __init__(self):
        super().__init__()
        from torch.testing._internal.two_tensor import TwoTensor

        self.param = torch.nn.Parameter(TwoTensor(torch.randn(2, 3), torch.randn(2, 3)))

    def forward(self, x):
        from torch.testing._internal.two_tensor import TwoTensor

        return (TwoTensor(x, x * 2) * self.param).sum()


class _ReadsATwoTensorApart(_BuildsATwoTensor):
    def forward(self, x):
        return (x * self.param).sum().get_elem_a()


@pytest.mark.parametrize("model, what", [(_BuildsATwoTensor(), "builds a tensor subclass"),
                                         (_ReadsATwoTensorApart(), "reads an inner tensor")], ids=["built", "read"])
def test_a_tensor_subclass_built_or_read_apart_in_forward_is_refused(model, what):
    pf.export(model, (torch.randn(2, 3),))  # the forward program is exported (tests/program/...subclasses...)
    with pytest.raises(JointError, match=what) as info:
        pf.export_joint(model, (torch.randn(2, 3),))
    assert info.value.kind is JointProblem.UNSUPPORTED_MODEL
