"""``pf.export`` where ``torch.export.export`` stood: its arguments, its dynamic-shape forms,
and the error classes a pipeline written for it catches. Every program is replayed
against the reference, at the example sizes and at others the trace never saw."""

import copy
import dataclasses
import inspect
import math

import pytest
import torch
from torch._dynamo.exc import UserError
from torch.export import AdditionalInputs, Dim, ShapesCollection
from torch.fx.experimental.symbolic_shapes import ConstraintViolationError

import predispatch_func as pf
from predispatch_func.graphs import all_graph_modules
from tests.support.reference import export_checked


def test_takes_every_argument_torch_export_takes():
    """Positional ones by position (torch calls the model ``mod``), keyword-only ones by name:
    a keyword torch.export adds on a new release fails here."""
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    theirs, ours = inspect.signature(torch.export.export).parameters, inspect.signature(pf.export).parameters
    positional = [n for n, p in theirs.items() if p.kind in kinds]
    assert len([n for n, p in ours.items() if p.kind in kinds]) == len(positional)
    for name, param in theirs.items():
        if param.kind is inspect.Parameter.KEYWORD_ONLY:
            assert name in ours and ours[name].kind is inspect.Parameter.KEYWORD_ONLY, name
            assert ours[name].default == param.default, name


def test_strict_and_deferred_asserts_are_accepted():
    model, x = torch.nn.Linear(3, 2), torch.randn(4, 3)
    for strict in (False, True):
        ep = export_checked(model, (x,), strict=strict, prefer_deferred_runtime_asserts_over_guards=True)
        assert "aten.linear.default" in str(ep.graph)


class KeywordOnly(torch.nn.Module):
    def forward(self, x, *, kw1, kw2):
        return x.sum() + kw1 * 2 + kw2.sum()


def test_sequence_spec_follows_the_signature_not_the_call_order():
    """Regression: the spec of kw1 was applied to kw2 when the call passed kw2 first."""
    model = KeywordOnly()
    x, kw1, kw2 = torch.randn(3), torch.randn(4), torch.randn(5)
    spec = (None, {0: Dim("a")}, {0: Dim("b")})  # x, kw1, kw2: forward's order
    ep = export_checked(model, (x,), {"kw2": kw2, "kw1": kw1}, dynamic_shapes=spec)
    assert len(ep.range_constraints) == 2
    for n1, n2 in ((6, 7), (9, 2)):
        kwargs = {"kw1": torch.randn(n1), "kw2": torch.randn(n2)}
        pf.verify(ep, model, (x,), kwargs, raise_on_failure=True)
        torch.testing.assert_close(ep.module()(x, **kwargs), model(x, **kwargs))


def test_sequence_spec_of_the_wrong_length_is_a_clear_error():
    with pytest.raises(pf.UnsupportedError, match="has 2 entries but the call binds 3 arguments"):
        pf.export(KeywordOnly(), (torch.randn(3),), {"kw1": torch.randn(4), "kw2": torch.randn(5)},
                  dynamic_shapes=(None, {0: Dim("a")}))


class AddSum(torch.nn.Module):
    def forward(self, x, y):
        return x * 2 + y.sum()


def test_shapes_collection():
    model, x, y = AddSum(), torch.randn(4, 3), torch.randn(2)
    shapes = ShapesCollection()
    shapes[x] = {0: Dim("n")}
    ep = export_checked(model, (x, y), dynamic_shapes=shapes)
    (constraint,) = ep.range_constraints.values()
    pf.verify(ep, model, (torch.randn(9, 3), y), raise_on_failure=True)
    with pytest.raises(Exception, match="y"):  # y stayed static: the program guards it
        ep.module()(torch.randn(4, 3), torch.randn(3))


def test_additional_inputs():
    model, x, y = AddSum(), torch.randn(4, 3), torch.randn(2)
    extra = AdditionalInputs()
    extra.add((torch.randn(7, 3), torch.randn(5)))
    ep = export_checked(model, (x, y), dynamic_shapes=extra)
    assert len(ep.range_constraints) == 2
    extra.verify(ep)  # torch's own check: the program runs the additional inputs
    pf.verify(ep, model, (torch.randn(9, 3), torch.randn(3)), raise_on_failure=True)


class Specialises(torch.nn.Module):
    def forward(self, x):
        return x.view(4, -1) if x.shape[0] == 8 else x


def test_dim_refusals_are_the_classes_torch_export_raises():
    x = torch.randn(8, 2)
    with pytest.raises(UserError) as specialised:  # torch.export: UserError(CONSTRAINT_VIOLATION)
        pf.export(Specialises(), (x,), dynamic_shapes={"x": {0: Dim("n")}})
    assert specialised.value.kind is pf.Refusal.DIM_NOT_DYNAMIC and "specialized it to be a constant (8)" in str(specialised.value)
    with pytest.raises(ConstraintViolationError) as out_of_range:  # torch.export: ConstraintViolationError
        pf.export(Specialises(), (x,), dynamic_shapes={"x": {0: Dim("n", max=4)}})
    assert isinstance(out_of_range.value, pf.UnsupportedError)
    assert out_of_range.value.kind is pf.Refusal.DYNAMIC_SHAPES_SPEC
    for exporter in (torch.export.export, pf.export):  # the same except clause catches both
        with pytest.raises((UserError, ConstraintViolationError)):
            exporter(Specialises(), (x,), dynamic_shapes={"x": {0: Dim("n", max=4)}})


