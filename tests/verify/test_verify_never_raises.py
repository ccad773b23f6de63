"""``pf.verify`` answers with a report on every program that exported: inputs that are
activations (a leaf's ``clone()``) written in place, inputs and parameters holding a cached
``.grad``, complex outputs (their gradients compared too), and a module registered under two
names (timm's CoaT), a model whose eager backward refuses (no gradients to compare, the rest
still compared). Each report is also shown to catch a program that is wrong."""

import functools

import pytest
import torch
from expecttest import TestCase
from torch import nn

import predispatch_func as pf
from tests.models import corpus
from tests.support.cases_core import CASES
from tests.support.reference import export_checked


def _as_activation(t: torch.Tensor) -> torch.Tensor:
    """What an upstream layer hands a model: a non-leaf that requires grad."""
    return t.detach().clone().requires_grad_().clone()


def _with_cached_grad(t: torch.Tensor) -> torch.Tensor:
    """A leaf that requires grad and holds the gradient of an earlier backward."""
    leaf = t.detach().clone().requires_grad_()
    leaf.grad = torch.full_like(leaf, 7.0)
    return leaf


def _float_inputs(inputs, make):
    def one(t):
        return make(t) if t.is_floating_point() or t.is_complex() else t
    return torch.utils._pytree.tree_map_only(torch.Tensor, one, inputs)


class ZeroNegatives(nn.Module):
    """The issue's repro: a model that writes its (activation) input in place."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        x[x < 0] = 0.0
        return self.lin(x)


class ZeroNegativesUnrecorded(ZeroNegatives):
    """Same outputs and written input, but autograd does not see the write: other input gradients."""

    def forward(self, x):
        with torch.no_grad():
            x[x < 0] = 0.0
        return self.lin(x)


def test_an_activation_input_written_in_place_gets_a_report_with_its_gradient():
    model, x = ZeroNegatives(), _as_activation(torch.randn(3, 4))
    ep = pf.export(model, (x,))
    report = pf.verify(ep, model, (x,))
    assert report.ok, report
    assert "gradients" in report.checked
    assert x.grad_fn is not None and (x < 0).any()  # the caller's input is untouched


def test_a_wrong_gradient_to_an_activation_input_is_reported():
    x = _as_activation(torch.randn(3, 4))
    ep = pf.export(ZeroNegatives(), (x,))
    other = ZeroNegativesUnrecorded()
    other.load_state_dict(ep.module().state_dict())
    report = pf.verify(ep, other, (x,))
    assert [p for p in report.problems if p.startswith("input grads")], report


def test_a_leaf_input_of_the_caller_written_in_place_is_compared_as_an_activation():
    """Eager refuses the call as given (a leaf that requires grad written in place); the report
    says so and compares the program with the input as a leaf's clone() instead."""
    model, x = ZeroNegatives(), torch.randn(3, 4, requires_grad=True)
    ep = pf.export(model, (x,))
    report = pf.verify(ep, model, (x,))
    assert report.ok, report
    assert any("eager refuses them as given: a leaf Variable" in c for c in report.checked), report.checked
    assert "gradients" in report.checked


def test_a_call_eager_refuses_in_every_form_is_a_problem_not_an_exception():
    class OutIntoInput(nn.Module):
        def forward(self, a, out):
            torch.mul(a, 2, out=out)
            return out + 1

    a, out = torch.randn(3), torch.randn(3, requires_grad=True)
    ep = pf.export(OutIntoInput(), (a, out))
    report = pf.verify(ep, OutIntoInput(), (a, out))
    assert report.problems == ["eager raised RuntimeError on copies of the inputs, so nothing was compared: "
                               "mul(): functions with out=... arguments don't support automatic "
                               "differentiation, but one of the arguments requires grad."], report


def test_a_model_verify_cannot_copy_is_a_problem_not_an_exception():
    import threading

    model, x = nn.Linear(3, 3), torch.randn(2, 3)
    ep = pf.export(model, (x,))
    model.lock = threading.Lock()  # deepcopy refuses a lock
    report = pf.verify(ep, model, (x,))
    assert report.problems == ["the replay against eager could not run: TypeError: cannot pickle "
                               "'_thread.lock' object"], report


def test_cached_gradients_on_inputs_and_parameters_are_neither_used_nor_changed():
    model, x = nn.Linear(4, 2), _with_cached_grad(torch.randn(3, 4))
    model.weight.grad = torch.full_like(model.weight, 5.0)
    ep = pf.export(model, (x,))
    report = pf.verify(ep, model, (x,))
    assert report.ok and "gradients" in report.checked, report
    assert torch.equal(x.grad, torch.full_like(x, 7.0))
    assert torch.equal(model.weight.grad, torch.full_like(model.weight, 5.0))


