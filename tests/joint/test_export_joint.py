"""export_joint: one functional program for forward, loss and backward, replayed against the reference's steps."""

from __future__ import annotations

import copy
import functools

import pytest
import torch
from expecttest import TestCase
from torch.export.graph_signature import OutputKind

import predispatch_func as pf
from tests.joint.cases import CASES, REGION_CASES, case_params
from tests.joint.reference import export_joint_checked, forward_targets, region_calls
from tests.support.fresh_process import run_in_fresh_process
from tests.support.torch_release import torch_release


@pytest.mark.parametrize("name", case_params(list(CASES)))
def test_joint_program_equals_eager_over_two_steps(name):
    model, args, kwargs, loss_fn = CASES[name].build()
    eager, eager_args = copy.deepcopy(model), copy.deepcopy(args)
    out = eager(*eager_args, **kwargs)
    (loss_fn(out) if loss_fn is not None else out[0] if isinstance(out, tuple) else out).backward()
    ep = export_joint_checked(model, args, kwargs, loss_fn=loss_fn)
    kinds = [s.kind for s in ep.graph_signature.output_specs]
    assert kinds.count(OutputKind.LOSS_OUTPUT) == 1
    # one gradient output per leaf eager's backward reaches (a frozen or unused one gets none)
    assert kinds.count(OutputKind.GRADIENT_TO_PARAMETER) == sum(p.grad is not None for p in eager.parameters())
    assert kinds.count(OutputKind.GRADIENT_TO_USER_INPUT) == sum(
        isinstance(a, torch.Tensor) and a.grad is not None for a in torch.utils._pytree.tree_leaves(eager_args))


@pytest.mark.parametrize("name", case_params([n for n in CASES if CASES[n].kept]))
def test_kept_composites_stay_one_forward_node(name):
    model, args, kwargs, loss_fn = CASES[name].build()
    forward = pf.export(copy.deepcopy(model), args, kwargs) if loss_fn is None else None
    ep = pf.export_joint(model, args, kwargs, loss_fn=loss_fn)
    targets = forward_targets(ep)
    for op in CASES[name].kept:
        assert op in targets, f"{op} is not one node of the joint program"
        if forward is not None:  # as many calls as the forward program has: none decomposed, none added
            assert targets.count(op) == forward_targets(forward).count(op), op


@pytest.mark.parametrize("name", REGION_CASES)
def test_regions_stay_region_hops(name):
    model, args, kwargs, loss_fn = CASES[name].build()
    forward = pf.export(copy.deepcopy(model), args, kwargs)
    ep = pf.export_joint(model, args, kwargs, loss_fn=loss_fn)
    assert len(region_calls(forward)) > 0
    # the same regions, same modes, same order (identity_of is empty in a joint program: its
    # gradients are outputs, not autograd edges for ep.module() to follow)
    assert [_mode_args(n) for n in region_calls(ep)] == [_mode_args(n) for n in region_calls(forward)]


def _mode_args(call):
    return call.args[:1] if call.target.__name__ == "pf_grad_region" else call.args[:3]


