"""Views rebuilt by functionalization in the grad mode eager made them in
(trace/view_grad_modes.py): a stale view is rebuilt when next read, possibly under another grad
mode, and must keep the autograd link eager fixed when the view was made.

Shrunk from programs the differential fuzzer (tests/fuzz) printed; replayed against the reference.
"""

import torch
from expecttest import TestCase

from tests.support.reference import export_checked, graph_code


class ViewOfViewMadeUnderNoGrad(torch.nn.Module):
    def forward(self, x0, x1):
        with torch.set_grad_enabled(False):
            x1.zero_()
            v1 = x1.unsqueeze(-2)
        v4 = v1.expand(2, 1, 3)  # functionalization rebuilds this from x1, with grad on
        return (x1, v4)


class TestViewsOfViewsMadeUnderNoGrad(TestCase):
    def test_view_of_a_view_made_under_no_grad_gives_its_base_no_gradient(self):
        export_checked(ViewOfViewMadeUnderNoGrad(), (torch.randn(2, 3, dtype=torch.float64),
                                                     torch.randn(3)))


class ViewOfWrittenInputUsedInsideRegion(torch.nn.Module):
    def forward(self, x):
        with torch.no_grad():
            x.zero_()
            v = x.unsqueeze(-2)
            w = v + 1  # v is rebuilt here, inside the region that wrote x
        return v * 2, w


class GradViewReadUnderNoGradAfterWriteThroughView(torch.nn.Module):
    def forward(self, x):
        y = x * 1
        v = y.t()
        y[0].mul_(2)  # v is stale
        with torch.no_grad():
            z = v + 1  # functionalization rebuilds v here, with grad off
        return v, z


class EinsumAliasReadUnderNoGradAfterWrite(torch.nn.Module):
    def forward(self, x):
        v = torch.einsum("ij->ji", x)  # an alias of x, made with grad on
        with torch.no_grad():
            x.zero_()
            c = torch.cat([v, x], dim=1)
        return v, c


class GradViewWrittenUnderNoGradAfterItsBase(torch.nn.Module):
    def forward(self, x, y):
        v = x.reshape_as(y)
        with torch.no_grad():
            x.sin_()
            v.sin_()  # v is stale when written: rebuilt first, with grad on
        return v


class GradViewReturnedWithGradLeftOff(torch.nn.Module):
    def forward(self, x):
        v = x.t()
        torch.set_grad_enabled(False)
        x.mul_(2)
        return v  # read with grad off at return


class ViewOfNoGradViewMadeWithGrad(torch.nn.Module):
    def forward(self, x):
        with torch.no_grad():
            v = x.unsqueeze(-2)
        return v.expand(2, 1, 3)  # eager: requires grad (through v, a leaf of its own)


class TestViewsRebuiltInTheirGradMode(TestCase):
    """Functionalization rebuilds a stale view when it is next read, in the grad mode of
    that read; eager fixed the view's autograd link when it was made (trace/view_grad_modes.py)."""

    def test_view_of_input_written_in_same_region_reads_the_carried_value(self):
        ep = export_checked(ViewOfWrittenInputUsedInsideRegion(), (torch.randn(3, 4),))
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, x):
    grad_region_0 = self.grad_region_0
    pf_grad_region = torch.ops.higher_order.pf_grad_region(False, (0,), grad_region_0, x);  grad_region_0 = x = None
    getitem = pf_grad_region[0];  pf_grad_region = None
    grad_region_1 = self.grad_region_1
    pf_grad_region_1 = torch.ops.higher_order.pf_grad_region(False, (), grad_region_1, getitem);  grad_region_1 = None
    getitem_1 = pf_grad_region_1[0]
    getitem_2 = pf_grad_region_1[1];  pf_grad_region_1 = None
    mul = torch.ops.aten.mul.Tensor(getitem_1, 2);  getitem_1 = None
    return (getitem, mul, getitem_2)

# grad_region_0
def forward(self, x):
    zero = torch.ops.aten.zero.default(x);  x = None
    return (zero,)

# grad_region_1
def forward(self, getitem):
    unsqueeze_1 = torch.ops.aten.unsqueeze.default(getitem, -2);  getitem = None
    add = torch.ops.aten.add.Tensor(unsqueeze_1, 1)
    return (unsqueeze_1, add)""")

    def test_grad_view_read_under_no_grad_keeps_its_gradient(self):
        ep = export_checked(GradViewReadUnderNoGradAfterWriteThroughView(), (torch.randn(3, 4),))
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, x):
    mul = torch.ops.aten.mul.Tensor(x, 1);  x = None
    select = torch.ops.aten.select.int(mul, 0, 0)
    mul_1 = torch.ops.aten.mul.Tensor(select, 2);  select = None
    select_scatter = torch.ops.aten.select_scatter.default(mul, mul_1, 0, 0);  mul = mul_1 = None
    t_1 = torch.ops.aten.t.default(select_scatter);  select_scatter = None
    grad_region_0 = self.grad_region_0
    pf_grad_region = torch.ops.higher_order.pf_grad_region(False, (), grad_region_0, t_1);  grad_region_0 = None
    getitem = pf_grad_region[0];  pf_grad_region = None
    return (t_1, getitem)

# grad_region_0
def forward(self, t_1):
    add = torch.ops.aten.add.Tensor(t_1, 1);  t_1 = None
    return (add,)""")

    def test_einsum_alias_read_under_no_grad_after_write(self):
        export_checked(EinsumAliasReadUnderNoGradAfterWrite(), (torch.randn(3, 3),))

    def test_grad_view_written_under_no_grad_after_its_base(self):
        export_checked(GradViewWrittenUnderNoGradAfterItsBase(), (torch.randn(2, 3), torch.randn(3, 2)))

    def test_grad_view_returned_with_grad_left_off(self):
        # coverage of the return path (outputs are read with grad still off), not a bug found
        export_checked(GradViewReturnedWithGradLeftOff(), (torch.randn(3, 4),))

    def test_view_of_no_grad_view_made_with_grad_requires_grad(self):
        ep = export_checked(ViewOfNoGradViewMadeWithGrad(), (torch.randn(3),))
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, x):
    grad_region_0 = self.grad_region_0
    pf_grad_region = torch.ops.higher_order.pf_grad_region(False, (), grad_region_0, x);  grad_region_0 = x = None
    getitem = pf_grad_region[0];  pf_grad_region = None
    expand = torch.ops.aten.expand.default(getitem, [2, 1, 3]);  getitem = None
    return (expand,)

# grad_region_0
def forward(self, x):
    unsqueeze = torch.ops.aten.unsqueeze.default(x, -2);  x = None
    return (unsqueeze,)""")
