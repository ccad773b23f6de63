"""Tensor subclasses built or taken apart in ``forward`` (TwoTensor: the mechanism of torchao's
quantized weights), ported from PyTorch's ``TestExport`` (``test_capture_subclass_constructor``,
``test_export_aten_to_unflatten_subclass`` and its ``_pre_dispatch`` variant) and neighbours.

torch.export records a subclass built in forward as a ``flat_apply`` of its constructor and an
inner tensor read as ``export.access_subclass_inner_tensor``; ours writes the same nodes in a
functional program (trace/extensions/tensor_subclasses.py). Every program is replayed against
eager (outputs, written inputs and buffers, gradients) by ``export_checked``; what a functional
program cannot say (a write to a subclass's inner tensor) is refused."""

import operator

import pytest
import torch
from expecttest import TestCase
from torch.testing._internal.two_tensor import TwoTensor

import predispatch_func as pf
from tests.support.reference import export_checked, graph_code

ACCESS = torch.ops.export.access_subclass_inner_tensor.default


def _targets(ep) -> list[str]:
    return [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]


class BuildsAndReadsApart(torch.nn.Module):
    """A TwoTensor holding a TwoTensor, built from the input, added to a TwoTensor buffer; the
    result's ``b.a`` returned (torch's ``test_capture_subclass_constructor``)."""

    def __init__(self):
        super().__init__()
        self.buffer = torch.nn.Buffer(TwoTensor(torch.randn(4, 4), torch.randn(4, 4)))

    def forward(self, x):
        nested = TwoTensor(x, TwoTensor(x, x)) + self.buffer
        total = x + nested
        return total.b.a


class Bar(torch.nn.Module):
    def forward(self, x):
        return x.sum()


class ConvertsAndCallsAMethod(torch.nn.Module):
    """A TwoTensor parameter converted, passed to a submodule whose call signature is preserved,
    and the subclass's own method on the result (torch's ``test_export_aten_to_unflatten_subclass``)."""

    def __init__(self):
        super().__init__()
        self.bar = Bar()
        self.param = torch.nn.Parameter(TwoTensor(torch.ones(4, 4), torch.ones(4, 4)))

    def forward(self, x):
        converted = self.param.to(torch.float)
        return (self.bar(converted).sum() + x.sum()).get_elem_a()


class BuiltTimesParameter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.param = torch.nn.Parameter(TwoTensor(torch.randn(4, 4), torch.randn(4, 4)))

    def forward(self, x):
        return (TwoTensor(x, x * 2) * self.param).sum()


class ReturnsABuiltSubclass(torch.nn.Module):
    def forward(self, x):
        return TwoTensor(x, x * 2)


class InnerOfAParameter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.param = torch.nn.Parameter(TwoTensor(torch.randn(4, 4), torch.randn(4, 4)))

    def forward(self, x):
        return x + self.param.b * self.param.get_elem_a()


class WritesAnInnerBeforeTheSecondRead(torch.nn.Module):
    def forward(self, x):
        inner = x.clone()
        pair = TwoTensor(inner, inner * 3)
        before = pair + 1
        inner.mul_(2)  # eager: pair.a is inner, so the second read sees the write
        after = pair + 1
        return before.a + after.a + after.b


class ReadsABuiltSubclassTwice(torch.nn.Module):
    def forward(self, x):
        pair = TwoTensor(x, x + 1)
        return (pair * 2 + pair).b


class BuildsInsideARegion(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.buffer = torch.nn.Buffer(TwoTensor(torch.randn(4), torch.randn(4)))

    def forward(self, x):
        with torch.no_grad():
            frozen = (TwoTensor(x * 2, x * 3) + self.buffer).b
        return x * frozen


class TestSubclassesInForward(TestCase):
    def test_a_subclass_built_in_forward_and_read_apart_is_torch_exports_program(self):
        model, x = BuildsAndReadsApart(), torch.randn(4, 4)
        ep = export_checked(model, (x,))
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, b_buffer, x):
    twotensor_unflatten_const_func_spec0 = self.twotensor_unflatten_const_func_spec0
    twotensor_unflatten0 = self.twotensor_unflatten0
    flat_apply = torch.ops.higher_order.flat_apply(twotensor_unflatten_const_func_spec0, twotensor_unflatten0, x, x);  twotensor_unflatten_const_func_spec0 = twotensor_unflatten0 = None
    twotensor_unflatten_const_func_spec1 = self.twotensor_unflatten_const_func_spec1
    twotensor_unflatten1 = self.twotensor_unflatten1
    flat_apply_1 = torch.ops.higher_order.flat_apply(twotensor_unflatten_const_func_spec1, twotensor_unflatten1, x, flat_apply);  twotensor_unflatten_const_func_spec1 = twotensor_unflatten1 = flat_apply = None
    add = torch.ops.aten.add.Tensor(flat_apply_1, b_buffer);  flat_apply_1 = b_buffer = None
    add_1 = torch.ops.aten.add.Tensor(x, add);  x = add = None
    access_subclass_inner_tensor = torch.ops.export.access_subclass_inner_tensor.default(add_1, 'b');  add_1 = None
    access_subclass_inner_tensor_1 = torch.ops.export.access_subclass_inner_tensor.default(access_subclass_inner_tensor, 'a');  access_subclass_inner_tensor = None
    return (access_subclass_inner_tensor_1,)""")  # noqa: B950
        fresh = torch.randn(4, 4)
        torch.testing.assert_close(ep.module()(fresh), model(fresh))

    def test_torchs_decompositions_take_the_subclass_out_of_the_program(self):
        """As for torch.export's program: ``run_decompositions`` desugars the buffer into its
        inner tensors and the built subclasses away, and the result still equals eager."""
        model, x = BuildsAndReadsApart(), torch.randn(4, 4)
        ep = pf.export(model, (x,))
        with torch.inference_mode():
            plain = ep.run_decompositions({})
        self.assertExpectedInline(str(plain.graph).strip(), """\