class TestJointGraphs(TestCase):
    def test_layer_norm_backward_is_eagers_op_with_mean_and_rstd_recomputed(self):
        model, args, kwargs, loss_fn = CASES["layernorm_gelu_softmax_with_loss_fn"].build()
        ep = pf.export_joint(model, args, kwargs, loss_fn=loss_fn)
        targets = forward_targets(ep)
        self.assertEqual(targets.count("aten.layer_norm.default"), 1)
        self.assertEqual(targets.count("aten.native_layer_norm_backward.default"), 1)
        self.assertEqual(targets.count("aten.gelu_backward.default"), 1)
        self.assertEqual(targets.count("aten._softmax_backward_data.default"), 1)
        # mean and rstd: one recomputation in the backward; softmax's saved output is its forward node
        self.assertEqual(targets.count("aten.native_layer_norm.default"), 1)
        self.assertEqual(targets.count("aten._softmax.default"), 0)

    def test_autocast_backward_runs_in_bf16_with_casts_explicit(self):
        model, args, kwargs, loss_fn = CASES["autocast_bf16_block"].build()
        ep = pf.export_joint(model, args, kwargs, loss_fn=loss_fn)
        top = ep.graph_module.graph
        bf16_mm = [n for n in top.nodes if n.target is torch.ops.aten.mm.default
                   and n.meta["val"].dtype is torch.bfloat16]
        self.assertGreaterEqual(len(bf16_mm), 2)  # weight and input gradients of the bf16 matmuls
        casts = [n for n in top.nodes if n.target is torch.ops.aten._to_copy.default
                 and n.kwargs.get("dtype") is torch.bfloat16]
        self.assertGreaterEqual(len(casts), 1)  # autocast's casts, recomputed for the backward

    def test_no_grad_region_contributes_nothing_to_the_backward(self):
        model, args, kwargs, loss_fn = CASES["no_grad_ema_buffer_update"].build()
        ep = pf.export_joint(model, args, kwargs, loss_fn=loss_fn)
        (region,) = region_calls(ep)
        body = getattr(ep.graph_module, region.args[2].target)
        self.assertEqual([str(n.target) for n in body.graph.nodes if n.op == "call_function"],
                         ["aten.mul.Tensor", "aten.mean.dim", "aten.add.Tensor"])

    def test_signature_and_graph_of_a_linear_model(self):
        class Lin(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = torch.nn.Linear(3, 2)

            def forward(self, x):
                return self.fc(x).sum()

        torch.manual_seed(0)
        ep = export_joint_checked(Lin(), (torch.randn(4, 3, requires_grad=True),))
        self.assertExpectedInline(str(ep.graph_signature).strip(), """\
# inputs
p_fc_weight: PARAMETER target='fc.weight'
p_fc_bias: PARAMETER target='fc.bias'
x: USER_INPUT

# outputs
sum_1: LOSS_OUTPUT
t_4: GRADIENT_TO_PARAMETER target='fc.weight'
view: GRADIENT_TO_PARAMETER target='fc.bias'
mm: GRADIENT_TO_USER_INPUT target='x'""")
        self.assertExpectedInline(ep.graph_module.code.strip(), """\
def forward(self, p_fc_weight, p_fc_bias, x):
    linear = torch.ops.aten.linear.default(x, p_fc_weight, p_fc_bias);  p_fc_bias = None
    sum_1 = torch.ops.aten.sum.default(linear);  linear = None
    ones_like = torch.ops.aten.ones_like.default(sum_1, pin_memory = False, memory_format = torch.preserve_format)
    expand = torch.ops.aten.expand.default(ones_like, [4, 2]);  ones_like = None
    t = torch.ops.aten.t.default(p_fc_weight);  p_fc_weight = None
    t_1 = torch.ops.aten.t.default(t);  t = None
    mm = torch.ops.aten.mm.default(expand, t_1);  t_1 = None
    t_2 = torch.ops.aten.t.default(expand)
    mm_1 = torch.ops.aten.mm.default(t_2, x);  t_2 = x = None
    t_3 = torch.ops.aten.t.default(mm_1);  mm_1 = None
    sum_2 = torch.ops.aten.sum.dim_IntList(expand, [0], True);  expand = None
    view = torch.ops.aten.view.default(sum_2, [2]);  sum_2 = None
    t_4 = torch.ops.aten.t.default(t_3);  t_3 = None
    return (sum_1, t_4, view, mm)""")

    def test_module_accumulates_gradients_as_eager(self):
        model, args, kwargs, loss_fn = CASES["plain_mlp"].build()
        eager = copy.deepcopy(model)
        step = pf.export_joint(model, args, kwargs).module()
        for _ in range(3):
            eager(*args).backward()
            loss = step(*args)[0]
        self.assertIsNone(loss.grad_fn)
        for (name, p), q in zip(eager.named_parameters(), step.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-5, msg=name)

    def test_dropout_draws_eagers_mask_from_the_same_seed(self):
        """RNG: the program draws in the forward, in eager's order, from the global generator;
        with the same seed its mask is eager's (a different seed gives another loss)."""
        model, args, kwargs, loss_fn = CASES["dropout_train"].build()
        eager = copy.deepcopy(model)
        step = pf.export_joint(model, args, kwargs).module()
        torch.manual_seed(7)
        e = eager(*args)
        torch.manual_seed(7)
        p = step(*args)[0]
        torch.manual_seed(8)
        other = step(*args)[0]
        torch.testing.assert_close(e.detach(), p)
        self.assertFalse(torch.allclose(p, other))

    def test_program_saves_and_loads(self):
        import io

        model, args, kwargs, loss_fn = CASES["issue_41_repro"].build()
        ep = pf.export_joint(model, args, kwargs, loss_fn=loss_fn)
        buffer = io.BytesIO()
        torch.export.save(ep, buffer)
        buffer.seek(0)
        loaded = torch.export.load(buffer)
        self.assertEqual([s.kind for s in loaded.graph_signature.output_specs],
                         [s.kind for s in ep.graph_signature.output_specs])


OPTIMIZERS = {
    "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, foreach=False),
    "sgd_nesterov_foreach": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01,
                                                       foreach=True),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-2, foreach=False),
    "adamw_foreach": lambda ps: torch.optim.AdamW(ps, lr=1e-2, foreach=True),
    "adam_amsgrad_l2": lambda ps: torch.optim.Adam(ps, lr=1e-2, weight_decay=0.1, amsgrad=True),
}


