"""Errors of ``pf.export`` where ``torch.export.export`` raises: the same class (or a subclass) and
torch.export's phrase, which users and their tests match, with our own words after it. Every
program that is exported is replayed against the reference."""

import pytest
import torch
from torch._dynamo.exc import UserError
from torch.export import AdditionalInputs, Dim, ShapesCollection

import predispatch_func as pf
from tests.support.reference import export_checked

SPECIALISED = ("but your code specialized it to be a constant ({n}){place}. If you're using Dim.DYNAMIC, "
               "replace it with either Dim.STATIC or Dim.AUTO")


class FirstThree(torch.nn.Module):
    def forward(self, x, y, zs):
        return x[:3] + y @ torch.cat(zs)


def test_a_specialised_hint_is_named_as_torch_export_names_it():
    """A hint has no name of its own: the input's path, as torch.export's message spells it."""
    x, y, zs = torch.randn(7, 5), torch.randn(3, 6), [torch.randn(2, 5), torch.randn(4, 5)]
    shapes = ShapesCollection()
    for t in (x, y, *zs):
        shapes[t] = (Dim.DYNAMIC, Dim.DYNAMIC)
    with pytest.raises(UserError) as err:
        pf.export(FirstThree(), (x, y, zs), dynamic_shapes=shapes)
    assert "You marked L['y'].size()[0] as dynamic " + SPECIALISED.format(n=3, place=" (user input 1, dim 0)") \
        in str(err.value)
    assert err.value.kind is pf.Refusal.DIM_NOT_DYNAMIC


class Minus(torch.nn.Module):
    def forward(self, x, y):
        return x - y


def test_a_specialised_named_dim_gets_torch_export_s_advice_too():
    with pytest.raises(UserError) as err:
        pf.export(Minus(), (torch.randn(4), torch.randn(4)), dynamic_shapes={"x": (Dim.STATIC,), "y": (Dim("dy"),)})
    assert "You marked dy as dynamic " + SPECIALISED.format(n=4, place=" (user input 1, dim 0)") in str(err.value)
    assert "Suggested fixes:\n  dy = 4" in str(err.value)


class Asserts(torch.nn.Module):
    def __init__(self, low, high):
        super().__init__()
        self.low, self.high = low, high

    def forward(self, n, y):
        assert n > self.low
        assert n < self.high
        return y * n


def test_an_int_hint_s_bounds_are_met_with_the_range_the_trace_infers():
    """As torch.export: the program's range is both; a range in common is the program's guard."""
    spec, y = (Dim.DYNAMIC(min=3, max=10), None), torch.randn(2)
    ep = export_checked(Asserts(3, 6), (4, y), dynamic_shapes=spec)  # traced [4, 5]
    assert [(r.lower, r.upper) for r in ep.range_constraints.values()] == [(4, 5)]
    pf.verify(ep, Asserts(3, 6), (5, y), raise_on_failure=True)
    for outside in (3, 6):
        with pytest.raises(AssertionError, match="Guard failed"):
            ep.module()(outside, y)
    ep = export_checked(Asserts(1, 20), (4, y), dynamic_shapes=spec)  # traced [2, 19]
    assert [(r.lower, r.upper) for r in ep.range_constraints.values()] == [(3, 10)]
    with pytest.raises(AssertionError, match="Guard failed: n <= 10"):
        ep.module()(11, y)


