"""Writes and views inside grad-off regions keep eager's autograd identities: a view written
under no_grad stays differentiable, a view made under no_grad is a leaf of its own, a write in a
no_grad region nested in an autocast region keeps its base's identity, one region result never
has to carry two identities.

Shrunk from programs the differential fuzzer (tests/fuzz) printed; replayed against the reference.
"""

import torch
from expecttest import TestCase

import predispatch_func as pf
from tests.support.reference import export_checked, graph_code


class WriteThroughViewUnderNoGrad(torch.nn.Module):
    def forward(self, x):
        v = x.unsqueeze(0)
        with torch.no_grad():
            v.masked_fill_(x > 0, 0.5)
        return v


class ViewMadeUnderNoGradAfterWrite(torch.nn.Module):
    def forward(self, x):
        with torch.no_grad():
            x.zero_()
            v = x.unsqueeze(0)
        return v


class WritesUnderAutocastWithGradOff(torch.nn.Module):
    def forward(self, x):
        v = torch.maximum(x, x)
        torch.set_grad_enabled(False)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            v.zero_()
            x.copy_(v)
            x.masked_fill_(x > 0, -2.0)
        torch.set_grad_enabled(True)
        return v


class TestRegionsFromFuzzing(TestCase):
    def test_writes_under_autocast_with_grad_off(self):
        # x.copy_(v) under no_grad once made x's new value the very node of v, so one
        # region result had to carry two autograd identities
        export_checked(WritesUnderAutocastWithGradOff(), (torch.randn(2),))

    def test_view_written_under_no_grad_keeps_requires_grad(self):
        # eager: the view stays differentiable (its own autograd identity is kept)
        export_checked(WriteThroughViewUnderNoGrad(), (torch.randn(3),))

    def test_view_made_under_no_grad_of_written_input_is_a_leaf_that_requires_grad(self):
        # eager: a view made under no_grad of a tensor that requires grad is a leaf of its
        # own that requires grad; ours once made it from the region's fresh value
        ep = export_checked(ViewMadeUnderNoGradAfterWrite(), (torch.randn(4),))
        out = ep.module()(torch.randn(4, requires_grad=True))
        self.assertTrue(out.requires_grad)
        self.assertIsNone(out.grad_fn)

    def test_view_made_under_no_grad_gives_its_base_no_gradient(self):
        x = torch.randn(4)
        ep = pf.export(ViewMadeUnderNoGradAfterWrite(), (x,))
        grads = []
        for run in (ViewMadeUnderNoGradAfterWrite(), ep.module()):
            leaf = x.clone().requires_grad_()
            out = run(leaf)
            self.assertTrue(out.requires_grad)  # a leaf of its own, with no history back to x
            (leaf.sum() * 3 + out.sum()).backward()
            grads.append(leaf.grad)
        torch.testing.assert_close(grads[1], grads[0])  # only leaf.sum() * 3 reaches x


class ParameterViewMadeAndWrittenUnderNoGrad(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(3))

    def forward(self, x):
        with torch.no_grad():
            v = self.w.view(3)  # eager: a leaf of its own that requires grad
            v.neg_()            # written in the region that made it: still that leaf
        return x * 2, v


class TestViewMadeAndWrittenInOneRegion(TestCase):
    def test_parameter_view_made_and_written_under_no_grad_requires_grad(self):
        ep = export_checked(ParameterViewMadeAndWrittenUnderNoGrad(), (torch.randn(3),))
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, p_w, x):
    grad_region_0 = self.grad_region_0
    pf_grad_region = torch.ops.higher_order.pf_grad_region(False, (), grad_region_0, p_w);  grad_region_0 = None
    getitem = pf_grad_region[0];  pf_grad_region = None
    grad_region_1 = self.grad_region_1
    pf_grad_region_1 = torch.ops.higher_order.pf_grad_region(False, (1, 0), grad_region_1, getitem, p_w);  grad_region_1 = getitem = p_w = None
    getitem_1 = pf_grad_region_1[0]
    getitem_2 = pf_grad_region_1[1];  pf_grad_region_1 = None
    mul = torch.ops.aten.mul.Tensor(x, 2);  x = None
    return (getitem_1, mul, getitem_2)

# grad_region_0
def forward(self, p_w):
    view = torch.ops.aten.view.default(p_w, [3]);  p_w = None
    return (view,)

# grad_region_1
def forward(self, getitem, p_w):
    neg = torch.ops.aten.neg.default(getitem);  getitem = None
    view_1 = torch.ops.aten.view.default(neg, [3]);  neg = None
    view_2 = torch.ops.aten.view.default(view_1, [3])
    return (view_1, view_2)""")


class WriteThroughViewInNoGradNestedInAutocast(torch.nn.Module):
    def forward(self, x):
        torch.set_grad_enabled(False)
        x.add_(1.5)
        v = x.view(-1)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            v.tanh()  # the region of the write below is nested in the autocast region
            v.clamp_(min=-0.5, max=0.5)
            w = v.reshape(-1)
            torch.set_grad_enabled(True)
            torch.set_grad_enabled(False)
        torch.set_grad_enabled(True)
        return w


class TestIdentityThroughNestedRegions(TestCase):
    def test_write_through_view_in_no_grad_nested_in_autocast_keeps_base_identity(self):
        # x's old value was outside the autocast region, which did not pass it in, so the
        # no_grad region inside could not carry x's identity to its new value
        export_checked(WriteThroughViewInNoGradNestedInAutocast(), (torch.randn(3),))