@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
@pytest.mark.parametrize("name", ["plain_mlp", "issue_41_repro", "batchnorm_training_running_stats",
                                  "nested_regions"])
def test_three_optimizer_steps_equal_eager(name, optimizer):
    if name in _BF16_CASES and torch_release() < (2, 13, 0):
        # on torch 2.11/2.12 an earlier test of the whole suite leaves state that moves eager's bf16
        # results by a rounding step by step 3 (alone: equal); not found yet, so a fresh process
        run_in_fresh_process(__name__, "_three_optimizer_steps_equal_eager", name, optimizer)
        return
    _three_optimizer_steps_equal_eager(name, optimizer)


_BF16_CASES = {"issue_41_repro", "nested_regions"}  # autocast(bfloat16) blocks


def _three_optimizer_steps_equal_eager(name: str, optimizer: str) -> None:
    model, args, kwargs, loss_fn = CASES[name].build()
    ep = export_joint_checked(model, args, kwargs, loss_fn=loss_fn, optimizer=OPTIMIZERS[optimizer](
        model.parameters()), calls=3)
    kinds = {s.kind for s in ep.graph_signature.output_specs}
    assert OutputKind.PARAMETER_MUTATION in kinds


@pytest.mark.parametrize("optimizer", ["sgd_momentum", "adamw"])
@pytest.mark.parametrize("name", case_params([n for n in CASES if n not in _BF16_CASES]))
def test_every_case_steps_with_an_optimizer_as_eager(name, optimizer):
    """The update starts from the parameter the forward left: a weight clamped under no_grad or
    written through ``.data`` in forward was updated from its value before the write (found with
    the .data case; silent, the parameters off by the write from step 1)."""
    model, args, kwargs, loss_fn = CASES[name].build()
    export_joint_checked(model, args, kwargs, loss_fn=loss_fn,
                         optimizer=OPTIMIZERS[optimizer](model.parameters()), calls=3)


def test_optimizer_with_state_continues_and_learning_rate_is_an_input():
    model, args, kwargs, loss_fn = CASES["plain_mlp"].build()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(2):  # state exists before export: the program starts from it
        opt.zero_grad()
        model(*args).backward()
        opt.step()
    opt.zero_grad(set_to_none=True)
    eager = copy.deepcopy(model)
    ep = export_joint_checked(model, args, kwargs, optimizer=opt, calls=2)
    eager_opt = torch.optim.AdamW(eager.parameters(), lr=1e-2)
    eager_opt.load_state_dict(opt.state_dict())
    step = ep.module()
    for lr in (1e-2, 3e-3):  # a scheduler changes lr between steps, no re-export
        step.set_lr(lr)
        for group in eager_opt.param_groups:
            group["lr"] = lr
        eager_opt.zero_grad()
        eager(*args).backward()
        eager_opt.step()
        step(*args)
    for (name, p), q in zip(eager.named_parameters(), step.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-5, msg=name)