def test_a_hint_s_bounds_that_contradict_the_trace_are_torch_export_s_value_error():
    """Regression: an example outside a hint's bounds was refused before tracing, another class
    and message than torch.export's; several conflicts are listed in one error."""
    spec, y = (Dim.DYNAMIC(min=3, max=10), None), torch.randn(2)
    with pytest.raises(ValueError, match=r"Received user-specified min/max range of \[3, 10\], conflicting with the "
                                         r"inferred min/max range of \[11, 19\], for inputs\['n'\] \(user input 0") as err:
        pf.export(Asserts(10, 20), (14, y), dynamic_shapes=spec)
    assert isinstance(err.value, UserError) and err.value.kind is pf.Refusal.DIM_NOT_DYNAMIC

    class Moo(torch.nn.Module):
        def forward(self, x, y):
            assert x.shape[0] <= 32
            assert y.shape[0] >= 128
            return x + 2, y + 2

    with pytest.raises(ValueError, match=r"(?s)\[33, None\], conflicting with the inferred min/max range of "
                                         r"\[2, 32\], for inputs\['x'\]\.shape\[0\].*\[None, 127\], conflicting with "
                                         r"the inferred min/max range of \[128, int_oo\], for inputs\['y'\]\.shape\[0\]"):
        pf.export(Moo(), (torch.randn(16), torch.randn(256)),
                  dynamic_shapes={"x": (Dim.DYNAMIC(min=33),), "y": (Dim.DYNAMIC(max=127),)})
    with pytest.raises(ValueError, match=r"\[6, 8\], conflicting with the inferred min/max range of \[4, 4\]"):
        pf.export(Minus(), (torch.randn(4), torch.randn(4)), dynamic_shapes={"x": [Dim.STATIC(min=6, max=8)], "y": None})


def test_a_dynamic_hint_the_trace_narrows_to_one_size_is_torch_export_s_value_error():
    class AtMost32(torch.nn.Module):
        def forward(self, x):
            assert x.shape[0] <= 32
            return x + 2

    with pytest.raises(ValueError, match=r"Dim.DYNAMIC\(min=32, max=None\), but tracing inferred a static shape of 32 "
                                         r"for dimension inputs\['x'\]\.shape\[0\]"):
        pf.export(AtMost32(), (torch.randn(32),), dynamic_shapes={"x": {0: Dim.DYNAMIC(min=32)}})


class MatMul(torch.nn.Module):
    def forward(self, x, y):
        return torch.matmul(x, y)


def test_two_named_dims_the_model_makes_equal_are_refused():
    """Regression: the program silently merged K2 into K1 (and guarded their equality)."""
    batch, m, k1, k2, n = torch.export.dims("batch", "M", "K1", "K2", "N")
    args = (torch.randn(10, 2, 3), torch.randn(10, 3, 4))
    with pytest.raises(UserError, match=r"Constraints violated \(K2\)!\n  - The values of K2 = L\['y'\]\.size\(\)\[1\] "
                                        r"\(user input 1, dim 1\) and K1 = L\['x'\]\.size\(\)\[2\] \(user input 0, dim 2\) "
                                        r"must always be equal\nSuggested fixes:\n  K2 = K1") as err:
        pf.export(MatMul(), args, dynamic_shapes={"x": (batch, m, k1), "y": (batch, k2, n)})
    assert err.value.kind is pf.Refusal.DIM_NOT_DYNAMIC
    ep = export_checked(MatMul(), args, dynamic_shapes={"x": (batch, m, k1), "y": (batch, k1, n)})
    pf.verify(ep, MatMul(), (torch.randn(3, 5, 7), torch.randn(3, 7, 2)), raise_on_failure=True)


class GuardsTwoDims(torch.nn.Module):
    def forward(self, x, y):
        if x.shape[0] < 16 and y.shape[1] % 3 == 0:
            return torch.matmul(x, y)
        return x + y


def test_violations_are_in_torch_export_s_words_a_needed_multiple_first():
    batch, m, k, n = torch.export.dims("batch", "M", "K", "N")
    with pytest.raises(UserError, match=r"(?s)Not all values of K .*satisfy the generated guard.*Not all values of "
                                        r"batch .*satisfy the generated guard.*Suggested fixes:.*"
                                        r"batch = Dim\('batch', max=15\).*K = 3\*_K"):
        pf.export(GuardsTwoDims(), (torch.randn(10, 2, 3), torch.randn(10, 3, 4)),
                  dynamic_shapes={"x": (batch, m, k), "y": (batch, k, n)})