def test_script_module_is_refused_up_front_as_torch_export_refuses_it():
    scripted = torch.jit.script(torch.nn.Linear(2, 2))
    for exporter in (torch.export.export, pf.export):
        with pytest.raises(ValueError, match="ScriptModule|TorchScript"):
            exporter(scripted, (torch.randn(1, 2),))


class ChecksAnUnbackedValue(torch.nn.Module):
    def forward(self, x):
        n = x.sum().to(torch.int64).item()
        torch._check(n >= 0)
        torch._check(n < 100)
        return torch.zeros(3) + n


class NonzeroSized(torch.nn.Module):
    def forward(self, x):
        idx = torch.nonzero(x > 0)
        torch._check(idx.shape[0] <= 4)
        return idx.sum() + x.sum()


class ChecksAValueItNeverUses(torch.nn.Module):
    """The checked value feeds nothing else: dead code before the asserts were inserted."""

    def forward(self, x):
        n = x.max().to(torch.int64).item()
        torch._check(n < 100)
        return x + 1


class AssertsOnAnUnbackedValue(torch.nn.Module):
    """A Python ``assert`` on an int: torch.export's shape env turns it into a runtime assert
    (on a float, torch.export too raises a data-dependent error). The shape env recognises
    the statement by its bytecode, which pytest rewrites in a test module: compiled apart."""

    exec(compile("def forward(self, x):\n    y = x + 1\n    assert y.max().item() < 100\n    return y\n",
                 "<asserting model>", "exec"))


class ChecksInsideNoGrad(torch.nn.Module):
    """The value is read inside a grad region, which becomes a region HOP: its check was
    lost with the asserts inserted after the regions were outlined."""

    def forward(self, x):
        with torch.no_grad():
            n = x.max().to(torch.int64).item()
            torch._check(n < 100)
        return x + 1


class ReadsInsideNoGradChecksOutside(torch.nn.Module):
    def forward(self, x):
        with torch.no_grad():
            n = x.max().to(torch.int64).item()
        torch._check(n < 100)
        return x * 2


class _ChecksInItsForward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        n = x.max().to(torch.int64).item()
        torch._check(n < 100)
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        return grad * 2


class ChecksInsideAFunction(torch.nn.Module):
    """The value is read in a custom Function's forward, traced as its own body: the body's
    check was lost (asserts were inserted in the program's graph only)."""

    def forward(self, x):
        return _ChecksInItsForward.apply(x)


class ChecksANonzeroSizeItNeverUses(torch.nn.Module):
    def forward(self, x):
        torch._check(torch.nonzero(x > 0).shape[0] <= 4)
        return x * 2



@pytest.mark.parametrize("model_cls, good, bad", [
    (ChecksAnUnbackedValue, torch.tensor([2.0, 3.0]), torch.tensor([200.0, 3.0])),
    (NonzeroSized, torch.tensor([1.0, -1.0, 2.0, 0.0, 3.0]), torch.tensor([1.0, 1.0, 2.0, 5.0, 3.0])),
    (ChecksAValueItNeverUses, torch.tensor([2.0, 3.0]), torch.tensor([200.0, 3.0])),
    (AssertsOnAnUnbackedValue, torch.tensor([2, 3]), torch.tensor([200, 3])),
    (ChecksANonzeroSizeItNeverUses, torch.tensor([1.0, -1.0, 2.0, 0.0, 3.0]), torch.tensor([1.0, 1.0, 2.0, 5.0, 3.0])),
    pytest.param(ChecksInsideNoGrad, torch.tensor([2.0, 3.0]), torch.tensor([200.0, 3.0])),
    pytest.param(ReadsInsideNoGradChecksOutside, torch.tensor([2.0, 3.0]), torch.tensor([200.0, 3.0])),
    (ChecksInsideAFunction, torch.tensor([2.0, 3.0]), torch.tensor([200.0, 3.0])),
], ids=["item", "nonzero", "item-unread", "python-assert", "nonzero-unread", "in-no-grad", "read-in-no-grad",
        "in-function"])
def test_users_checks_on_unbacked_values_stay_in_the_program(model_cls, good, bad):
    """Regression: the program accepted inputs the model rejects (torch._check was dropped)."""
    model = model_cls()
    ep = export_checked(model, (good,))
    assert any("aten._assert_scalar.default" in str(gm.graph) for _, gm in all_graph_modules(ep.graph_module))
    with pytest.raises((RuntimeError, AssertionError)):
        model(bad)  # eager refuses
    with pytest.raises(RuntimeError, match="Runtime assertion failed"):
        ep.module()(bad)  # and so does the program, as torch.export's does
    pf.verify(ep, model, (good * 2,), raise_on_failure=True)


class ScaleByInt(torch.nn.Module):
    def forward(self, x, n):
        return x * n + n


def test_dim_dynamic_on_a_python_int_makes_it_a_symbolic_input():
    """Regression: the program guarded ``n == 4``; torch.export takes any n."""
    model, x = ScaleByInt(), torch.randn(3)
    ep = export_checked(model, (x, 4), dynamic_shapes=(None, Dim.DYNAMIC))
    assert type(ep.graph_signature.input_specs[1].arg).__name__ == "SymIntArgument"
    for n in (0, 1, 7):
        torch.testing.assert_close(ep.module()(x, n), model(x, n))
    static = export_checked(model, (x, 4))
    with pytest.raises(Exception, match="n == 4"):  # without a Dim the int is a constant the program checks
        static.module()(x, 5)