def test_verify_joint_catches_a_wrong_gradient():
    model, args, kwargs, loss_fn = CASES["plain_mlp"].build()
    reference = copy.deepcopy(model)
    ep = pf.export_joint(model, args, kwargs)
    assert pf.verify_joint(ep, reference, args, kwargs).ok
    output = ep.graph_module.graph.output_node()
    grads = [i for i, s in enumerate(ep.graph_signature.output_specs) if s.kind is OutputKind.GRADIENT_TO_PARAMETER]
    with ep.graph_module.graph.inserting_before(output):
        doubled = ep.graph_module.graph.call_function(torch.ops.aten.mul.Tensor, (output.args[0][grads[0]], 2.0))
    values = list(output.args[0])
    values[grads[0]] = doubled
    output.args = (tuple(values),)
    ep.graph_signature.output_specs[grads[0]].arg.name = doubled.name
    ep.graph_module.recompile()
    report = pf.verify_joint(ep, reference, args, kwargs)
    assert not report.ok and any(".grad" in p for p in report.problems), str(report)


def test_hooks_registered_on_parameters_before_export_run_on_their_gradients():
    model, args, kwargs, loss_fn = CASES["plain_mlp"].build()
    model.fc1.weight.register_hook(lambda g: g * 3)
    model.fc2.bias.register_hook(lambda g: g.clamp(-0.01, 0.01))
    export_joint_checked(model, args, kwargs)


def test_a_post_accumulate_grad_hook_is_refused():
    model, args, kwargs, loss_fn = CASES["plain_mlp"].build()
    model.fc1.weight.register_post_accumulate_grad_hook(lambda p: None)
    with pytest.raises(pf.JointError) as info:
        pf.export_joint(model, args, kwargs)
    assert info.value.kind is pf.JointProblem.UNSUPPORTED_HOOK and "fc1.weight" in str(info.value)


@pytest.mark.parametrize("name,label", [("plain_mlp", "y"), ("issue_41_repro", "labels")])
def test_dynamic_batch_joint_program_equals_eager_at_other_sizes(name, label):
    model, args, kwargs, loss_fn = CASES[name].build()
    batch = torch.export.Dim("batch", min=2, max=64)
    ep = export_joint_checked(model, args, kwargs, dynamic_shapes={"x": {0: batch}, label: {0: batch}})
    model, args, kwargs, loss_fn = CASES[name].build()
    bigger = tuple(torch.cat([a, a, a]) for a in args)
    assert pf.verify_joint(ep, model, bigger, kwargs, calls=2).ok


def test_step_module_runs_under_torch_compile():
    """torch.compile of ep.module() (aot_eager: no C++ toolchain needed) steps as the module does;
    inductor was checked by hand on the issue's repro with AdamW (docs/joint.md)."""
    model, args, kwargs, loss_fn = CASES["plain_mlp"].build()
    ep = pf.export_joint(model, args, kwargs, optimizer=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    plain, compiled = ep.module(), ep.module()
    run = torch.compile(compiled, backend="aot_eager")
    for _ in range(2):
        torch.testing.assert_close(run(*args)[0], plain(*args)[0])
    for p, q in zip(plain.parameters(), compiled.parameters()):
        torch.testing.assert_close(p, q)


def test_signature_equals_torchs_export_forward_backward_field_by_field():
    """What ExecuTorch's training flow reads (torch's joint signature), on a model both get right:
    the same input specs, the same output kinds in the same order, the same targets (torch names
    a user input's gradient by its pre-export placeholder, ``arg*_1``: we use the input's name)."""
    from predispatch_func import _torch_compat as tc

    model, args, kwargs, loss_fn = CASES["no_grad_ema_buffer_update"].build()
    x = args[0].detach().clone().requires_grad_()
    ours = pf.export_joint(copy.deepcopy(model), (x,)).graph_signature
    theirs = tc.torch_export_forward_backward(torch.export.export(copy.deepcopy(model), (x,))).graph_signature
    assert [(s.kind, s.target, s.persistent) for s in ours.input_specs] == \
        [(s.kind, s.target, s.persistent) for s in theirs.input_specs]
    assert [s.kind for s in ours.output_specs] == [s.kind for s in theirs.output_specs]
    assert [s.target for s in ours.output_specs if s.kind is not OutputKind.GRADIENT_TO_USER_INPUT] == \
        [s.target for s in theirs.output_specs if s.kind is not OutputKind.GRADIENT_TO_USER_INPUT]
    assert list(ours.backward_signature.gradients_to_parameters.values()) == \
        list(theirs.backward_signature.gradients_to_parameters.values())


class _ReturnsItsClampedWeight(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4))

    def forward(self, x):
        with torch.no_grad():
            self.w.clamp_(-0.5, 0.5)
        return (self.w * x).pow(2).mean(), self.w