# --- complex outputs: their gradients are compared ------------------------------------------


class ComplexSign(nn.Module):
    """``sgn`` of a complex view of a real activation: the case that slipped through."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return torch.view_as_complex(self.lin(x).view(*x.shape[:-1], 2, 2)).sgn()


class ComplexSignStopped(ComplexSign):
    """The same values as :class:`ComplexSign`, with the gradient of the real part negated."""

    def forward(self, x):
        z = super().forward(x)
        return torch.complex(2 * z.real.detach() - z.real, z.imag)


class ComplexScale(nn.Module):
    """A complex input times a complex parameter, and a real output beside the complex one."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(3, dtype=torch.cfloat))

    def forward(self, z):
        y = z * self.w
        return y, y.abs()


class ComplexInputWrittenInPlace(nn.Module):
    def forward(self, z):
        z.mul_(1j)
        return z.conj() * 2


COMPLEX = {
    "sgn_of_a_complex_view": (ComplexSign, lambda: (torch.randn(3, 4),)),
    "complex_input_times_complex_parameter": (ComplexScale, lambda: (torch.randn(2, 3, dtype=torch.cfloat),)),
    "complex_input_written_in_place": (ComplexInputWrittenInPlace, lambda: (torch.randn(3, dtype=torch.cfloat),)),
}


@pytest.mark.parametrize("variant", ["as_given", "activation", "cached_grad"])
@pytest.mark.parametrize("name", list(COMPLEX))
def test_complex_programs_have_their_gradients_compared(name, variant):
    make_model, make_args = COMPLEX[name]
    torch.manual_seed(0)
    model, args = make_model(), make_args()
    if variant != "as_given":
        args = _float_inputs(args, _as_activation if variant == "activation" else _with_cached_grad)
    ep = pf.export(model, args)
    # an input of the caller's that requires no grad, written in place: eager refuses it as a leaf
    # that requires grad, so only nonleaf_inputs=True compares gradients through the write
    report = pf.verify(ep, model, args, nonleaf_inputs=True)
    assert report.ok, report
    assert "gradients" in report.checked, report.checked


def test_a_wrong_gradient_of_a_complex_output_is_reported():
    torch.manual_seed(0)
    model, x = ComplexSign(), torch.randn(3, 4)
    ep = pf.export(model, (x,))
    stopped = ComplexSignStopped()
    stopped.load_state_dict(model.state_dict())
    report = pf.verify(ep, stopped, (x,))
    assert not any(p.startswith("output") for p in report.problems), report  # equal values
    assert [p for p in report.problems if p.startswith("parameter grads")], report


# --- a module registered under two names ------------------------------------------------------