class ShiftAdd(torch.nn.Module):
    def forward(self, x, y):
        return x + y[1:]


def test_a_derived_dim_s_guard_names_the_earlier_input_first():
    """torch.export's guard text (``x.size()[0] == -1 + y.size()[0]``), which its users match."""
    dimx = Dim("dimx", min=3, max=6)
    ep = export_checked(ShiftAdd(), (torch.randn(5), torch.randn(6)), dynamic_shapes=({0: dimx}, {0: dimx + 1}))
    with pytest.raises(AssertionError, match=r"Guard failed: x\.size\(\)\[0\] == -1 \+ y\.size\(\)\[0\]"):
        ep.module()(torch.randn(4), torch.randn(6))
    pf.verify(ep, ShiftAdd(), (torch.randn(4), torch.randn(5)), raise_on_failure=True)


class FirstThreeTimesK(torch.nn.Module):
    def forward(self, x, y, z):
        return (x + y[0])[:3] * z["k"]


def test_additional_inputs_the_program_cannot_run_are_refused_at_export():
    """Regression: an example the trace specialised away was accepted; torch.export verifies them."""
    args = (torch.randn(4), [torch.randn(4)], {"k": torch.randn(3)})
    extra = AdditionalInputs()
    extra.add((torch.randn(2), [torch.randn(2)], {"k": torch.randn(3)}))
    with pytest.raises(RuntimeError, match="Expected input.*to be >= 3, but got 2"):
        pf.export(FirstThreeTimesK(), args, dynamic_shapes=extra)


class Nested(torch.nn.Module):
    def forward(self, x):
        return x["k"]["k"][0] + x["k"]["k"][1]


NESTED = ({"k": {"k": [torch.rand(4), torch.rand(4)]}},)
_dim = Dim("dim")
SPEC_MISMATCHES = {
    "a list given as a tuple": (({"k": {"k": (_dim, _dim)}},),
                                "`inputs[0]['k']['k']` is a <class 'list'>, but `dynamic_shapes[0]['k']['k']` is a "
                                "<class 'tuple'>"),
    "a Dim for a tensor's shapes": (({"k": {"k": [_dim, _dim]}},),
                                    "Unexpected input tensor shape Dim('dim', min=0) specified at "
                                    "`dynamic_shapes[0]['k']['k'][0]`"),
    "one entry too many": (({"k": {"k": [(_dim,), (_dim,), (_dim,)]}},),
                           "`inputs[0]['k']['k']` has 2 elements, but `dynamic_shapes[0]['k']['k']` has 3 elements"),
    "a mistyped key": (({"k": {"K": [(_dim,), (_dim,)]}},),
                       "`inputs[0]['k']` has keys ['k'], but `dynamic_shapes[0]['k']` has keys ['K']"),
    "the input's dict for the call's": ({"k": {"k": [_dim, _dim]}},
                                        "its top-level keys must be the arg names ['x'] of `inputs`, but here they "
                                        "are ['k']. Since here `inputs` is a list/tuple enclosing a single dict"),
    "dims for fewer dims than the tensor has": ({"x": {"k": {"k": [(_dim, None), (_dim,)]}}},
                                                "Expected dynamic shape spec (Dim('dim', min=0), None) at "
                                                "`dynamic_shapes['x']['k']['k'][0]` to have the same length as the "
                                                "actual tensor shape torch.Size([4]) (expected 1, but got 2 instead)"),
    # regressions: a string was taken as a Dim, an index past the tensor's dims crashed (IndexError)
    "a string for a dim": (({"k": {"k": [{0: "dim"}, None]}},),
                           "Unexpected dimension mapped to index 0 in input tensor shape {0: 'dim'} specified at "
                           "`dynamic_shapes[0]['k']['k'][0]` (expected None, an int, a Dim, Dim.AUTO, Dim.STATIC, "
                           "or Dim.DYNAMIC, but got 'dim' instead)"),
    "an index the tensor does not have": (({"k": {"k": [{1: Dim.AUTO}, None]}},),
                                          "Index 1 in input tensor shape {1: DimHint(AUTO)} specified at "
                                          "`dynamic_shapes[0]['k']['k'][0]` is out of range: the tensor has 1 dims"),
    "a float index": (({"k": {"k": [{0.0: _dim}, None]}},), "Unexpected index 0.0 in input tensor shape"),
    "one dim twice": (({"k": {"k": [{0: _dim, -1: _dim}, None]}},), "Dim 0 is given twice in input tensor shape"),
}