@pytest.mark.parametrize("optimizer", [None, "sgd_momentum"])
def test_a_written_parameter_returned_is_the_parameter_as_eager_returns_it(optimizer):
    """Eager returns the parameter itself, which the optimizer's step then updates in place; the
    program returned the forward's value, before the step (found by `fuzz.py --optimizer`)."""
    model = _ReturnsItsClampedWeight()
    opt = OPTIMIZERS[optimizer](model.parameters()) if optimizer else None
    ep = export_joint_checked(model, (torch.randn(4),), optimizer=opt, calls=2)
    module = ep.module()
    _, w = module(torch.randn(4))
    assert w is module.get_parameter("w")


class _ReturnsViewsOfWrittenState(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4))
        self.register_buffer("steps", torch.zeros(3))

    def forward(self, x):
        with torch.no_grad():
            self.w.clamp_(-0.5, 0.5)
        self.steps.add_(1)
        v = x * 2
        self.steps[:1].copy_(v[:1])  # takes v's values, not its memory
        return (self.w * x).pow(2).mean(), self.w.detach()[1:], self.steps[1:], v[1:3]


def _eager_step(model, opt, x):
    if opt is not None:
        opt.zero_grad()
    loss, *rest = model(x)
    loss.backward()
    if opt is not None:
        opt.step()
    return (loss, *rest)


@pytest.mark.parametrize("optimizer", [None, "sgd_momentum"])
def test_returned_views_of_written_state_are_views_of_it_as_eager_returns_them(optimizer):
    """A view of a written parameter or buffer is that tensor's memory in eager: a caller who
    keeps it sees the optimizer's step and the next call's write. The program returned views
    of the forward's values, copies once written back."""
    runs = []
    for program in (False, True):
        torch.manual_seed(0)
        model, x = _ReturnsViewsOfWrittenState(), torch.randn(4)
        opt = OPTIMIZERS[optimizer](model.parameters()) if optimizer else None
        if program:
            module = pf.export_joint(model, (x,), optimizer=opt).module()
            step, w, steps = module, module.get_parameter("w"), module.get_buffer("steps")
        else:
            step, w, steps = functools.partial(_eager_step, model, opt), model.w, model.steps
        kept = [step(x) for _ in range(2)]
        runs.append([t.detach().clone() for out in kept for t in out[1:]])
        assert kept[0][1].untyped_storage().data_ptr() == w.untyped_storage().data_ptr()
        assert kept[0][2].untyped_storage().data_ptr() == steps.untyped_storage().data_ptr()
        assert kept[0][3].untyped_storage().data_ptr() != steps.untyped_storage().data_ptr()
    for eager, ours in zip(*runs):
        torch.testing.assert_close(ours, eager)


class _ReturnsValuesDataAssigned(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("buf", torch.zeros(3, 2))
        self.w = torch.nn.Parameter(torch.randn(1))

    def forward(self, x0, x1):
        v1 = x1 * 2
        x1.data = v1  # eager: v1 is x1's memory from here on
        v2 = x0 * 3
        self.buf.data = v2
        return (self.w * x1).sum(), v1, v2[1:]


@pytest.mark.parametrize("optimizer", [None, "adamw"])
def test_values_a_data_assignment_gave_state_are_returned_as_its_memory(optimizer):
    """Found by `fuzz.py --joint --optimizer adamw` on torch 2.11: the step returned copies."""
    model = _ReturnsValuesDataAssigned()
    opt = OPTIMIZERS[optimizer](model.parameters()) if optimizer else None
    export_joint_checked(model, (torch.randn(3, 2), torch.randn(4)), optimizer=opt, calls=2)
