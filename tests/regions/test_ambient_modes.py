"""Export called under the caller's ``no_grad`` / ``inference_mode`` / ``autocast``.

The program is what the model does under that mode (its whole forward is an
outer region), so it is replayed against the reference *under the mode*, and must
give the same whether the program itself is called inside or outside it.
"""

import contextlib
import copy

import pytest
import torch
from torch import nn

import predispatch_func as pf
from predispatch_func.verify import check_contract
from tests.support.reference import _assert_same, _fresh

MODES = {
    "no_grad": torch.no_grad,
    "inference_mode": torch.inference_mode,
    "autocast_bf16": lambda: torch.autocast("cpu", dtype=torch.bfloat16),
    "no_grad_and_autocast": lambda: _both(torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16)),
}


@contextlib.contextmanager
def _both(a, b):
    with a, b:
        yield


class BranchesOnGradMode(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        y = self.lin(x)
        return y.relu() if torch.is_grad_enabled() else y.sigmoid()


class UpdatesState(nn.Module):
    """A running buffer, a parameter clipped in place, and a region that turns autocast off."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("seen", torch.zeros(4))

    def forward(self, x):
        self.seen.add_(x.mean(0))
        with torch.no_grad():
            self.lin.weight.clamp_(-0.4, 0.4)
        with torch.autocast("cpu", enabled=False):
            plain = x @ self.lin.weight
        return self.lin(x), plain * 2


class ReEnablesGrad(nn.Module):
    """Part of the forward turns grad back on: under the caller's no_grad it still
    requires grad in eager (under inference_mode it does not)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        with torch.enable_grad():
            inner = self.lin(x).tanh()
        return inner, self.lin(x) * 2


class ClipsThenReEnablesGrad(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        with torch.no_grad():
            self.lin.weight.clamp_(-0.4, 0.4)
        with torch.enable_grad():
            return self.lin(x).tanh()


MODELS = {
    "linear": lambda: nn.Linear(4, 4),
    "batchnorm_train": lambda: nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)).train(),
    "branches_on_grad_mode": BranchesOnGradMode,
    "updates_state": UpdatesState,
    "re_enables_grad": ReEnablesGrad,
}