@pytest.mark.parametrize("name", list(SPEC_MISMATCHES))
def test_a_spec_that_does_not_mirror_the_inputs_is_refused_in_torch_export_s_words(name):
    """Regression: a mistyped key or a missing entry left dims silently static (or crashed)."""
    spec, text = SPEC_MISMATCHES[name]
    with pytest.raises(UserError) as err:
        pf.export(Nested(), NESTED, dynamic_shapes=spec)
    assert text in str(err.value)
    assert err.value.kind is pf.Refusal.DYNAMIC_SHAPES_SPEC


class Scale(torch.nn.Module):
    def forward(self, y):
        return y * 2 + y.shape[1]


@pytest.mark.parametrize("index", [-1, 1])
def test_a_negative_index_counts_from_the_last_dim_as_in_torch_export(index):
    """Regression: ``{-1: Dim("n")}`` was refused as a specialisation of "dim -1"."""
    y = torch.rand(3, 4)
    ep = export_checked(Scale(), (y,), dynamic_shapes={"y": {index: Dim("n")}})
    rows, cols = next(n for n in ep.graph.nodes if n.op == "placeholder").meta["val"].shape
    assert rows == 3 and not isinstance(cols, int)
    pf.verify(ep, Scale(), (torch.rand(3, 7),), raise_on_failure=True)


class TimesInt(torch.nn.Module):
    def forward(self, y, n):
        return y * n


INT_SPECS = {  # regressions: a string or a float made the int dynamic, a dict or a wrong int was ignored
    "a string": ("n", "Unexpected dynamic shape spec 'n' for the int input at `dynamic_shapes['n']`"),
    "a float": (2.0, "Unexpected dynamic shape spec 2.0 for the int input"),
    "a tensor's spec": ({0: Dim.AUTO}, "Unexpected dynamic shape spec {0: DimHint(AUTO)} for the int input"),
    "another int": (6, "Static shape constraint of 6 does not match input value of 5, for the int input at "
                       "`dynamic_shapes['n']`"),
}


@pytest.mark.parametrize("name", list(INT_SPECS))
def test_a_spec_an_int_input_cannot_take_is_refused(name):
    spec, text = INT_SPECS[name]
    with pytest.raises(UserError) as err:
        pf.export(TimesInt(), (torch.rand(3), 5), dynamic_shapes={"y": None, "n": spec})
    assert text in str(err.value)


def test_an_int_input_spec_of_its_own_value_keeps_it_static():
    ep = export_checked(TimesInt(), (torch.rand(3), 5), dynamic_shapes={"y": None, "n": 5})
    assert [n.meta.get("val") for n in ep.graph.nodes if n.op == "placeholder"][1] == 5


def test_a_spec_that_mirrors_the_inputs_in_another_key_order_is_taken():
    ep = export_checked(Nested(), NESTED, dynamic_shapes=({"k": {"k": [(_dim,), (_dim,)]}},))
    pf.verify(ep, Nested(), ({"k": {"k": [torch.rand(6), torch.rand(6)]}},), raise_on_failure=True)