graph():
    %b_parametrizations_buffer_original0 : [num_users=0] = placeholder[target=b_parametrizations_buffer_original0]
    %b_parametrizations_buffer_original1 : [num_users=1] = placeholder[target=b_parametrizations_buffer_original1]
    %x : [num_users=2] = placeholder[target=x]
    %add_1 : [num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%x, %b_parametrizations_buffer_original1), kwargs = {})
    %add_4 : [num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%x, %add_1), kwargs = {})
    return (add_4,)""")  # noqa: B950
        fresh = torch.randn(4, 4)
        torch.testing.assert_close(plain.module()(fresh), model(fresh))

    def test_a_subclass_method_on_a_result_reads_its_inner_tensor(self):
        model, x = ConvertsAndCallsAMethod(), torch.randn(4, 4)
        ep = export_checked(model, (x,), preserve_module_call_signature=("bar",))
        # the no-op conversion leaves no node (only its metadata check), as in torch's training IR
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, p_param, x):
    _assert_tensor_metadata = torch.ops.aten._assert_tensor_metadata.default(p_param, None, None, torch.float32, device = device(type='cpu'), layout = torch.strided);  _assert_tensor_metadata = None
    sum_1 = torch.ops.aten.sum.default(p_param);  p_param = None
    sum_2 = torch.ops.aten.sum.default(sum_1);  sum_1 = None
    sum_3 = torch.ops.aten.sum.default(x);  x = None
    add = torch.ops.aten.add.Tensor(sum_2, sum_3);  sum_2 = sum_3 = None
    access_subclass_inner_tensor = torch.ops.export.access_subclass_inner_tensor.default(add, 'a');  add = None
    return (access_subclass_inner_tensor,)""")  # noqa: B950

    def test_the_preserved_call_taking_a_subclass_parameter_unflattens_and_cannot_be_desugared(self):
        """torch's ``_pre_dispatch`` variant: the preserved ``bar`` is a submodule of the
        unflattened program that sums the parameter it is given, and the unflattened program
        equals eager. ``run_decompositions`` would desugar the parameter into two tensors the
        preserved signature cannot take, so torch refuses it (naming the parameter), as for
        torch.export's program."""
        model, x = ConvertsAndCallsAMethod(), torch.randn(4, 4)
        ep = pf.export(model, (x,), preserve_module_call_signature=("bar",))
        unflat = torch.export.unflatten(ep)
        summed = [n for n in unflat.bar.graph.nodes if n.target is torch.ops.aten.sum.default]
        self.assertEqual(len(summed), 1)
        self.assertEqual(summed[0].args[0].target, operator.getitem)  # the flattened argument, the parameter
        torch.testing.assert_close(unflat(x), model(x))
        with pytest.raises(Exception, match="p_param"):
            ep.run_decompositions()

    def test_a_built_subclass_times_a_subclass_parameter_keeps_eager_gradients(self):
        """Built from an input that requires grad, the subclass is a new autograd leaf in eager and
        in the replay alike; the parameter's gradient (a TwoTensor) is eager's."""
        model, x = BuiltTimesParameter(), torch.randn(4, 4, requires_grad=True)
        ep = export_checked(model, (x,))
        report = pf.verify(ep, model, (x,), raise_on_failure=True)
        self.assertIn("gradients", report.checked)
        self.assertEqual(_targets(ep), ["aten.mul.Tensor", "flat_apply", "aten.mul.Tensor", "aten.sum.default"])

    def test_a_built_subclass_returned_is_rebuilt_by_the_program(self):
        model, x = ReturnsABuiltSubclass(), torch.randn(4, 4)
        ep = export_checked(model, (x,))
        out = ep.module()(x)
        self.assertIs(type(out), TwoTensor)
        torch.testing.assert_close((out.a, out.b), (x, x * 2))

    def test_inner_tensors_of_a_parameter_read_by_attribute_and_by_method(self):
        ep = export_checked(InnerOfAParameter(), (torch.randn(4, 4),))
        self.assertEqual(sorted(n.args[1] for n in ep.graph.nodes if n.target is ACCESS), ["a", "b"])

    def test_a_built_subclass_read_again_after_its_inner_tensor_was_written_sees_the_write(self):
        ep = export_checked(WritesAnInnerBeforeTheSecondRead(), (torch.randn(4),))
        self.assertEqual(_targets(ep).count("flat_apply"), 2)

    def test_a_subclass_built_inside_a_no_grad_region_is_rebuilt_inside_its_body(self):
        """The ``flat_apply``'s specs move into the region's body with it (they are read there only)."""
        ep = export_checked(BuildsInsideARegion(), (torch.randn(4, requires_grad=True),))
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, b_buffer, x):
    grad_region_0 = self.grad_region_0
    pf_grad_region = torch.ops.higher_order.pf_grad_region(False, (), grad_region_0, x, b_buffer);  grad_region_0 = b_buffer = None
    getitem = pf_grad_region[0];  pf_grad_region = None
    mul_2 = torch.ops.aten.mul.Tensor(x, getitem);  x = getitem = None
    return (mul_2,)