class RelPosEnc(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv_list = nn.ModuleList([nn.Conv1d(4, 4, 1)])

    def forward(self, x):
        return self.conv_list[0](x)


class SerialBlock(nn.Module):
    def __init__(self, shared_cpe, shared_crpe):
        super().__init__()
        self.cpe = shared_cpe
        self.factoratt_crpe = nn.Module()
        self.factoratt_crpe.crpe = shared_crpe
        self.mlp = nn.Linear(3, 3)

    def forward(self, x):
        return self.mlp(self.factoratt_crpe.crpe(self.cpe(x)))


class SharedUnderTwoNames(nn.Module):
    """timm's CoaT: ``crpe1`` and ``cpe1`` registered on the model first, then shared by every
    block, so torch de-duplicates their parameters under the model's names while a
    program's module may keep the blocks' names."""

    def __init__(self):
        super().__init__()
        self.cls_token1 = nn.Parameter(torch.randn(3))
        self.cpe1 = nn.Conv1d(4, 4, 1)
        self.crpe1 = RelPosEnc()
        self.register_buffer("scale", torch.full((3,), 0.5))
        self.serial_blocks1 = nn.ModuleList([SerialBlock(self.cpe1, self.crpe1) for _ in range(3)])

    def forward(self, x):
        x = x + self.cls_token1
        for block in self.serial_blocks1:
            x = block(x)
        return x * self.scale


def test_a_module_shared_under_two_names_is_no_problem():
    torch.manual_seed(0)
    model, x = SharedUnderTwoNames(), torch.randn(2, 4, 3)
    ep = pf.export(model, (x,))
    report = pf.verify(ep, model, (x,), calls=2)
    assert report.ok, report
    assert "gradients" in report.checked


def test_a_wrong_gradient_to_a_shared_parameter_is_still_reported():
    torch.manual_seed(0)
    model, x = SharedUnderTwoNames(), torch.randn(2, 4, 3)
    ep = pf.export(model, (x,))

    class Stopped(SharedUnderTwoNames):
        def forward(self, x):
            x = x + self.cls_token1
            for i, block in enumerate(self.serial_blocks1):
                y = block(x)
                x = y if i else 2 * y.detach() - y  # equal values, negated gradient
            return x * self.scale

    stopped = Stopped()
    stopped.load_state_dict(model.state_dict())
    report = pf.verify(ep, stopped, (x,))
    assert [p for p in report.problems if p.startswith("parameter grads")], report
    assert not [p for p in report.problems if "missing" in p], report


class TiedHead(nn.Module):
    """gpt2's lm_head.weight is wte.weight: one tensor, two names."""

    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(10, 4)
        self.lm_head = nn.Linear(4, 10, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, ids):
        return self.lm_head(self.wte(ids).relu())


def test_a_tied_weight_held_as_two_tensors_by_torchs_loaded_module_gets_its_gradient_summed():
    import io

    torch.manual_seed(0)
    model, ids = TiedHead(), torch.randint(0, 10, (2, 5))
    ep = pf.export(model, (ids,))
    assert pf.verify(ep, model, (ids,)).ok
    buffer = io.BytesIO()
    torch.export.save(ep, buffer)
    buffer.seek(0)
    report = pf.verify(torch.export.load(buffer), model, (ids,))
    assert report.ok and "gradients" in report.checked, report

    class Untied(TiedHead):  # the same values, but the head's use no longer reaches the embedding's gradient
        def forward(self, ids):
            return nn.functional.linear(self.wte(ids).relu(), self.lm_head.weight.detach())

    untied = Untied()
    untied.load_state_dict(model.state_dict())
    assert [p for p in pf.verify(ep, untied, (ids,)).problems if p.startswith("parameter grads")]


# --- the catalogue and the corpus, with activations and cached gradients as inputs -----------------

# where eager itself refuses the call in every form verify tries: the report says so
EAGER_REFUSES = {"out_argument_into_input": "functions with out=... arguments don't support automatic differentiation",
                 "batch_norm_out_variant_writes_running_stats": "but one of the arguments requires grad"}


# transformers' Wav2Vec2FeatureEncoder in train mode sets `requires_grad = True` on a view of its input,
# which eager refuses for an input that requires grad (the view is then a non-leaf)
CORPUS_EAGER_REFUSES = {"wav2vec2": "you can only change requires_grad flags of leaf variables"}


def _check_never_raises(model, args, kwargs, check_values, variant, eager_refuses=None):
    if variant == "cached_grad":
        for param in model.parameters():
            param.grad = torch.full_like(param, 3.0)
    args, kwargs = _float_inputs((args, kwargs), _as_activation if variant == "activation" else _with_cached_grad)
    ep = pf.export(model, args, kwargs)
    report = pf.verify(ep, model, args, kwargs, check_values=check_values)
    if eager_refuses is None:
        assert report.ok, report
    else:
        assert len(report.problems) == 1 and eager_refuses in report.problems[0], report


@pytest.mark.parametrize("variant", ["activation", "cached_grad"])
@pytest.mark.parametrize("name", list(CASES))
def test_verify_answers_on_every_catalogue_case(name, variant):
    model, args, kwargs = CASES[name].build()
    _check_never_raises(model, args, kwargs, CASES[name].check_values, variant, EAGER_REFUSES.get(name))


@pytest.mark.models
@pytest.mark.parametrize("variant", ["activation", "cached_grad"])
@pytest.mark.parametrize("name", list(corpus.CASES))
def test_verify_answers_on_every_corpus_model(name, variant):
    pytest.importorskip("transformers")
    model, args, kwargs = corpus.build(name, train=True)
    _check_never_raises(model, args, kwargs, True, variant, CORPUS_EAGER_REFUSES.get(name))


@functools.cache
def _hop_cases():
    from tests.support.hop_db_cases import exportdb_cases, hop_db_cases

    return {name: (model, args, skip) for name, model, args, skip in [*hop_db_cases(1), *exportdb_cases()]}


@pytest.mark.conformance
@pytest.mark.parametrize("variant", ["activation", "cached_grad"])
@pytest.mark.parametrize("name", list(_hop_cases()))
def test_verify_answers_on_every_hop_db_and_exportdb_case(name, variant):
    from tests.support.hop_db_cases import skip_unless_eager_runs

    model, args, skip = _hop_cases()[name]
    skip_unless_eager_runs(model, args, skip)
    args = _float_inputs(args, _as_activation if variant == "activation" else _with_cached_grad)
    try:
        ep = pf.export(model, args)
    except pf.ExportError as err:  # refused or failed: no program to verify (tests/hops/test_hop_db.py judges it)
        pytest.skip(f"no program: {type(err).__name__}: {err.reason[:120]}")
    report = pf.verify(ep, model, args)
    assert report.ok, report


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
