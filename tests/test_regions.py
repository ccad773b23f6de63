"""Grad-mode and autocast regions: every form, every gradient trap of issue 3.

Each case snapshots the top graph and every region body and replays the
program against eager (outputs, written-back mutations, gradients, grad mode
after the call) through ``export_checked``.
"""

import copy
import io

import pytest
import torch
from expecttest import TestCase

import predispatch_func as pf
from oracle import export_checked, graph_code
from predispatch_func.hop.ops import REGION_HOPS


def region_nodes(ep):
    from predispatch_func.graphs import all_graph_modules
    return [n for _, gm in all_graph_modules(ep.graph_module) for n in gm.graph.nodes
            if n.target in REGION_HOPS]


class MutateInputUnderNoGrad(torch.nn.Module):
    def forward(self, x):
        with torch.no_grad():
            x.mul_(2)
        return x * x


class MutateOuterIntermediateUnderNoGrad(torch.nn.Module):
    def forward(self, x):
        t = x * 3
        with torch.no_grad():
            t.add_(1)
        return t * x


class ClampWeightUnderNoGrad(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x):
        with torch.no_grad():
            self.lin.weight.clamp_(-0.2, 0.2)
        return self.lin(x)


class NoGradInsideAutocast(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.frozen = torch.nn.Linear(4, 4)
        self.head = torch.nn.Linear(4, 4)

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            with torch.no_grad():
                y = self.frozen(x)
            z = self.head(y)
        return z.float()


class TestGradientTraps(TestCase):
    """The four cases where torch 2.13's functional paths give wrong gradients."""

    def test_mutation_of_input_under_no_grad_keeps_its_gradient(self):
        x = torch.randn(3)
        ep = export_checked(MutateInputUnderNoGrad(), (x,))
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, x):
    grad_region_0 = self.grad_region_0
    pf_grad_region = torch.ops.higher_order.pf_grad_region(False, (0,), grad_region_0, x);  grad_region_0 = x = None
    getitem = pf_grad_region[0];  pf_grad_region = None
    mul_1 = torch.ops.aten.mul.Tensor(getitem, getitem)
    return (getitem, mul_1)

# grad_region_0
def forward(self, x):
    mul = torch.ops.aten.mul.Tensor(x, 2);  x = None
    return (mul,)""")
        leaf = x.clone().requires_grad_()
        ep.module()(leaf).sum().backward()
        torch.testing.assert_close(leaf.grad, 2 * leaf.detach())  # 2 * x_new, as eager

    def test_mutation_of_outer_intermediate_under_no_grad_gradient_is_6x_plus_1(self):
        x = torch.randn(4)
        ep = export_checked(MutateOuterIntermediateUnderNoGrad(), (x,))
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, x):
    mul = torch.ops.aten.mul.Tensor(x, 3)
    grad_region_0 = self.grad_region_0
    pf_grad_region = torch.ops.higher_order.pf_grad_region(False, (0,), grad_region_0, mul);  grad_region_0 = mul = None
    getitem = pf_grad_region[0];  pf_grad_region = None
    mul_1 = torch.ops.aten.mul.Tensor(getitem, x);  getitem = x = None
    return (mul_1,)

# grad_region_0
def forward(self, mul):
    add = torch.ops.aten.add.Tensor(mul, 1);  mul = None
    return (add,)""")
        leaf = x.clone().requires_grad_()
        ep.module()(leaf).sum().backward()
        torch.testing.assert_close(leaf.grad, 6 * x + 1)

    def test_weight_clamped_under_no_grad_still_gets_a_gradient(self):
        model = ClampWeightUnderNoGrad()
        ep = export_checked(model, (torch.randn(2, 3),))
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, p_lin_weight, p_lin_bias, x):
    grad_region_0 = self.grad_region_0
    pf_grad_region = torch.ops.higher_order.pf_grad_region(False, (0,), grad_region_0, p_lin_weight);  grad_region_0 = p_lin_weight = None
    getitem = pf_grad_region[0];  pf_grad_region = None
    linear = torch.ops.aten.linear.default(x, getitem, p_lin_bias);  x = p_lin_bias = None
    return (getitem, linear)

# grad_region_0
def forward(self, p_lin_weight):
    clamp = torch.ops.aten.clamp.default(p_lin_weight, -0.2, 0.2);  p_lin_weight = None
    return (clamp,)""")
        program = ep.module()
        program(torch.randn(2, 3)).sum().backward()
        self.assertIsNotNone(program.lin.weight.grad)
        self.assertLessEqual(program.lin.weight.abs().max().item(), 0.2 + 1e-6)

    def test_no_grad_nested_inside_autocast_gives_frozen_layer_no_gradient(self):
        model = NoGradInsideAutocast()
        ep = export_checked(model, (torch.randn(2, 4),))
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, p_frozen_weight, p_frozen_bias, p_head_weight, p_head_bias, x):
    autocast_region_0 = self.autocast_region_0
    pf_autocast_region = torch.ops.higher_order.pf_autocast_region('cpu', torch.bfloat16, True, False, (), autocast_region_0, x, p_frozen_weight, p_frozen_bias, p_head_weight, p_head_bias);  autocast_region_0 = x = p_frozen_weight = p_frozen_bias = p_head_weight = p_head_bias = None
    getitem = pf_autocast_region[0];  pf_autocast_region = None
    _assert_tensor_metadata = torch.ops.aten._assert_tensor_metadata.default(getitem, None, None, torch.bfloat16, device = device(type='cpu'), layout = torch.strided);  _assert_tensor_metadata = None
    _to_copy = torch.ops.aten._to_copy.default(getitem, dtype = torch.float32);  getitem = None
    return (_to_copy,)

# autocast_region_0
def forward(self, x, p_frozen_weight, p_frozen_bias, p_head_weight, p_head_bias):
    grad_region_0 = self.grad_region_0
    pf_grad_region = torch.ops.higher_order.pf_grad_region(False, (), grad_region_0, x, p_frozen_weight, p_frozen_bias);  grad_region_0 = x = p_frozen_weight = p_frozen_bias = None
    getitem = pf_grad_region[0];  pf_grad_region = None
    linear_1 = torch.ops.aten.linear.default(getitem, p_head_weight, p_head_bias);  getitem = p_head_weight = p_head_bias = None
    return (linear_1,)

# autocast_region_0.grad_region_0
def forward(self, x, p_frozen_weight, p_frozen_bias):
    linear = torch.ops.aten.linear.default(x, p_frozen_weight, p_frozen_bias);  x = p_frozen_weight = p_frozen_bias = None
    return (linear,)""")
        program = ep.module()
        program(torch.randn(2, 4)).sum().backward()
        self.assertIsNone(program.frozen.weight.grad)
        self.assertIsNotNone(program.head.weight.grad)
