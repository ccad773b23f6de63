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


def test_a_kept_composite_whose_saved_values_are_random_draws_is_refused_where_the_user_keeps_it():
    """rrelu keeps its noise inside the kept node; recomputing it in the backward would draw new
    noise. export_joint decomposes it (tests/joint/test_random_composites.py) unless told to keep it."""
    model = _Returns(lambda y: torch.nn.functional.rrelu(y, training=True).sum())
    with pytest.raises(JointError) as info:
        pf.export_joint(model, (torch.randn(2, 3),), composite_overrides={"aten.rrelu.default": "keep"})
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


class _RunningMean(torch.nn.Module):
    """A running offset updated in forward; with grad on (a common slip), eager's buffer keeps
    the step's autograd history (here through ops that save nothing, so eager's next backward
    runs through it without an error)."""

    def __init__(self, under_no_grad: bool):
        super().__init__()
        self.fc = torch.nn.Linear(3, 3)
        self.register_buffer("mean", torch.zeros(3))
        self.under_no_grad = under_no_grad

    def forward(self, x):
        y = self.fc(x)
        with torch.set_grad_enabled(not self.under_no_grad):
            self.mean.sub_(self.fc.bias)
        return ((y - self.mean) ** 2).mean()


def test_a_buffer_written_with_a_value_that_requires_grad_is_refused_naming_its_line():
    """Was silently wrong from the second step on (found by the joint fuzz run): eager's second
    backward runs through the buffer into the first step's graph and adds to fc's gradients
    again; a program's step starts from the buffer's plain value."""
    x = torch.randn(4, 3)
    eager = _RunningMean(under_no_grad=False)
    for _ in range(2):  # eager itself trains: two steps, no error
        eager(x).backward()
    with pytest.raises(JointError) as info:
        pf.export_joint(_RunningMean(under_no_grad=False), (x,))
    assert info.value.kind is JointProblem.STATE_WRITTEN_WITH_HISTORY
    message = str(info.value)
    assert "'mean'" in message and "test_joint_errors.py" in message and "torch.no_grad()" in message


class _WritesItsInput(torch.nn.Module):
    def __init__(self, detached: bool):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(3))
        self.detached = detached

    def forward(self, x, state):
        state.copy_(self.w.detach() if self.detached else self.w)
        return (x * state + self.w).sum()


def test_an_input_written_with_a_value_that_requires_grad_is_refused_naming_its_line():
    """Eager's caller gets its tensor back requiring grad, with this step's history (the
    program writes back a plain value): the buffer case's twin, refused the same way."""
    x, state = torch.randn(3), torch.zeros(3)
    eager_state = state.clone()
    _WritesItsInput(detached=False)(x, eager_state).backward()
    assert eager_state.requires_grad  # what the program could not give back
    with pytest.raises(JointError) as info:
        pf.export_joint(_WritesItsInput(detached=False), (x, state))
    assert info.value.kind is JointProblem.STATE_WRITTEN_WITH_HISTORY
    message = str(info.value)
    assert "'state'" in message and "test_joint_errors.py" in message
    assert not state.requires_grad and torch.equal(state, torch.zeros(3))


def test_the_same_input_written_with_a_detached_value_trains_as_eager():
    model, x, state = _WritesItsInput(detached=True), torch.randn(3), torch.zeros(3)
    ep = pf.export_joint(model, (x, state))
    assert pf.verify_joint(ep, model, (x, state), calls=2).ok


def test_the_same_buffer_written_under_no_grad_trains_as_eager():
    model, x = _RunningMean(under_no_grad=True), torch.randn(4, 3)
    ep = pf.export_joint(model, (x,))
    assert pf.verify_joint(ep, model, (x,), calls=3).ok


def test_a_program_holding_a_value_its_trace_did_not_record_is_refused_naming_the_op():
    """A backward body torch traces that meets a value with no graph value records it as a
    constant holding a fake tensor (a program that fails when called; seen with cond and map
    bodies before their engine copies were resolved): every graph is checked, the op named."""
    from predispatch_func.joint.export import _refuse_unrecorded_values

    with torch._subclasses.fake_tensor.FakeTensorMode():
        fake = torch.randn(3)
    body_graph = torch.fx.Graph()
    body_graph.output(body_graph.get_attr("c"))
    body = torch.fx.GraphModule({"c": fake}, body_graph)
    root = torch.nn.Module()
    root.body_graph_0 = body
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    call = graph.call_function(torch.ops.higher_order.map_impl, (graph.get_attr("body_graph_0"), [x], []))
    graph.output(call)
    with pytest.raises(JointError, match="map_impl") as info:
        _refuse_unrecorded_values(torch.fx.GraphModule(root, graph))
    assert info.value.kind is JointProblem.UNSUPPORTED_HOP