class ParameterInADict(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.held = {"w": torch.nn.Parameter(torch.randn(3))}

    def forward(self, x):
        return x * self.held["w"]


def test_parameter_held_in_a_dict_is_a_constant_module_can_hold():
    """Regression: ep.module() failed "`lifted_tensor_0` is not a buffer". Held where no
    ``named_parameters()`` finds it, it is a constant that does not train, in torch.export's
    program as in ours (docs/limits.md)."""
    model, x = ParameterInADict(), torch.randn(3)
    ours, theirs = pf.export(model, (x,)), torch.export.export(model, (x,))
    assert ours.module()(x).requires_grad == theirs.module()(x).requires_grad == False  # noqa: E712
    torch.testing.assert_close(ours.module()(x), model(x).detach())
    pf.verify(ours, model, (x,), check_grads=False, raise_on_failure=True)


class NoInputs(torch.nn.Module):
    def forward(self):
        return torch.ones(3) * 2


def test_model_without_inputs_or_state():
    """Regression: a trace with no fake input ran on real tensors, and the program's fake
    values came from two modes."""
    ep = export_checked(NoInputs(), ())
    torch.testing.assert_close(ep.module()(), torch.full((3,), 2.0))


class BranchesOnData(torch.nn.Module):
    def forward(self, x):
        n = (x > 0).sum().item()
        if n > 2:  # the line the refusal names
            return x[:n]
        return x


def test_branch_on_tensor_data_says_what_to_write_and_is_torchs_class():
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    for exporter in (torch.export.export, pf.export):  # one except clause for both
        with pytest.raises(GuardOnDataDependentSymNode):
            exporter(BranchesOnData(), (torch.randn(5),))
    with pytest.raises(pf.UnsupportedError) as info:
        pf.export(BranchesOnData(), (torch.randn(5),))
    assert info.value.kind is pf.Refusal.DATA_DEPENDENT_BRANCH
    text = str(info.value)
    assert "torch._check" in text and "torch.cond" in text
    assert "test_torch_export_dropin.py" in text and "if n > 2" in text, text


class SetOnInput(torch.nn.Module):
    def forward(self, x, y):
        x.set_(y)
        return x * 2


class SetOnIntermediate(torch.nn.Module):
    def forward(self, x, y):
        z = x.clone()
        z.set_(y)
        return z * 2


class SetOnBuffer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("b", torch.zeros(3))

    def forward(self, y):
        self.b.set_(y)
        return self.b * 2


def test_set_on_intermediate_exports_as_an_alias_of_its_source():
    """torch.export keeps the set_; ours aliases z to y (tests/state/test_storage_swaps.py)."""
    from tests.support.reference import export_checked

    ep = export_checked(SetOnIntermediate(), (torch.randn(3), torch.randn(3)))
    assert "set_" not in ep.graph_module.code


@pytest.mark.parametrize("model_cls, n_args", [(SetOnInput, 2), (SetOnBuffer, 1)], ids=["input", "buffer"])
def test_set_storage_is_a_clear_refusal(model_cls, n_args):
    """Regression: a raw SpecViolationError out of torch's program check ('aten.set_.source_Tensor
    is not functional')."""
    args = tuple(torch.randn(3) for _ in range(n_args))
    with pytest.raises(pf.UnsupportedError) as info:
        pf.export(model_cls(), args)
    assert info.value.kind is pf.Refusal.STORAGE_SWAP
    assert ".set_(" in str(info.value) and "test_torch_export_dropin.py" in str(info.value)


class HoldsAConstant(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.constant = torch.ones(4, 4)

    def forward(self, x):
        return x + self.constant, self.constant


class CallsABoundMethod(torch.nn.Module):
    """The constant's module is reachable only through a bound method: not lifted up front."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def test_constant_met_while_tracing_and_read_twice_is_one_input():
    """Regression (PyTorch's test_tensor_constant_with_wrapped_method): the second read kept a
    get_attr of the attribute the first lift had removed."""
    model, x = CallsABoundMethod(HoldsAConstant().forward), torch.zeros(4, 4)
    ep = export_checked(model, (x,))
    assert list(ep.constants) == ["lifted_tensor_0"]
    for ours, eager in zip(ep.module()(x), model(x)):
        torch.testing.assert_close(ours, eager)


@pytest.mark.parametrize("size", [0, 1])
def test_dynamic_dim_with_an_example_size_torch_specialises(size):
    """Regression: "'int' object has no attribute 'node'". A named Dim or Dim.DYNAMIC on an example
    of size 0 or 1 is refused as torch.export refuses it (UserError; ValueError for Dim.DYNAMIC, every
    such dim named in one error); Dim.AUTO lets it be static."""
    model, x = AddSum(), torch.randn(size, 3)
    with pytest.raises(UserError, match="torch specialises sizes 0 and 1"):
        pf.export(model, (x, torch.randn(2)), dynamic_shapes={"x": {0: Dim("b")}, "y": None})
    with pytest.raises(ValueError, match=rf"(?s)Dim.DYNAMIC.*but export 0/1 specialized due to hint of {size} for "
                                         r"dimension inputs\['x'\]\.shape\[0\].*torch specialises sizes 0 and 1"
                                         r".*hint of 1 for dimension inputs\['y'\]\.shape\[0\]") as err:
        pf.export(model, (x, torch.randn(1)), dynamic_shapes={"x": {0: Dim.DYNAMIC}, "y": {0: Dim.DYNAMIC}})
    assert isinstance(err.value, UserError) and err.value.kind is pf.Refusal.DIM_NOT_DYNAMIC
    ep = export_checked(model, (x, torch.randn(2)), dynamic_shapes={"x": {0: Dim.AUTO}, "y": None})
    assert not ep.range_constraints


def test_bounds_of_a_dim_hint_are_the_programs_runtime_guards():
    """Regression: Dim.AUTO(min=3, max=8) exported [0, inf) and the program took any size."""
    model, y = AddSum(), torch.randn(2)
    for exporter in (torch.export.export, pf.export):
        ep = exporter(model, (torch.randn(4, 3), y), dynamic_shapes={"x": {0: Dim.AUTO(min=3, max=8)}, "y": None})
        assert [(r.lower, r.upper) for r in ep.range_constraints.values()] == [(3, 8)]
        for n in (2, 9):
            with pytest.raises(Exception, match="Guard failed"):
                ep.module()(torch.randn(n, 3), y)
        torch.testing.assert_close(ep.module()(torch.randn(5, 3).zero_(), y), model(torch.zeros(5, 3), y))


class ShiftAdd(torch.nn.Module):
    def forward(self, x, y):
        return x[1:] + y


def test_derived_dim_declared_before_its_root():
    """``dx + 1`` on the first input, ``dx`` on the second: the first size is that expression
    of the second's symbol, checked by the program at other sizes, as torch.export's."""
    model, dx = ShiftAdd(), Dim("dx", min=3, max=10)
    ep = export_checked(model, (torch.randn(6), torch.randn(5)), dynamic_shapes=({0: dx + 1}, {0: dx}))
    theirs = torch.export.export(model, (torch.randn(6), torch.randn(5)), dynamic_shapes=({0: dx + 1}, {0: dx}))
    assert sorted((r.lower, r.upper) for r in ep.range_constraints.values()) == \
        sorted((r.lower, r.upper) for r in theirs.range_constraints.values()) == [(3, 10), (4, 11)]
    for n in (3, 8, 10):
        pf.verify(ep, model, (torch.randn(n + 1), torch.randn(n)), raise_on_failure=True)
    with pytest.raises(AssertionError, match=r"Guard failed: x.size\(\)\[0\] == 1 \+ y.size\(\)\[0\]"):
        ep.module()(torch.randn(7), torch.randn(5))


class Pairs(torch.nn.Module):
    def forward(self, x):
        return x.view(-1, 2).sum(1)


def test_derived_dim_whose_root_no_input_has():
    """``2 * dx`` alone: dx gets a symbol of its own (torch's phantom root), so odd sizes are refused."""
    model, dx = Pairs(), Dim("dx", min=2, max=16)
    ep = export_checked(model, (torch.randn(8),), dynamic_shapes=({0: 2 * dx},))
    for n in (4, 10, 32):
        pf.verify(ep, model, (torch.randn(n),), raise_on_failure=True)
    with pytest.raises(AssertionError, match=r"Guard failed: x.size\(\)\[0\] % 2 == 0"):
        ep.module()(torch.randn(7))


def test_derived_dim_example_that_breaks_the_relation_is_refused():
    dx = Dim("dx", min=3, max=10)
    # torch.export's words (users grep for them), then ours: which input is the root
    with pytest.raises(UserError, match=r"Expected input size \(user input 0, dim 0\) to be equal to dx \+ 1, "
                                        r"where dx = 5, but got 7 \(dx: user input 1, dim 0\)"):
        pf.export(ShiftAdd(), (torch.randn(7), torch.randn(5)), dynamic_shapes=({0: dx + 1}, {0: dx}))
    with pytest.raises(UserError, match=r"form 2\*dx, where dx is an integer"):
        pf.export(Pairs(), (torch.randn(9),), dynamic_shapes=({0: 2 * dx},))


def test_named_dims_the_model_relates_are_refused_with_the_derived_dim_to_declare():
    with pytest.raises(UserError, match=r"Constraints violated \(dy\)!(.|\n)*Suggested fixes:\n  dy = dx \+ 1") as err:
        pf.export(ShiftAdd(), (torch.randn(6), torch.randn(5)), dynamic_shapes=({0: Dim("dy")}, {0: Dim("dx")}))
    assert err.value.kind is pf.Refusal.DIM_NOT_DYNAMIC


def test_dynamic_hints_the_model_relates_are_accepted():
    """Dim.DYNAMIC / AUTO let the model relate sizes (torch.export infers the relation too)."""
    class Relations(torch.nn.Module):
        def forward(self, u, w, y, z):
            return u[1:] + w, y.flatten() + z

    model, dyn = Relations(), Dim.DYNAMIC
    args = (torch.randn(5), torch.randn(4), torch.randn(4, 4), torch.randn(16))
    ep = export_checked(model, args, dynamic_shapes=((dyn,), (dyn,), (dyn, dyn), (dyn,)))
    pf.verify(ep, model, (torch.randn(6), torch.randn(5), torch.randn(7, 8), torch.randn(56)), raise_on_failure=True)


def test_specialised_dims_are_listed_together_in_torch_export_words():
    class Add(torch.nn.Module):
        def forward(self, x, y):
            return x + y

    dx = Dim("dx", min=1, max=2)
    with pytest.raises(UserError, match=r"You marked 2\*dx as dynamic but your code specialized it to be a constant "
                                        r"\(2\).*\n.*You marked dx \+ 1 as dynamic"):
        pf.export(Add(), (torch.randn(2, 3), torch.randn(2, 3)),
                  dynamic_shapes={"x": (2 * dx, Dim.STATIC), "y": (dx + 1, Dim.STATIC)})


def test_static_int_in_the_spec_must_match_the_example():
    with pytest.raises(UserError, match="Static shape constraint of 5 does not match input size of 4"):
        pf.export(AddSum(), (torch.randn(4, 3), torch.randn(2)), dynamic_shapes=((5, None), None))


@dataclasses.dataclass
class Pair:
    x: torch.Tensor
    y: torch.Tensor


torch.export.register_dataclass(Pair, serialized_type_name="test_torch_export_dropin.Pair")


class PairSum(torch.nn.Module):
    def forward(self, p):
        return p.x * 2 + p.y


def test_spec_of_a_registered_dataclass_input():
    n = Dim("n", max=10)
    p = Pair(torch.randn(4), torch.randn(4))
    ep = export_checked(PairSum(), (p,), dynamic_shapes=(Pair(x=(n,), y=(n,)),))
    (symbol,) = ep.range_constraints
    assert [str(tuple(node.meta["val"].shape)) for node in ep.graph.nodes if node.op == "placeholder"] == \
        [f"({symbol},)"] * 2
    pf.verify(ep, PairSum(), (Pair(torch.randn(7), torch.randn(7)),), raise_on_failure=True)


def test_spec_of_a_registered_dataclass_input_as_a_list_of_its_fields_specs():
    """Regression: the form torch.export's ShapesCollection builds (children's specs in flattening
    order) left every field static."""
    n = Dim("n", max=10)
    x, y = torch.randn(4), torch.randn(4)
    shapes = ShapesCollection()
    shapes[x], shapes[y] = (n,), (n,)
    for spec in (shapes, ([(n,), (n,)],)):
        ep = export_checked(PairSum(), (Pair(x, y),), dynamic_shapes=spec)
        assert len(ep.range_constraints) == 1
        pf.verify(ep, PairSum(), (Pair(torch.randn(7), torch.randn(7)),), raise_on_failure=True)


class Bounded(torch.nn.Module):
    def forward(self, x, y):
        if x.shape[0] >= 6 and y.shape[0] <= 16:
            return x * 2.0, y + 1
        return x, y


def test_suggested_fixes_refine_the_spec_as_torch_export_s_do():
    """torch.export.dynamic_shapes.refine_dynamic_shapes_from_suggested_fixes reads our error's
    ``msg`` and the re-export with the refined spec succeeds and runs right."""
    from torch.export.dynamic_shapes import refine_dynamic_shapes_from_suggested_fixes

    model, args = Bounded(), (torch.randn(16), torch.randn(12))
    spec = {"x": (Dim("dx"),), "y": (Dim("dy"),)}
    with pytest.raises(UserError, match=r"Constraints violated \(dx, dy\)!") as err:
        pf.export(model, args, dynamic_shapes=spec)
    refined = refine_dynamic_shapes_from_suggested_fixes(err.value.msg, spec)
    assert (refined["x"][0].min, refined["y"][0].max) == (6, 16)
    ep = export_checked(model, args, dynamic_shapes=refined)
    pf.verify(ep, model, (torch.randn(9), torch.randn(3)), raise_on_failure=True)


class ThirdsOfAtLeastNine(torch.nn.Module):
    def forward(self, x):
        if x.shape[0] >= 9:
            return x.reshape([-1, 3])
        return x


def test_a_named_dim_the_model_needs_divisible_is_refused_with_the_derived_dim_to_declare():
    """Before, the program claimed every size >= 9 and failed inside ``view`` on 10; torch.export
    refuses too. The suggested ``dx = 3*_dx`` re-exports and runs right."""
    from torch.export.dynamic_shapes import refine_dynamic_shapes_from_suggested_fixes

    model, args, spec = ThirdsOfAtLeastNine(), (torch.randn(15),), ((Dim("dx"),),)
    with pytest.raises(UserError, match=r"dx \(user input 0, dim 0\) must always be divisible by 3") as err:
        pf.export(model, args, dynamic_shapes=spec)
    assert "_dx = Dim('_dx', min=3)\n  dx = 3*_dx" in err.value.msg
    refined = refine_dynamic_shapes_from_suggested_fixes(err.value.msg, spec)
    ep = export_checked(model, args, dynamic_shapes=refined)
    pf.verify(ep, model, (torch.randn(24),), raise_on_failure=True)
    with pytest.raises(AssertionError, match="Guard failed"):  # 10 is no multiple of 3
        ep.module()(torch.randn(10))


class PickByValue(torch.nn.Module):
    def forward(self, x, y):
        b = x.item()
        torch._check(b >= 0)
        torch._check(b < y.shape[0])
        return y[0, b], torch.tensor([b, 2 * b])


def test_indexing_and_tensor_constructors_with_symbolic_ints():
    """torch.export's non-strict rewrites (``y[0, b]`` as ``select``, ``torch.tensor`` of SymInts
    in its traceable form) run under our trace too."""
    model, y = PickByValue(), torch.randn(10, 10)
    ep = export_checked(model, (torch.tensor(4), y))
    for b in (0, 7, 9):
        pf.verify(ep, model, (torch.tensor(b), y), raise_on_failure=True)
    with pytest.raises(RuntimeError, match="Runtime assertion failed"):  # the user's torch._check is kept
        ep.module()(torch.tensor(10), y)


class AllReduce(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, x):
        y = self.linear(x).abs().clamp(max=1.0) * 2
        torch.distributed.all_reduce(y)
        return y


@pytest.mark.skipif(not torch.distributed.is_available(), reason="this torch build has no torch.distributed")
def test_in_place_collectives_become_functional_collectives():
    """``all_reduce`` writes its input in place; as in torch.export it is traced as the functional
    collective plus ``wait_tensor``, so the program has no mutation."""
    torch.distributed.init_process_group(backend="fake", world_size=2, rank=0)
    try:
        model, x = AllReduce(), torch.randn(4, 4)
        ep = export_checked(model, (x,))
        targets = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
        assert {"_c10d_functional.all_reduce.default", "_c10d_functional.wait_tensor.default"} <= targets
    finally:
        torch.distributed.destroy_process_group()


class SumOfThree(torch.nn.Module):
    def forward(self, q, k, v, mask):
        return q + k + v if mask is None else q


def test_one_tensor_passed_three_times_with_a_dim_each_and_a_none_input():
    """Regression: a None input under a None spec recursed forever in the spec walk."""
    q, model = torch.randn(4, 3), SumOfThree()
    spec = {"q": {0: Dim("nq")}, "k": {0: Dim("nk")}, "v": {0: Dim("nv")}, "mask": None}
    ep = export_checked(model, (q, q, q, None), dynamic_shapes=spec)
    other = torch.randn(7, 3)
    pf.verify(ep, model, (other, other, other, None), raise_on_failure=True)


class BuiltinsOnSymbolicInts(torch.nn.Module):
    def forward(self, x, y):
        b = x.item()
        p = math.pow(min(b, 10), 2)
        return y * p, torch.ones(max(b, 3)), torch.ones(2) * max(y.sum(), y.mean())


def test_builtin_max_min_and_pow_of_symbolic_ints():
    """``max(u0, 3)`` and ``min``/``math.pow`` on a value read from data trace as torch.export
    traces them (sym_max / sym_min / **), not as a Python decision on data."""
    model, y = BuiltinsOnSymbolicInts(), torch.randn(5)
    ep = export_checked(model, (torch.tensor(5), y))
    assert "sym_min" in str(ep.graph) and "sym_max" in str(ep.graph)
    for b in (1, 7, 12):
        pf.verify(ep, model, (torch.tensor(b), y), raise_on_failure=True)


class RaisesFromForward(torch.nn.Module):
    def forward(self, x):
        if x.shape[0] > 2:
            raise LookupError("no entry for this size")
        return x


def test_an_error_we_do_not_translate_is_also_the_class_torch_export_raises():
    """torch.export lets the model's (or torch's) exception through; ours adds the op and the
    user's line and stays catchable as that class, and survives pickling (worker processes)."""
    import pickle

    with pytest.raises(LookupError, match="no entry for this size") as err:
        pf.export(RaisesFromForward(), (torch.randn(4),))
    assert isinstance(err.value, pf.ExportError) and "in forward" in str(err.value)
    again = pickle.loads(pickle.dumps(err.value))
    assert isinstance(again, LookupError) and isinstance(again, pf.ExportError) and str(again) == str(err.value)


class ChecksPinValues(torch.nn.Module):
    def forward(self, x, y, z):
        m, n = x.item(), y.item()
        torch._check(m == 4)
        torch._check(n == z.shape[0])
        return m + n + z


def test_values_the_checks_pin_leave_no_unbacked_bindings():
    """Regression: nodes kept bindings of u0/u1 after torch._check replaced them (by 4 and by z's
    size), naming symbols the program does not have; torch.export recomputes them."""
    model = ChecksPinValues()
    ep = export_checked(model, (torch.tensor(4), torch.tensor(5), torch.randn(5)),
                        dynamic_shapes={"x": None, "y": None, "z": (Dim("dx", max=16),)}, check_grads=False)
    assert [n.name for n in ep.graph.nodes if n.meta.get("unbacked_bindings")] == []
    pf.verify(ep, model, (torch.tensor(4), torch.tensor(7), torch.randn(7)), raise_on_failure=True, check_grads=False)


class StarArgs(torch.nn.Module):
    def forward(self, *args):
        return args[0] + args[1]


def test_spec_of_a_star_args_parameter_spreads_over_the_arguments_it_collects():
    """Regression: ``{"args": ({0: d}, {0: d})}`` gave the first argument both specs (dims 0 and 1)."""
    model, batch = StarArgs(), Dim.DYNAMIC
    ep = export_checked(model, (torch.randn(2, 5), torch.randn(2, 5)), dynamic_shapes={"args": ({0: batch}, {0: batch})})
    assert len(ep.range_constraints) == 1
    pf.verify(ep, model, (torch.randn(7, 5), torch.randn(7, 5)), raise_on_failure=True)


class ParamPlusInputs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.p = torch.nn.Parameter(torch.randn(3, 3))

    def forward(self, x, y):
        return self.p + x + y


def test_placeholder_values_require_grad_as_the_inputs_they_stand_for(tmp_path):
    """Regression: every placeholder's ``val`` was made without requires_grad; torch.export's carry it."""
    model, args = ParamPlusInputs(), (torch.randn(3, 3), torch.randn(3, 3, requires_grad=True))
    ep = export_checked(model, args)
    vals = [n.meta["val"] for n in ep.graph.nodes if n.op == "placeholder"]
    assert [v.requires_grad for v in vals] == [True, False, True]
    torch.export.save(ep, tmp_path / "ep.pt2")
    loaded = pf.load(tmp_path / "ep.pt2")
    torch.testing.assert_close(loaded.module()(*args), model(*args))


class UnusedTensor(torch.nn.Module):
    def forward(self, x):
        y = torch.tensor(3)  # noqa: F841  (made and never used, as models do)
        z = torch.tensor([1.0, 2.0, 3.0])
        return x * x + z


def test_a_tensor_made_in_forward_and_never_used_is_no_constant_input():
    """Regression: it was lifted to a constant input no node reads; torch.export drops it."""
    model = UnusedTensor()
    ep = export_checked(model, (torch.ones(3),))
    assert len(ep.constants) == 1  # z only
    assert [n for n in ep.graph.nodes if n.op == "placeholder" and not n.users] == []
    torch.testing.assert_close(ep.module()(torch.full((3,), 2.0)), model(torch.full((3,), 2.0)))


class SubclassParameter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        from torch.testing._internal.two_tensor import TwoTensor

        self.p1 = torch.nn.Parameter(torch.ones(3, 4))
        self.p2 = torch.nn.Parameter(TwoTensor(torch.ones(3, 4), torch.ones(3, 4)))

    def forward(self, x):
        return x + (2 * self.p1 + self.p2).sum()


def test_a_parameter_of_a_wrapper_tensor_subclass_survives_module_and_decompositions():
    """Regression: ``ep.module()`` asked the subclass for its storage pointer, which torch refuses
    ("Attempted to access the data pointer on an invalid python storage")."""
    model, x = SubclassParameter(), torch.randn(3, 4)
    ep = pf.export(model, (x,))
    torch.testing.assert_close(ep.module()(x), model(x))
    before = list(ep.state_dict)
    ep.run_decompositions()
    assert list(ep.state_dict) == before


class ReshapesBySize(torch.nn.Module):
    def forward(self, x):
        return x.view(x.size(1), -1).softmax(dim=0)


def test_prefer_deferred_runtime_asserts_turns_the_traces_assumptions_into_asserts():
    """As torch.export: with the flag, what the trace assumed of a dynamic size (here
    ``s != 20`` and ``s % 20 != 0``, from the example 64) is a runtime assert of the program
    instead of a guard on its inputs."""
    model, x = ReshapesBySize(), torch.rand(64, 20, 16)
    shapes = {"x": {0: Dim("batch")}}
    deferred = export_checked(model, (x,), dynamic_shapes=shapes, prefer_deferred_runtime_asserts_over_guards=True)
    assert "aten._assert_scalar.default" in str(deferred.graph)
    with pytest.raises(RuntimeError, match=r"Runtime assertion failed for expression Ne\(s\d+, 20\)"):
        deferred.module()(torch.randn(20, 20, 16))
    torch.testing.assert_close(deferred.module()(torch.randn(30, 20, 16)).shape, torch.Size([20, 480]))
    guarded = export_checked(model, (x,), dynamic_shapes=shapes)
    assert "aten._assert_scalar.default" not in str(guarded.graph)
    with pytest.raises(AssertionError, match="Guard failed"):
        guarded.module()(torch.randn(20, 20, 16))


class MatMul(torch.nn.Module):
    def forward(self, x, y):
        return torch.matmul(x, y)


def test_two_dims_of_one_name_with_other_bounds_are_refused_as_torch_export_refuses_them():
    """Regression: ours took the first definition and ignored the second one's bounds."""
    first, second = Dim("C", min=3), Dim("C", max=12)
    for exporter in (torch.export.export, pf.export):
        with pytest.raises(UserError, match=r"Found different definitions Dim\(.*min=3\) and Dim\(.*max=12\) "
                                            "for the same symbolic dimension"):
            exporter(MatMul(), (torch.randn(10, 10), torch.randn(10, 10)),
                     dynamic_shapes={"x": (first, second), "y": (second, first)})
    same = Dim("C", min=3)  # one name, equal bounds: one dim, as in torch.export
    ep = export_checked(MatMul(), (torch.randn(10, 10), torch.randn(10, 10)),
                        dynamic_shapes={"x": (first, same), "y": (same, first)})
    torch.testing.assert_close(ep.module()(torch.ones(5, 5), torch.ones(5, 5)), torch.full((5, 5), 5.0))


class PadsSequences(torch.nn.Module):
    def __init__(self, batch_first):
        super().__init__()
        self.batch_first = batch_first

    def forward(self, x, y):
        return torch.nn.utils.rnn.pad_sequence([x, y], batch_first=self.batch_first)


@pytest.mark.parametrize("batch_first", [False, True])
def test_a_kept_composite_leaves_dynamic_dims_dynamic(batch_first):
    """Regression: the check of whether eager's C++ kernel of ``pad_sequence`` must be traced
    ran that kernel on the call's fakes although the op is kept; the kernel reads sizes as
    ints, so each dynamic dim was specialised ("Constraints violated"), where torch.export
    keeps it dynamic."""
    model = PadsSequences(batch_first)
    ep = export_checked(model, (torch.randn(5, 2), torch.randn(3, 2)),
                        dynamic_shapes={"x": {0: Dim("n")}, "y": {0: Dim("m")}})
    assert "aten.pad_sequence.default" in str(ep.graph)
    for n, m in ((7, 2), (2, 9)):
        x, y = torch.randn(n, 2), torch.randn(m, 2)
        torch.testing.assert_close(ep.module()(x, y), model(x, y))


class AddsAParameter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(4, 4))

    def forward(self, x):
        return self.weight + x


@pytest.mark.parametrize("exporter", [torch.export.export, pf.export], ids=["torch.export", "ours"])
def test_export_inside_the_users_fake_mode_as_torch_export(exporter):
    """Regression: a model built and exported inside ``with FakeTensorMode():`` failed with
    "fake mode ... from active fake mode 0 doesn't match" (torch's ExportedProgram saw the
    user's mode active beside the export's). The program's values share one fake mode; it
    runs on the user's fakes under the user's mode, and, given real weights, computes what
    eager computes with them."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    fake_mode = FakeTensorMode(shape_env=ShapeEnv(tracked_fakes=[]))
    with fake_mode:
        model, x = AddsAParameter(), torch.randn(4, 4)
        ep = exporter(model, (x,))
        out = ep.module()(x)
    assert isinstance(out, FakeTensor) and out.shape == (4, 4)
    vals = [n.meta["val"] for n in ep.graph.nodes if isinstance(n.meta.get("val"), torch.Tensor)]
    assert vals and all(v.fake_mode is vals[0].fake_mode for v in vals)
    real = AddsAParameter()
    program = ep.module()
    program.load_state_dict(real.state_dict(), assign=True)
    x = torch.randn(4, 4)
    torch.testing.assert_close(program(x), real(x))


class AddsTwoNumbers(torch.nn.Module):
    def forward(self, x, n):
        return x * n + n


def test_ints_wrapped_for_a_shapes_collection_are_dynamic_int_inputs():
    """Regression: torch.export's ``_IntWrapper`` (how a ShapesCollection marks an int input
    dynamic) was refused as an input a program cannot take."""
    from torch.export.dynamic_shapes import _IntWrapper

    x, n = torch.randn(3), _IntWrapper(4)
    shapes = ShapesCollection()
    shapes[n] = Dim.DYNAMIC
    model = AddsTwoNumbers()
    ep = pf.export(model, (x, n), dynamic_shapes=shapes)
    assert type(ep.graph_signature.input_specs[1].arg).__name__ == "SymIntArgument"
    for k in (0, 4, 9):
        torch.testing.assert_close(ep.module()(x, k), model(x, k))
    pf.verify(ep, model, (x, 7), raise_on_failure=True)


class CountsCalls(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls.add_(1)
        return self.lin(x).relu()


def test_the_graph_module_runs_as_torch_exports_does():
    """The program's graph module generates its code on first use (not when the program is
    made): called directly with the lifted state and the inputs, as torch.export's is, it
    returns the buffer's new value and the output; its code, printout, copies and pickles
    are those of an eagerly generated module."""
    import copy
    import pickle

    model, x = CountsCalls(), torch.randn(2, 3)
    ep = export_checked(model, (x,))
    gm = ep.graph_module
    lifted = [ep.state_dict[spec.target] for spec in ep.graph_signature.input_specs if spec.target]
    new_calls, out = gm(*lifted, x)
    assert torch.equal(new_calls, torch.ones(())) and torch.allclose(out, model.lin(x).relu())
    eagerly = torch.fx.GraphModule(gm, gm.graph)
    assert gm.code == eagerly.code and "aten.linear.default" in gm.print_readable(print_output=False)
    for copied in (copy.deepcopy(gm), pickle.loads(pickle.dumps(gm))):
        assert all(torch.equal(a, b) for a, b in zip(copied(*lifted, x), (new_calls, out)))


class CountsItsCalls(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(3, 3)
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        self.calls += 1
        return self.linear(x) * self.calls


def test_every_call_of_the_module_has_a_module_stack():
    """Regression: the write-backs and input checks ``ep.module()`` adds had no ``nn_module_stack``,
    and torch.distributed.pipelining, which outlines stages of ``ep.module()`` by it, raised
    "Unable to find nn_module_stack for node write_back"; they sit in the root module."""
    model, x = CountsItsCalls(), torch.randn(2, 3)
    ep = export_checked(model, (x,))
    module = ep.module()
    calls = [n for n in module.graph.nodes if n.op == "call_function"]
    assert any(n.target.__name__ == "write_back" for n in calls if callable(n.target))
    assert all(n.meta.get("nn_module_stack") for n in calls), [n.format_node() for n in calls]
    eager = copy.deepcopy(model)
    for _ in range(2):
        torch.testing.assert_close(module(x), eager(x))
    assert module.calls.item() == eager.calls.item() == 2