# grad_region_0
def forward(self, x, b_buffer):
    mul = torch.ops.aten.mul.Tensor(x, 2)
    mul_1 = torch.ops.aten.mul.Tensor(x, 3);  x = None
    twotensor_unflatten_const_func_spec0 = self.twotensor_unflatten_const_func_spec0
    twotensor_unflatten0 = self.twotensor_unflatten0
    flat_apply = torch.ops.higher_order.flat_apply(twotensor_unflatten_const_func_spec0, twotensor_unflatten0, mul, mul_1);  twotensor_unflatten_const_func_spec0 = twotensor_unflatten0 = mul = mul_1 = None
    add = torch.ops.aten.add.Tensor(flat_apply, b_buffer);  flat_apply = b_buffer = None
    access_subclass_inner_tensor = torch.ops.export.access_subclass_inner_tensor.default(add, 'b');  add = None
    return (access_subclass_inner_tensor,)""")  # noqa: B950

    def test_a_built_subclass_read_twice_is_recorded_once(self):
        ep = export_checked(ReadsABuiltSubclassTwice(), (torch.randn(4),))
        self.assertEqual(_targets(ep).count("flat_apply"), 1)


class WritesAnInnerOfABuffer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.buf = torch.nn.Buffer(TwoTensor(torch.randn(4), torch.randn(4)))

    def forward(self, x):
        self.buf.a.add_(x)
        return self.buf * 2


class WritesAViewOfAnInner(WritesAnInnerOfABuffer):
    def forward(self, x):
        self.buf.b[:2].zero_()
        return self.buf * 2


class WritesABuiltSubclass(torch.nn.Module):
    def forward(self, x):
        pair = TwoTensor(x.clone(), x.clone())
        pair.add_(1)
        return pair.a


class BuildsFromATensorOutsideTheTrace(torch.nn.Module):
    def forward(self, x):
        return (TwoTensor(_OUTSIDE, x) + 1).b


_OUTSIDE = torch.ones(4)


@pytest.mark.parametrize("model, what, line", [
    (WritesAnInnerOfABuffer(), "writes in place to an inner tensor", "self.buf.a.add_(x)"),
    (WritesAViewOfAnInner(), "writes in place to an inner tensor", "self.buf.b[:2].zero_()"),
    (WritesABuiltSubclass(), "or to a subclass built in forward", "pair.add_(1)"),
    (BuildsFromATensorOutsideTheTrace(), "holds a tensor that is no value of the trace", "TwoTensor(_OUTSIDE, x)"),
], ids=["inner-of-a-buffer", "view-of-an-inner", "built-subclass", "tensor-from-outside"])
def test_what_the_functional_program_cannot_say_is_a_clear_refusal(model, what, line):
    x = torch.randn(4)
    model(x.clone())  # eager runs it
    with pytest.raises(pf.UnsupportedError, match=what) as err:
        pf.export(model, (x,))
    assert err.value.kind is pf.Refusal.TENSOR_SUBCLASS_IN_FORWARD
    assert line in str(err.value) and "test_tensor_subclasses_in_forward.py" in str(err.value)


class Scaled(torch.Tensor):
    """A wrapper subclass whose results keep a tensor attribute (``scale``) that its
    ``__tensor_flatten__`` does not list."""

    @staticmethod
    def __new__(cls, data):
        return torch.Tensor._make_wrapper_subclass(cls, data.shape, dtype=data.dtype, device=data.device)

    def __init__(self, data):
        self.data_ = data
        self.scale = data.abs().amax()

    def __tensor_flatten__(self):
        return ["data_"], None

    @staticmethod
    def __tensor_unflatten__(inner, meta, size, stride):
        return Scaled(inner["data_"])

    @classmethod
    def __torch_dispatch__(cls, func, types, args, kwargs=None):
        unwrapped = torch.utils._pytree.tree_map_only(Scaled, lambda t: t.data_, (args, kwargs or {}))
        out = func(*unwrapped[0], **unwrapped[1])
        return torch.utils._pytree.tree_map_only(torch.Tensor, Scaled, out)


class ReadsAnUnlistedTensor(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(Scaled(torch.randn(4)), requires_grad=False)

    def forward(self, x):
        return x * (self.weight * 2).scale


def test_a_tensor_attribute_the_subclass_does_not_flatten_is_refused():
    model, x = ReadsAnUnlistedTensor(), torch.randn(4)
    model(x)
    with pytest.raises(pf.UnsupportedError, match="reads 'scale' of tensor subclass Scaled") as err:
        pf.export(model, (x,))
    assert err.value.kind is pf.Refusal.TENSOR_SUBCLASS_IN_FORWARD


class MetadataOfAParameter(torch.nn.Module):
    """ConstantExtraMetadataTensor keeps a constant (``constant_attribute``) and a method reading it."""

    def __init__(self):
        super().__init__()
        from torch.testing._internal.custom_tensor import ConstantExtraMetadataTensor

        self.p = torch.nn.Parameter(ConstantExtraMetadataTensor(torch.ones(3, 4)))

    def forward(self, x):
        scaled = 2 * self.p + 1
        return (scaled + scaled.constant_attribute).sum() * x + self.p.get_complicated_metadata().foo


def test_a_subclass_s_metadata_and_a_method_reading_it_are_constants_of_the_program():
    model, x = MetadataOfAParameter(), torch.randn(3, 4)
    ep = export_checked(model, (x,))
    assert "torch.ops.aten.add.Tensor(add, 4)" in ep.graph_module.code  # constant_attribute, read as 4
    assert "torch.ops.aten.add.Tensor(mul_1, 4)" in ep.graph_module.code  # get_complicated_metadata().foo


class ReadsAnInnerNamedElem(torch.nn.Module):
    def __init__(self):
        super().__init__()
        from torch.testing._internal.custom_tensor import ConstantExtraMetadataTensor

        self.p = torch.nn.Parameter(ConstantExtraMetadataTensor(ConstantExtraMetadataTensor(torch.ones(3, 4))))


class AddsTheInner(ReadsAnInnerNamedElem):
    def forward(self, x):
        return x + (2 * self.p).elem


class ReadsTheInnersInner(ReadsAnInnerNamedElem):
    def forward(self, x):
        return x + (2 * self.p).elem.elem


@pytest.mark.parametrize("model", [AddsTheInner(), ReadsTheInnersInner()], ids=["op", "attribute"])
def test_an_inner_tensor_named_like_the_traced_tensors_own_attribute_is_refused(model):
    """``elem`` is FunctionalTensor's own attribute (its C++ wrapper): ``t.elem`` never reaches the
    subclass lookup. Without this refusal the first model exported with a wrong gradient."""
    x = torch.randn(3, 4)
    model(x)
    with pytest.raises(pf.UnsupportedError, match="'elem'") as err:
        pf.export(model, (x,))
    assert err.value.kind is pf.Refusal.TENSOR_SUBCLASS_IN_FORWARD
    assert ".elem" in str(err.value)


class BuildsFromADynamicInput(torch.nn.Module):
    def forward(self, x):
        return (TwoTensor(x, x * 2) + 1).b


def test_a_subclass_built_with_symbolic_sizes_is_rebuilt_with_the_sizes_of_each_call():
    """The rebuild takes the outer sizes and strides as arguments when they are symbolic: the
    program replays at other sizes (a static rebuild holds them as constants)."""
    model, x = BuildsFromADynamicInput(), torch.randn(4)
    ep = export_checked(model, (x,), dynamic_shapes={"x": {0: torch.export.Dim("n")}})
    for n in (3, 7):
        y = torch.randn(n)
        torch.testing.assert_close(ep.module()(y), model(y))
    [call] = [n for n in ep.graph.nodes if n.op == "call_function" and "flat_apply" in str(n.target)]
    assert len(call.args) == 2 + 2 + 2  # the two specs, a and b, the size and the stride
