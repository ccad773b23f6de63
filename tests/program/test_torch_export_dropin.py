"""``pf.export`` where ``torch.export.export`` stood: its arguments, its dynamic-shape forms,
and the error classes a pipeline written for it catches. Every program is replayed
against eager, at the example sizes and at others the trace never saw."""

import inspect

import pytest
import torch
from torch._dynamo.exc import UserError
from torch.export import AdditionalInputs, Dim, ShapesCollection
from torch.fx.experimental.symbolic_shapes import ConstraintViolationError

import predispatch_func as pf
from tests.support.oracle import export_checked


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
    assert specialised.value.kind is pf.Refusal.DIM_NOT_DYNAMIC and "specialised it to 8" in str(specialised.value)
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


@pytest.mark.parametrize("model_cls, good, bad", [
    (ChecksAnUnbackedValue, torch.tensor([2.0, 3.0]), torch.tensor([200.0, 3.0])),
    (NonzeroSized, torch.tensor([1.0, -1.0, 2.0, 0.0, 3.0]), torch.tensor([1.0, 1.0, 2.0, 5.0, 3.0])),
], ids=["item", "nonzero"])
def test_users_checks_on_unbacked_values_stay_in_the_program(model_cls, good, bad):
    """Regression: the program accepted inputs the model rejects (torch._check was dropped)."""
    model = model_cls()
    ep = export_checked(model, (good,))
    assert "aten._assert_scalar.default" in str(ep.graph)
    with pytest.raises(RuntimeError):
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


@pytest.mark.parametrize("model_cls, n_args", [(SetOnInput, 2), (SetOnIntermediate, 2), (SetOnBuffer, 1)],
                         ids=["input", "intermediate", "buffer"])
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
    of size 0 or 1 is refused as torch.export refuses it (UserError); Dim.AUTO lets it be static."""
    model, x = AddSum(), torch.randn(size, 3)
    for dim in (Dim("b"), Dim.DYNAMIC):
        with pytest.raises(UserError, match="torch specialises sizes 0 and 1"):
            pf.export(model, (x, torch.randn(2)), dynamic_shapes={"x": {0: dim}, "y": None})
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