def _run_both(ep, model, args, mode):
    """Eager under ``mode`` against the program inside and outside ``mode``: values,
    requires_grad, written state; gradients where eager's outputs require grad."""
    with mode():
        eager = copy.deepcopy(model)
        e_args = _fresh(args)
        e_out = eager(*e_args)
    for inside in (True, False):
        program = copy.deepcopy(ep).module()
        p_args = _fresh(args)
        with mode() if inside else contextlib.nullcontext():
            p_out = program(*p_args)
        where = "inside" if inside else "outside"
        _assert_same(f"{where}: output", e_out, p_out, rtol=1e-2, atol=1e-2)
        _assert_same(f"{where}: state", dict(eager.state_dict()), dict(program.state_dict()))
        grads = [(e, p) for e, p in zip(torch.utils._pytree.tree_leaves(e_out),
                                        torch.utils._pytree.tree_leaves(p_out)) if e.requires_grad]
        if grads and not inside:
            e_copy = copy.deepcopy(model)  # eager's gradients, taken afresh (the call above is spent)
            with mode():
                e_grad_out = e_copy(*_fresh(args))
            e_req = [e for e in torch.utils._pytree.tree_leaves(e_grad_out) if e.requires_grad]
            sum(e.float().sum() for e in e_req).backward()
            sum(p.float().sum() for _, p in grads).backward()
            for (name, e_p), (_, p_p) in zip(e_copy.named_parameters(), program.named_parameters()):
                _assert_same(f"grad of {name}", e_p.grad, p_p.grad, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("model_name", list(MODELS))
@pytest.mark.parametrize("mode_name", list(MODES))
def test_export_under_callers_mode_equals_eager_under_it(mode_name, model_name):
    torch.manual_seed(0)
    model, mode = MODELS[model_name](), MODES[mode_name]
    args = (torch.randn(3, 4),)
    with mode():
        ep = pf.export(model, args)
        assert torch.is_grad_enabled() == (mode_name == "autocast_bf16")  # the caller's mode is kept
    assert check_contract(ep).ok
    _run_both(ep, model, args, mode)


@pytest.mark.parametrize("model_name", list(MODELS))
@pytest.mark.parametrize("mode_name", list(MODES))
def test_verify_compares_with_eager_under_the_callers_mode_at_export(mode_name, model_name):
    """pf.verify runs the model under the modes the program was exported under (its
    outer regions), wherever verify itself is called; a program exported without
    them is still compared with eager as called."""
    torch.manual_seed(0)
    model, mode = MODELS[model_name](), MODES[mode_name]
    args = (torch.randn(3, 4),)
    with mode():
        ep = pf.export(model, args)
        inside = pf.verify(ep, model, args, rtol=1e-2, atol=1e-2)
    outside = pf.verify(ep, model, args, rtol=1e-2, atol=1e-2)
    assert inside.ok and outside.ok, (inside.problems, outside.problems)
    if "autocast" not in mode_name:  # see the closing note: a plain program under a caller's
        plain = pf.export(model, args)  # autocast writes state in the autocast dtype
        with mode():
            assert pf.verify(plain, model, args).ok


def test_whole_forward_is_one_outer_region():
    with torch.no_grad():
        ep = pf.export(nn.Linear(3, 3), (torch.randn(2, 3),))
    calls = [n for n in ep.graph.nodes if n.op == "call_function"]
    assert calls[0].target is torch.ops.higher_order.pf_grad_region and calls[0].args[0] is False
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ep = pf.export(nn.Linear(3, 3), (torch.randn(2, 3),))
    assert ep.module()(torch.randn(2, 3)).dtype == torch.bfloat16  # called outside autocast


def test_inputs_made_under_inference_mode_export():
    model = nn.Linear(3, 3)
    with torch.inference_mode():
        x = torch.randn(2, 3)
        ep = pf.export(model, (x,))
        expected = model(x)
    assert torch.allclose(ep.module()(x.clone()), expected)


def test_parameter_clipped_then_read_with_grad_on_under_callers_no_grad_is_refused():
    """The clipped weight's identity is carried where the grad-off region ends; a grad-on
    region nested in it (here in the caller's no_grad) would lose eager's gradient."""
    model, args = ClipsThenReEnablesGrad(), (torch.randn(3, 4),)
    with torch.no_grad(), pytest.raises(pf.UnsupportedError, match=r"test_ambient_modes\.py:\d+ in forward\n\s+return self.lin\(x\)") as info:
        pf.export(model, args)
    assert info.value.kind is pf.Refusal.IDENTITY_IN_NESTED_GRAD_REGION
    _run_both(pf.export(model, args), model, args, contextlib.nullcontext)  # outside no_grad: carried


@pytest.mark.parametrize("model_cls", [UpdatesState, ReEnablesGrad])
def test_functionalize_under_no_grad(model_cls):
    model, x = model_cls(), torch.randn(3, 4)
    torch_ep = torch.export.export(copy.deepcopy(model), (x,))
    with torch.no_grad():
        ep = pf.functionalize(torch_ep, (x,))
    assert check_contract(ep).ok
    # the reference is torch's program under no_grad: it is what is functionalized (torch's
    # program keeps no region for ReEnablesGrad's enable_grad, equal to its own ambient mode)
    _run_both(ep, torch_ep.module(), (x,), torch.no_grad)


def _encoder():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(8)).eval()


@pytest.mark.parametrize("mode_name", ["no_grad", "inference_mode"])
def test_transformer_encoder_padding_mask_fast_path_equals_eager(mode_name):
    """Eager's nested-tensor fast path zeroes padded positions; torch.export's program
    does not (it differs there by up to 2.2 in this case); ours must equal eager,
    also when the mask is not left-aligned (eager then takes the dense path)."""
    model, mode = _encoder(), MODES[mode_name]
    x = torch.randn(2, 5, 8)
    mask = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    with mode():
        ep = pf.export(model, (x,), {"src_key_padding_mask": mask})
    for m in (mask, torch.tensor([[False] * 5, [False, True, False, True, True]])):
        with mode():
            expected = model(x, src_key_padding_mask=m)
        for inside in (True, False):
            with mode() if inside else contextlib.nullcontext():
                got = ep.module()(x, src_key_padding_mask=m)
            assert torch.allclose(got, expected, atol=1e-5), (got - expected).abs().max()
    # with grad on, eager takes the dense path and so does the program
    ep = pf.export(model, (x,), {"src_key_padding_mask": mask})
    assert torch.allclose(ep.module()(x, src_key_padding_mask=mask), model(x, src_key_padding_mask=mask), atol=1e-5)
