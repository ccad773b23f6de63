"""Regressions found by the differential fuzzer (tests/fuzz), one tiny module each.

Each module is the shrunk program the fuzzer printed, trimmed by hand to the
lines that matter; every test exports, checks the contract and replays
against the reference (outputs, written-back inputs and buffers, gradients).
"""

import pytest
import torch
from expecttest import TestCase

import predispatch_func as pf
from tests.support.expect_refusal import refused
from tests.support.reference import export_checked, graph_code, replay_calls
from tests.support.torch_release import torch_limit


class CopyIntoBufferFromGradInput(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("buf", torch.zeros(2, 4))

    def forward(self, x):
        self.buf.copy_(x)
        return self.buf * 2


class CopyIntoTransposedView(torch.nn.Module):
    def forward(self, x, y):
        a = x * 1.0
        a.t().copy_(y)
        return a.view(-1)


class CopyIntoStridedView(torch.nn.Module):
    def forward(self, x, y):
        a = x * 1.0
        v = a[:, ::2]
        v.copy_(y)
        return a, v


class CopyFromNonGradSourceOverGradIntermediate(torch.nn.Module):
    def forward(self, x):
        y = x * 2
        y.copy_(x > 0)
        return y, x


class TestFuzzRegressions(TestCase):
    def test_copy_into_buffer_from_grad_input_is_differentiable(self):
        # aten.copy (functional copy_) has no derivative: the program could not be trained
        export_checked(CopyIntoBufferFromGradInput(), (torch.randn(2, 4, requires_grad=True),))

    def test_copy_from_non_grad_source_keeps_requires_grad(self):
        # eager's copy_ result still requires grad (zero gradient to the overwritten tensor)
        export_checked(CopyFromNonGradSourceOverGradIntermediate(), (torch.randn(2, 3, requires_grad=True),))

    def test_copy_into_transposed_view_keeps_layout(self):
        export_checked(CopyIntoTransposedView(), (torch.randn(3, 4, requires_grad=True),
                                                  torch.randn(4, 3, requires_grad=True)))

    def test_copy_into_strided_view_is_differentiable(self):
        export_checked(CopyIntoStridedView(), (torch.randn(3, 4, requires_grad=True),
                                               torch.randn(3, 1, requires_grad=True)))


class WriteThroughDetachOfInput(torch.nn.Module):
    def forward(self, x, y):
        x.detach().clamp_(min=-0.5, max=0.5)
        return x * y


class TestWritesToGradLeafInputs(TestCase):
    def test_write_through_detach_of_plain_input_is_written_back(self):
        # verify must not make a written input require grad: the program's copy_
        # write-back is refused on a leaf that requires grad, eager's detach() write is not
        export_checked(WriteThroughDetachOfInput(), (torch.randn(4), torch.randn(4, requires_grad=True)))

    def test_write_through_detach_of_grad_input(self):
        # torch's module() would refuse the copy_ write-back on this leaf; ours writes under no_grad
        export_checked(WriteThroughDetachOfInput(), (torch.randn(4, requires_grad=True), torch.randn(4)))


class WriteThroughDetachOfIntermediate(torch.nn.Module):
    def forward(self, x):
        y = x * 2
        y.detach().mul_(3)
        return y * x


class TestWritesThroughDetach(TestCase):
    def test_write_through_detach_keeps_eager_gradient(self):
        export_checked(WriteThroughDetachOfIntermediate(), (torch.randn(3, requires_grad=True),))


class WriteGradValueThroughDetach(torch.nn.Module):
    def forward(self, x, y):
        d = y.detach()
        d.copy_(x * 2)
        return d * x, y


class DoublesIntoADetachedAlias(torch.nn.Module):
    """From the fuzzer: the value written may require grad (a float input's), but nothing does here."""

    def forward(self, x1):
        v = x1.detach()
        v.narrow(0, 0, 2).copy_(x1 * 2)
        return v + x1


class WritesItsLinearIntoADetachedAlias(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x1):
        v = x1.detach()
        v.copy_(self.lin(x1))
        return v * x1


class WritesThroughDetachInACondBranch(torch.nn.Module):
    def forward(self, x):
        def branch(x):
            y = x * 1
            v = y.detach()
            v.copy_(x * 2)
            return v + y
        return torch.cond(x.sum() > 0, branch, lambda x: x + 1, (x,))


class TestGradValueThroughDetach(TestCase):
    def test_write_of_grad_value_through_detach_is_refused(self):
        with refused(pf.Refusal.GRAD_VALUE_THROUGH_DETACH, r"written through a detach\(\)-ed alias[\s\S]*d.copy_"):
            pf.export(WriteGradValueThroughDetach(), (torch.randn(3, requires_grad=True), torch.randn(3)))

    def test_write_through_detach_of_a_value_no_gradient_reaches_exports_and_equals_eager(self):
        """Was refused because the value *may* require grad when the program runs; with nothing
        requiring grad in the export, the write changes no gradient."""
        for model, args in [(DoublesIntoADetachedAlias(), (torch.randn(2, 3),)),
                            (WriteGradValueThroughDetach(), (torch.randn(3), torch.randn(3))),
                            (WriteGradValueThroughDetach(), (torch.randn(3), torch.randn(3, requires_grad=True))),
                            (WritesItsLinearIntoADetachedAlias().requires_grad_(False), (torch.randn(2, 3),))]:
            ep = export_checked(model, args)
            replay_calls(ep, model, args, calls=2)

    def test_the_program_refuses_to_run_where_the_write_would_change_a_gradient(self):
        """The program holds while the inputs the value came from do not require grad: called
        with one that does, it refuses, naming the input and the model's line."""
        ep = pf.export(DoublesIntoADetachedAlias(), (torch.randn(2, 3),))
        with refused(pf.Refusal.GRAD_VALUE_THROUGH_DETACH, r"exported with x1 not requiring grad[\s\S]*"
                     r"v.narrow\(0, 0, 2\).copy_\(x1 \* 2\)"):
            ep.module()(torch.randn(2, 3, requires_grad=True))
        x = torch.randn(2, 3, requires_grad=True)
        with torch.no_grad():  # no gradient anywhere: eager's result
            expected = DoublesIntoADetachedAlias()(x.detach().clone())
            torch.testing.assert_close(ep.module()(x.detach().clone().requires_grad_()), expected)

    def test_write_through_detach_of_a_value_that_requires_grad_is_refused_from_an_input_or_a_parameter(self):
        with refused(pf.Refusal.GRAD_VALUE_THROUGH_DETACH, r"requires grad[\s\S]*v.narrow"):
            pf.export(DoublesIntoADetachedAlias(), (torch.randn(2, 3, requires_grad=True),))
        with refused(pf.Refusal.GRAD_VALUE_THROUGH_DETACH, r"requires grad[\s\S]*v.copy_\(self.lin\(x1\)\)"):
            pf.export(WritesItsLinearIntoADetachedAlias(), (torch.randn(2, 3),))

    def test_write_through_detach_inside_a_cond_branch_is_refused(self):
        """Was silently wrong: inside torch's functionalization of a HOP body the operands are
        wrappers the grad reach never saw, so the write became a plain no_grad write and the
        program's input gradient lost the alias's history (eager's is 3x larger here; torch.export's
        non-functional program keeps the in-place op and is right). No program input stands for
        a body's operands, so nothing could be checked when the program runs: refused."""
        for requires_grad in (False, True):
            with refused(pf.Refusal.GRAD_VALUE_THROUGH_DETACH, r"inside a torch higher-order op's body[\s\S]*"
                         r"v.copy_\(x \* 2\)"):
                pf.export(WritesThroughDetachInACondBranch(), (torch.rand(3).add(0.1).requires_grad_(requires_grad),))

    def test_a_frozen_parameter_the_value_came_from_is_checked_when_the_program_runs(self):
        model = WritesItsLinearIntoADetachedAlias().requires_grad_(False)
        program = pf.export(model, (torch.randn(2, 3),)).module()
        program.lin.weight.requires_grad_(True)  # unfrozen after export: eager's gradient would differ
        with refused(pf.Refusal.GRAD_VALUE_THROUGH_DETACH, r"exported with lin.weight not requiring grad"):
            program(torch.randn(2, 3))

    @pytest.mark.xfail(strict=True, raises=pf.UnsupportedError,
                       reason="eager keeps two autograd histories for one storage (the detached alias "
                       "gets the written value's, the aliased tensor keeps its own); one functional "
                       "value per storage cannot carry both")
    def test_write_of_grad_value_through_detach(self):
        export_checked(WriteGradValueThroughDetach(), (torch.randn(3, requires_grad=True),
                                                       torch.randn(3, requires_grad=True)))


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


class CopyInputIntoInputThenWriteIt(torch.nn.Module):
    def forward(self, x, y):
        y.copy_(x)
        x.sin_()
        return y


class TestWriteBackOrder(TestCase):
    def test_new_value_that_is_an_input_written_later(self):
        # y's new value is x's old value, i.e. the placeholder x; module() writes x back
        # first, so the program must carry a copy of it
        ep = export_checked(CopyInputIntoInputThenWriteIt(), (torch.randn(2), torch.randn(2)))
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, x, y):
    clone = torch.ops.aten.clone.default(x)
    clone_default = torch.ops.aten.clone.default(x);  x = None
    sin = torch.ops.aten.sin.default(clone_default);  clone_default = None
    return (sin, clone, clone)""")


class CopyInputIntoInputUnderNoGrad(torch.nn.Module):
    def forward(self, x, y):
        with torch.no_grad():
            x.copy_(y)
        return y


class CopyIntermediateIntoInputUnderNoGrad(torch.nn.Module):
    def forward(self, x, y):
        w = y * 2
        with torch.no_grad():
            x.copy_(w)
        return w


class TestOutputsSharingAWrite(TestCase):
    def test_returned_input_copied_into_another_input(self):
        # x's new value is the placeholder y: module() must still return y, not x
        export_checked(CopyInputIntoInputUnderNoGrad(), (torch.randn(3), torch.randn(3)))

    def test_returned_intermediate_copied_into_an_input(self):
        # w is x's new value and an output: module() must return w, not the written x
        export_checked(CopyIntermediateIntoInputUnderNoGrad(), (torch.randn(3), torch.randn(3)))


class ViewOfInputThatBecomesAnotherInputsValue(torch.nn.Module):
    def forward(self, x, y):
        v = y.flatten(0)
        y.copy_(x)
        x.add_(0.5)
        return v


class TwoInputsWrittenWithOneValue(torch.nn.Module):
    def forward(self, x, y):
        v = y.expand_as(x)
        v.copy_(x)
        s = y + x
        x.copy_(y)
        return s


class TestWriteBackAliasing(TestCase):
    def test_view_of_an_input_whose_value_is_another_input(self):
        # y's new value is x's placeholder, so v is a view of x, which module() writes back
        # (x + 0.5) before returning v
        export_checked(ViewOfInputThatBecomesAnotherInputsValue(), (torch.randn(1, 4, 3),
                                                                   torch.randn(1, 4, 3)))

    def test_two_inputs_written_with_one_value(self):
        # torch's signature keys mutations by output name: one node for two mutations
        # made ExportedProgram reject the signature (SpecViolationError)
        export_checked(TwoInputsWrittenWithOneValue(), (torch.randn(1), torch.randn(1)))


class WriteToACopyMadeFromADetachedAlias(torch.nn.Module):
    def forward(self, x, y):
        d = y.detach()
        c = d.to(x)  # float64 -> float32: a copy, not an alias
        c.copy_(y)
        return c * x, y


class ViewOfBufferWrittenThroughTranspose(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("buf", torch.randn(4, 1, 2))

    def forward(self, x):
        v = self.buf.view(2, 4)
        v.t().masked_fill_(x > 0, -2.0)
        return v, self.buf


class TestDetachAndViewReplays(TestCase):
    def test_write_to_a_copy_of_a_detached_alias_is_plain(self):
        # .to() may alias; here it copied, so the write is no write through detach()
        export_checked(WriteToACopyMadeFromADetachedAlias(), (torch.randn(2, 3, requires_grad=True),
                                                             torch.randn(3, dtype=torch.float64,
                                                                         requires_grad=True)))

    def test_view_replay_after_write_through_transpose_is_refused(self):
        with refused(pf.Refusal.VIEW_REPLAY_AFTER_STRIDED_WRITE, r"cannot replay a \.view\(\)[\s\S]*masked_fill_"):
            pf.export(ViewOfBufferWrittenThroughTranspose(), (torch.randn(4, 2),))

    @torch_limit("torch's functionalization replays the inverse of .view() with view on the "
                 "non-contiguous value written through the transpose (torch's own export and "
                 "aot_export_module fail the same way; VIEW_REPLAY_AFTER_STRIDED_WRITE)", raises=pf.UnsupportedError)
    def test_view_replay_after_write_through_transpose(self):
        export_checked(ViewOfBufferWrittenThroughTranspose(), (torch.randn(4, 2),))


class TwoInputsWrittenFromOneInput(torch.nn.Module):
    def forward(self, x, y, z):
        y.copy_(z)
        x.copy_(z)
        return y


class TwoWritesThroughOneDetachedAlias(torch.nn.Module):
    def forward(self, x):
        d = x.detach()
        d.sub_(1.0)
        d.sub_(1.5)
        return x.unsqueeze(0)


class TestMoreWriteBacks(TestCase):
    def test_two_inputs_written_from_one_input(self):
        # each mutation needs a node of its own (SpecViolationError when they shared a copy)
        export_checked(TwoInputsWrittenFromOneInput(), (torch.randn(3), torch.randn(3), torch.randn(3)))

    def test_two_writes_through_one_detached_alias(self):
        # the second write's region reads the replayed detach(); the first region now also
        # returns x's written value so the second can carry its identity
        export_checked(TwoWritesThroughOneDetachedAlias(), (torch.randn(3, requires_grad=True),))


class CopyDetachedValueOverGradIntermediate(torch.nn.Module):
    def forward(self, x):
        v = x - x
        v.copy_(x.detach())
        return v.to(torch.float64)


class TestCopySameLayout(TestCase):
    def test_copy_of_same_layout_value_keeps_dst_autograd_link(self):
        # copy_'s same-layout shortcut made v's new value the detached tensor itself
        export_checked(CopyDetachedValueOverGradIntermediate(),
                       (torch.randn(2, 4, dtype=torch.float64, requires_grad=True),))


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


# --- views rebuilt by functionalization in the grad mode eager made them in -----------------


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


# --- writes the extended generator (out=, parameters) found ---------------------------------


class OutVariantWriteUnderNoGrad(torch.nn.Module):
    def forward(self, x):
        v = x.view_as(x)
        with torch.no_grad():
            torch.clamp(v, -1, 2, out=v)  # out= is keyword-only: once not seen as a write
        return v


class BufferCopiedFromParameterThenOverwritten(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("buf", torch.zeros(3))
        self.w = torch.nn.Parameter(torch.randn(3))

    def forward(self, x):
        self.buf.copy_(self.w)  # buf now requires grad (a copy of w)
        v = self.buf.view_as(self.buf)
        v.copy_(torch.ones_like(v))  # eager: still requires grad (dst did)
        return v * x


class TestWritesFoundByExtendedGenerator(TestCase):
    def test_out_variant_write_under_no_grad_keeps_autograd_identity(self):
        export_checked(OutVariantWriteUnderNoGrad(), (torch.randn(2, 3),))

    def test_copy_over_a_buffer_holding_a_parameter_keeps_requires_grad(self):
        ep = export_checked(BufferCopiedFromParameterThenOverwritten(), (torch.randn(3),))
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, p_w, b_buf, x):
    clone = torch.ops.aten.clone.default(p_w);  p_w = None
    view_1 = torch.ops.aten.view.default(clone, [3]);  clone = None
    ones_like = torch.ops.aten.ones_like.default(view_1, pin_memory = False)
    slice_scatter = torch.ops.aten.slice_scatter.default(view_1, ones_like);  view_1 = ones_like = None
    view_2 = torch.ops.aten.view.default(slice_scatter, [3]);  slice_scatter = None
    view_3 = torch.ops.aten.view.default(view_2, [3])
    mul = torch.ops.aten.mul.Tensor(view_3, x);  view_3 = x = None
    return (view_2, mul)""")