def test_call_errors_are_the_classes_and_phrases_of_torch_export():
    with pytest.raises(UserError, match="Expecting `args` to be a tuple of example positional inputs"):
        pf.export(torch.nn.Linear(2, 2), torch.randn(1, 2))
    with pytest.raises(ValueError, match="Exporting a ScriptModule is not supported"):
        pf.export(torch.jit.script(torch.nn.Linear(2, 2)), (torch.randn(1, 2),))

    class WritesAConstant(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.foo = torch.randn(2, 2)

        def forward(self, x):
            self.foo.add_(5)
            return self.foo + x

    with pytest.raises(RuntimeError, match="Constant foo is mutated in the forward method") as err:
        pf.export(WritesAConstant(), (torch.ones(2, 2),))
    assert err.value.kind is pf.Refusal.WRITE_TO_TENSOR_ATTRIBUTE


class ConvPool(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, kernel_size=3, padding=1)

    def forward(self, x):
        return torch.nn.functional.max_pool2d(self.conv(x).relu(), 3)


def test_a_convolution_leaves_a_dynamic_batch_unbounded():
    """Regression: conv's fake kernel picks a CPU backend by batch size (mkldnn from 16), which
    bounded a named batch Dim to [2, 15] and refused it; torch.export traces with those backends off."""
    model = ConvPool()
    ep = export_checked(model, (torch.randn(2, 3, 8, 8),), dynamic_shapes=({0: Dim("batch")},))
    assert [(r.lower, r.upper) for r in ep.range_constraints.values()] == [(0, torch.utils._sympy.numbers.int_oo)]
    pf.verify(ep, model, (torch.randn(17, 3, 8, 8),), raise_on_failure=True)


class FlatSums(torch.nn.Module):
    def forward(self, x, y, z):
        return x.reshape([-1]) + y.reshape([-1]) + z


def test_a_relation_no_derived_dim_can_declare_is_the_program_s_guard():
    """Regression: ``dz0 = dx0*dx1`` was refused, naming a derived Dim nobody can write; torch.export
    keeps the relation as a guard the program checks."""
    spec = {"x": [Dim(f"dx{i}", min=2) for i in range(2)], "y": [Dim(f"dy{i}", min=2) for i in range(2)],
            "z": [Dim("dz0", min=4)]}
    model = FlatSums()
    ep = export_checked(model, (torch.randn(6, 8), torch.randn(3, 16), torch.randn(48)), dynamic_shapes=spec)
    pf.verify(ep, model, (torch.randn(5, 8), torch.randn(4, 10), torch.randn(40)), raise_on_failure=True)
    with pytest.raises(AssertionError, match="Guard failed"):
        ep.module()(torch.randn(5, 8), torch.randn(4, 10), torch.randn(30))


class OffsetSums(torch.nn.Module):
    def forward(self, x, y, z):
        return x + y[1:] + z[2:]


def test_a_named_dim_the_model_makes_a_derived_dim_s_root_is_refused():
    """Regression: the model made ``dimz`` the root ``_dimz`` of ``_dimz - 2`` and ``_dimz - 1``,
    which no input has; the two were merged silently. torch.export names the Dim to declare."""
    root = Dim("_dimz", min=6, max=8)
    args = (torch.randn(5), torch.randn(6), torch.randn(7))
    with pytest.raises(UserError, match=r"The values of dimz = L\['z'\]\.size\(\)\[0\] \(user input 2, dim 0\) must "
                                        r"always be related to the values of _dimz - 2 = L\['x'\]\.size\(\)\[0\] .*by "
                                        r"dimz = _dimz\nSuggested fixes:\n  dimz = _dimz"):
        pf.export(OffsetSums(), args, dynamic_shapes=({0: root - 2}, {0: root - 1}, {0: Dim("dimz", min=6, max=8)}))
    ep = export_checked(OffsetSums(), args, dynamic_shapes=({0: root - 2}, {0: root - 1}, {0: root}))
    pf.verify(ep, OffsetSums(), (torch.randn(6), torch.randn(7), torch.randn(8)), raise_on_failure=True)


class ThreeOfOneSize(torch.nn.Module):
    def forward(self, x):
        return x[0]["data"] + x[1] + x[2][2:]


def test_a_relation_s_fix_names_the_dim_the_other_fixes_keep():
    """Regression: with dx10 = dx00 also suggested, ``dx20 = dx10 + 2`` named a Dim the refined spec
    no longer has as a root, and torch's refine_dynamic_shapes_from_suggested_fixes built no Dim."""
    from torch.export.dynamic_shapes import refine_dynamic_shapes_from_suggested_fixes

    model = ThreeOfOneSize()
    args = (({"data": torch.randn(4, 4)}, torch.randn(4, 4), torch.randn(6, 4)),)
    spec = {"x": ({"data": (Dim("dx00"), Dim("dx01"))}, (Dim("dx10"), Dim("dx11")), (Dim("dx20"), Dim("dx21")))}
    with pytest.raises(UserError) as err:
        pf.export(model, args, dynamic_shapes=spec)
    assert ("The values of dx20 = L['x'][2].size()[0] (user input 2, dim 0) must always be related to the values of "
            "dx00 = L['x'][0]['data'].size()[0] (user input 0, dim 0) by dx20 = dx00 + 2") in str(err.value)
    refined = refine_dynamic_shapes_from_suggested_fixes(err.value.msg, spec)
    assert refined["x"][2][0].root is refined["x"][0]["data"][0] and refined["x"][2][0].fn(10) == 12
    ep = export_checked(model, args, dynamic_shapes=refined)
    pf.verify(ep, model, (({"data": torch.randn(5, 3)}, torch.randn(5, 3), torch.randn(7, 3)),), raise_on_failure=True)


class MaxOfTensorAndSize(torch.nn.Module):
    """Python's ``max`` compares a tensor with an int: ``bool()`` of a many-element tensor."""

    def forward(self, x):
        return max(x, x.shape[0])


class BoolOfEmpty(torch.nn.Module):
    def forward(self, x):
        return x + 1 if x[:0] else x - 1


@pytest.mark.parametrize("model, x, shapes, phrase", [
    (MaxOfTensorAndSize(), torch.randn(4, 4), {"x": {0: Dim.AUTO}}, "more than one value"),
    (BoolOfEmpty(), torch.randn(3), None, "no values"),
], ids=["many", "empty"])
def test_bool_of_a_tensor_fails_with_eager_s_text(model, x, shapes, phrase):
    """Regression: ``bool()`` of a tensor in forward reached ``item()`` first and failed with "a Tensor
    with 4*s6 elements cannot be converted to Scalar"; eager and torch.export say why it is refused."""
    text = f"Boolean value of Tensor with {phrase} is ambiguous"
    with pytest.raises(RuntimeError, match=text):
        model(x)
    with pytest.raises(RuntimeError, match=text):
        pf.export(model, (x,), dynamic_shapes=shapes)


class MaxOfScalars(torch.nn.Module):
    """``bool()`` of a one-element tensor the trace can still decide (its size is static)."""

    def forward(self, x, n):
        return x * max(n.shape[0], x.shape[0]) + min(x.sum(), x.max())


def test_max_and_min_over_tensors_and_sizes_keep_eager_s_values():
    model = MaxOfScalars()
    ep = export_checked(model, (torch.randn(3), torch.randn(5)),
                        dynamic_shapes={"x": {0: Dim("a")}, "n": {0: Dim("b")}})
    for a, b in ((4, 2), (2, 6)):
        args = (torch.randn(a), torch.randn(b))
        pf.verify(ep, model, args, raise_on_failure=True)


class SubclassParameter(torch.nn.Module):
    """A TwoTensor parameter: ops on it are traced (its own API in forward:
    tests/program/test_tensor_subclasses_in_forward.py)."""

    def __init__(self):
        super().__init__()
        from torch.testing._internal.two_tensor import TwoTensor

        self.param = torch.nn.Parameter(TwoTensor(torch.ones(4, 4), torch.ones(4, 4)))


def test_a_missing_attribute_of_a_plain_tensor_stays_torch_s_error():
    class Typo(torch.nn.Module):
        def forward(self, x):
            return x.no_such_method()

    with pytest.raises(AttributeError, match="no_such_method") as err:
        pf.export(Typo(), (torch.randn(2),))
    assert not isinstance(err.value, pf.UnsupportedError)


def test_ops_on_a_subclass_parameter_are_still_traced():
    """The neighbour that works: no subclass API, only ops (replayed against the reference)."""
    class Ops(SubclassParameter):
        def forward(self, x):
            return x + (2 * self.param).sum()

    export_checked(Ops(), (torch.randn(4, 4),))


def _torch_s_fixes(model, args, shapes) -> str:
    """torch.export's suggested fixes for the same refusal (a drift check of our solver's)."""
    with pytest.raises(UserError) as err:
        torch.export.export(model, args, dynamic_shapes=shapes)
    return str(err.value).split("Suggested fixes:\n")[1].split("\n\n")[0].rstrip()


class FlattenPlusDerived(torch.nn.Module):
    def forward(self, x, y):
        return x.reshape([-1]) + y


def test_a_guard_that_allows_one_size_of_a_root_is_a_specialisation_with_that_size_as_the_fix():
    """Regression: ``x: (dy - 6, 2)`` flattened and added to ``y: (dy,)`` holds only for dy = 12
    (2*(dy - 6) == dy); the fix named a range (``dy >= 8``) that the program would still refuse."""
    dy = Dim("dy", min=6)
    model, x, y = FlattenPlusDerived(), torch.randn(6, 2), torch.randn(12)
    with pytest.raises(UserError) as err:
        pf.export(model, (x, y), dynamic_shapes={"x": (dy - 6, 2), "y": (dy,)})
    text = str(err.value)
    assert "Specializations unexpectedly required (dy)!" in text
    assert "solving the guards generated for dy - 6 = L['x'].size()[0] resulted in a specialized value of 6" in text
    assert text.endswith("Suggested fixes:\n  dy = 12") and "dy - 6 = 6" not in text
    assert _torch_s_fixes(model, (x, y), {"x": (dy - 6, 2), "y": (dy,)}) == "  dy = 12"
    export_checked(model, (x, y), dynamic_shapes={"x": (6, 2), "y": (12,)})  # the fix taken


class ThreeRelated(torch.nn.Module):
    def forward(self, x, y, z):
        if x.shape[0] >= 5 and x.shape[0] <= 36 and y.shape[0] % 3 == 0:
            return x + y[1:] + z[3:]
        return x


def test_a_divisibility_of_a_related_size_introduces_a_new_root_in_the_fixes():
    """Regression: ``(dx + 1) % 3 == 0`` (``y = x + 1`` sizes, ``y % 3`` checked) was left out of the
    fixes, which named ``dx``'s range only; torch.export's introduce a root ``_dx`` and spell every
    related dim in it. The fixes taken export, and the program is eager's at other sizes."""
    from torch.export import dims

    dx, dy, dz = dims("dx", "dy", "dz")
    model, args = ThreeRelated(), (torch.randn(11), torch.randn(12), torch.randn(14))
    with pytest.raises(UserError) as err:
        pf.export(model, args, dynamic_shapes={"x": (dx,), "y": (dy,), "z": (dz,)})
    assert str(err.value).endswith("Suggested fixes:\n  _dx = Dim('_dx', max=12)\n  dx = 3*_dx - 1\n"
                                   "  dy = 3*_dx\n  dz = 3*_dx + 2")
    assert str(err.value).endswith(_torch_s_fixes(model, args, {"x": (dx,), "y": (dy,), "z": (dz,)}))
    _dx = Dim("_dx", min=2, max=12)
    ep = export_checked(model, args, dynamic_shapes={"x": (3 * _dx - 1,), "y": (3 * _dx,), "z": (3 * _dx + 2,)})
    for n in (2, 7, 12):
        other = (torch.randn(3 * n - 1), torch.randn(3 * n), torch.randn(3 * n + 2))
        pf.verify(ep, model, other, raise_on_failure=True)
