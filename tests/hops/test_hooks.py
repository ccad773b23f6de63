"""Tensor hooks, torch's ``register_hook`` HOP and ``requires_grad_()`` inside forward:
each keeps eager's gradients (replayed through ``export_checked``) or is refused."""

import pytest
import torch
from expecttest import TestCase

import predispatch_func as pf
from predispatch_func.errors import UnsupportedError
from predispatch_func.trace.extensions.autograd_function import pf_autograd_function
from predispatch_func.trace.extensions.hooks import pf_require_grad
from tests.support.reference import export_checked


def targets(ep):
    from predispatch_func.graphs import all_graph_modules
    return [n.target for _, gm in all_graph_modules(ep.graph_module) for n in gm.graph.nodes
            if n.op == "call_function"]


class HookOnIntermediateSeesWholeGradient(torch.nn.Module):
    def forward(self, x):
        y = x * 2
        before = y.cos()  # read before the hook is registered: eager's hook still sees this gradient
        y.register_hook(lambda g: g * 3)
        return y.sin() + before


class HookOnInputClampsGradient(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x):
        self.lin.weight.register_hook(lambda g: g.clamp(-0.05, 0.05))
        x.register_hook(lambda g: g * 0.5)
        return self.lin(x).tanh()


class HookThenInPlace(torch.nn.Module):
    def forward(self, x):
        y = x * 2
        y.register_hook(lambda g: g + 1)
        y.mul_(3)  # eager: the hook sees the gradient of y's value before this write
        return y.exp()


class HookOp(torch.nn.Module):
    def forward(self, x):
        from torch._higher_order_ops.register_hook import register_hook_op

        return register_hook_op(x.sin(), lambda g: g * 2).cos()


def _has_register_hook_hop() -> bool:
    """torch's ``register_hook`` HOP exists from torch 2.13 on."""
    import importlib.util

    return importlib.util.find_spec("torch._higher_order_ops.register_hook") is not None


class LoggingHook(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.seen = []

    def forward(self, x):
        y = x * 2
        y.register_hook(self.seen.append)
        return y


class RemovedHook(torch.nn.Module):
    def forward(self, x):
        y = x * 2
        handle = y.register_hook(lambda g: g * 5)
        handle.remove()
        return y


class RequiresGradOnDetached(torch.nn.Module):
    def forward(self, x):
        v = (x * 2).detach()
        v.requires_grad_()
        return v * x


class RequiresGradOnFreshTensor(torch.nn.Module):
    def forward(self, x):
        z = torch.zeros(3).requires_grad_(True)
        return z + x.detach()


class RequiresGradFalseOnParameter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x):
        self.lin.weight.requires_grad_(False)
        return self.lin(x)


class RequiresGradFalseOnIntermediate(torch.nn.Module):
    def forward(self, x):
        y = (x * 2).detach()
        y.requires_grad_(False)
        return y + x


class HooksTest(TestCase):
    def setUp(self):
        torch.manual_seed(0)
        self.x = torch.randn(2, 3)

    def test_hook_on_intermediate_sees_whole_gradient(self):
        ep = export_checked(HookOnIntermediateSeesWholeGradient(), (self.x,))
        self.assertIn(pf_autograd_function, targets(ep))

    def test_hooks_on_parameter_and_input(self):
        export_checked(HookOnInputClampsGradient(), (self.x,))

    def test_hook_then_in_place_write(self):
        export_checked(HookThenInPlace(), (self.x,))

    @pytest.mark.skipif(not _has_register_hook_hop(), reason="torch before 2.13 has no register_hook HOP")
    def test_torch_register_hook_hop(self):
        export_checked(HookOp(), (self.x,))

    def test_side_effect_only_hook_is_refused(self):
        with self.assertRaises(UnsupportedError) as caught:
            pf.export(LoggingHook(), (self.x,))
        self.assertIn("hook that returns None", str(caught.exception))
        self.assertIs(caught.exception.kind, pf.Refusal.TENSOR_HOOK_NOT_EXPRESSIBLE)

    def test_hook_removed_in_forward_is_refused(self):
        with self.assertRaises(UnsupportedError) as caught:
            pf.export(RemovedHook(), (self.x,))
        self.assertIs(caught.exception.kind, pf.Refusal.TENSOR_HOOK_NOT_EXPRESSIBLE)

    def test_hook_program_reexports(self):
        model = HookOnIntermediateSeesWholeGradient()
        ep = export_checked(model, (self.x,))
        pf.verify(pf.export(ep.module(), (self.x,)), model, (self.x,), raise_on_failure=True)

    def test_requires_grad_on_detached_value(self):
        ep = export_checked(RequiresGradOnDetached(), (self.x,))
        self.assertIn(pf_require_grad, targets(ep))
        again = pf.export(ep.module(), (self.x,))
        self.assertIn(pf_require_grad, targets(again))
        pf.verify(again, RequiresGradOnDetached(), (self.x,), raise_on_failure=True)

    def test_requires_grad_on_fresh_tensor(self):
        out = export_checked(RequiresGradOnFreshTensor(), (self.x,)).module()(self.x)
        self.assertTrue(out.requires_grad)

    def test_requires_grad_false_on_parameter_is_refused(self):
        model = RequiresGradFalseOnParameter()
        with self.assertRaises(UnsupportedError) as caught:
            pf.export(model, (self.x,))
        self.assertIs(caught.exception.kind, pf.Refusal.REQUIRES_GRAD_OFF_ON_INPUT)
        self.assertTrue(model.lin.weight.requires_grad)

    def test_requires_grad_false_on_intermediate(self):
        export_checked(RequiresGradFalseOnIntermediate(), (self.x,))

    def test_hooks_and_requires_grad_survive_torchs_tracers(self):
        """torch.export.export(ep.module()) keeps both calls (replayed with gradients);
        run_decompositions keeps them too (its post-autograd IR turns detach into alias,
        so only the calls are checked there)."""
        import copy

        from predispatch_func.verify import replay_against_reference

        for model, target in ((HookOnIntermediateSeesWholeGradient(), pf_autograd_function),
                              (RequiresGradOnDetached(), pf_require_grad)):
            ep = export_checked(model, (self.x,))
            with self.subTest(model=type(model).__name__):
                again = torch.export.export(ep.module(), (self.x,))
                self.assertIn(target, targets(again))
                self.assertEqual(replay_against_reference(copy.deepcopy(again.module()), model, (self.x,)).problems, [])
                self.assertIn(target, targets(ep.run_decompositions()))