class BufferWrittenThroughViewByGradValue(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("buf", torch.randn(3))

    def forward(self, x):
        v = self.buf[0::1]
        v.mul_(x)  # eager's mul_ saves a copy of the old v; ours reads buf through a view
        return v


class TestWriteBackGuardThroughViews(TestCase):
    def test_op_reading_a_written_buffer_through_a_view_reads_a_clone(self):
        # module() writes buf back after the forward; the mul that saved a view of the old
        # buf for backward then failed with "modified by an inplace operation"
        ep = export_checked(BufferWrittenThroughViewByGradValue(), (torch.randn(3),))
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, b_buf, x):
    slice_1 = torch.ops.aten.slice.Tensor(b_buf, 0, 0, 9223372036854775807)
    clone_default = torch.ops.aten.clone.default(slice_1);  slice_1 = None
    mul = torch.ops.aten.mul.Tensor(clone_default, x);  clone_default = x = None
    slice_scatter = torch.ops.aten.slice_scatter.default(b_buf, mul, 0, 0, 9223372036854775807);  b_buf = mul = None
    slice_2 = torch.ops.aten.slice.Tensor(slice_scatter, 0, 0, 9223372036854775807)
    return (slice_scatter, slice_2)""")


class SplitPieceReadAfterBaseWritten(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(2))

    def forward(self, x):
        x.mul_(self.w)
        first, second = torch.split(x, [1, 1], 0)
        x.copy_(self.w)  # eager's autograd now refuses any use of first with grad on
        return first, second


class TestEagerThatCannotDifferentiate(TestCase):
    def test_split_piece_read_after_its_base_was_written(self):
        # verify once crashed building eager's loss; eager's refusal now means "no
        # gradients to compare", and values, written-back inputs and state still are
        model, args = SplitPieceReadAfterBaseWritten(), (torch.randn(2),)
        ep = export_checked(model, args)
        report = pf.verify(ep, model, args)
        self.assertTrue(report.ok, report)
        self.assertTrue(any(c.startswith("no gradients") for c in report.checked), report.checked)


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


class OutputViewsAnInputThroughARegion(torch.nn.Module):
    def forward(self, x, y):
        x.copy_(y)  # x's value is now y's placeholder
        y.sin_()
        with torch.no_grad():
            v = x.unsqueeze(-1)  # a region result that views y's input when the program runs
        return v


class TestWriteBackThroughRegionResults(TestCase):
    def test_region_result_viewing_an_input_written_back_gets_its_own_copy(self):
        # module() writes y back before returning v; v, a region result that views y's
        # input, came back with y's new value
        export_checked(OutputViewsAnInputThroughARegion(), (torch.randn(3), torch.randn(3)))


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


class InputCopiedFromParameterThenParameterDataWritten(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(3))

    def forward(self, x):
        x.copy_(self.w)  # eager: x is a copy, and sin saves that copy
        v = x.sin()
        self.w.data += 0.5  # invisible to autograd: sin's saved copy keeps the old value
        return v


class BufferCopiedFromParameterThenParameterDataWritten(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(3))
        self.register_buffer("b", torch.zeros(3))

    def forward(self, x):
        self.b.copy_(self.w)
        v = self.b.exp() * x
        self.w.data.mul_(2)
        return v


class InputCopiedFromGradInputThenSourceWrittenUnderNoGrad(torch.nn.Module):
    def forward(self, x, y):
        x.copy_(y)
        v = x.sin()
        with torch.no_grad():
            y.add_(1)  # a leaf that requires grad may be written under no_grad
        return v


class InputCopiedFromAViewOfAnInputThenWritten(torch.nn.Module):
    def forward(self, x, y):
        x.copy_(y[0])
        v = x.cos()
        with torch.no_grad():
            y.mul_(3)
        return v


class TestCopySourceWrittenLater(TestCase):
    """``dst.copy_(src)`` into an unwritten input: the program may use ``src``'s value
    for ``dst``, but not ``src``'s graph input itself when that is written later (its
    write-back would change what the backward saved; eager saved a copy)."""

    def test_input_copied_from_parameter_then_parameter_data_written(self):
        export_checked(InputCopiedFromParameterThenParameterDataWritten(), (torch.randn(3),))

    def test_buffer_copied_from_parameter_then_parameter_data_written(self):
        export_checked(BufferCopiedFromParameterThenParameterDataWritten(), (torch.randn(3),))

    def test_input_copied_from_grad_input_then_source_written_under_no_grad(self):
        export_checked(InputCopiedFromGradInputThenSourceWrittenUnderNoGrad(),
                       (torch.randn(3), torch.randn(3, requires_grad=True)))

    def test_input_copied_from_a_view_of_an_input_then_written(self):
        export_checked(InputCopiedFromAViewOfAnInputThenWritten(),
                       (torch.randn(3), torch.randn(2, 3, requires_grad=True)))

    def test_copy_from_an_input_written_later_is_not_the_input_itself(self):
        ep = export_checked(InputCopiedFromParameterThenParameterDataWritten(), (torch.randn(3),))
        sin = next(n for n in ep.graph.nodes if n.target is torch.ops.aten.sin.default)
        self.assertNotEqual(sin.args[0].op, "placeholder", graph_code(ep))


class DetachedValueWrittenThroughData(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("buf", torch.randn(3))

    def forward(self, x):
        v = x.detach()
        self.buf.add_(v)         # computed from x, but through a detach: no gradient
        x.data.copy_(self.buf)   # a write through .data of a value that never requires grad
        return v * 2, x.sin()


class TestDetachCutsGradReach(TestCase):
    def test_value_behind_detach_written_through_data_runs_with_grad_inputs(self):
        # the program refused to run with x requiring grad: "a value computed from x written
        # through a detach()-ed alias", though nothing behind a detach carries a gradient
        ep = export_checked(DetachedValueWrittenThroughData(), (torch.randn(3, requires_grad=True),))
        x = torch.randn(3, requires_grad=True)
        ep.module()(x)  # no refusal


class InputViewCopiedFromGradInputThenSourceWritten(torch.nn.Module):
    def forward(self, x, y):
        v = x.view(2, 2)
        v.copy_(y)  # the view's new value is y's: the program must not read y's input for it
        r = v.sin()
        with torch.no_grad():
            y.mul_(2)
        return r


class TestCopySourceWrittenLaterThroughViews(TestCase):
    def test_input_view_copied_from_grad_input_then_source_written(self):
        export_checked(InputViewCopiedFromGradInputThenSourceWritten(),
                       (torch.randn(4), torch.randn(2, 2, requires_grad=True)))
