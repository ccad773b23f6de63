"""The errors a newcomer meets first read as one paragraph: what was met, where, what to do.

An output of a type pytree does not know (transformers' ``DynamicCache``) and
``torch.autograd.grad`` / ``backward()`` inside ``forward`` are refusals with a kind
(``OUTPUT_NOT_A_PYTREE``, ``AUTOGRAD_CALL_IN_FORWARD``); each fix the message names is
shown to work, and torch.export's failure on the same model is pinned where the
message cites it.
"""

import os
import re

import pytest
import torch
from torch import nn

import predispatch_func as pf
from tests.support.reference import export_checked

# --- an output pytree does not know ---------------------------------------------------------


class Cache:
    """A library's cache object: tensors inside a type pytree was never told about."""

    def __init__(self, keys: torch.Tensor):
        self.keys = keys


class ReturnsCache(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        y = self.lin(x)
        return {"logits": y, "state": [y.sum(), Cache(y * 2)]}


def test_an_output_of_an_unknown_type_names_the_type_the_path_and_the_fix():
    with pytest.raises(pf.UnsupportedError) as caught:
        pf.export(ReturnsCache(), (torch.randn(2, 3),))
    assert caught.value.kind is pf.Refusal.OUTPUT_NOT_A_PYTREE
    message = str(caught.value)
    assert message.startswith(
        "ReturnsCache.forward returned a tests.trace.test_newcomer_errors.Cache at output['state'][1], a type pytree does "
        "not know, so no program can return it (torch.export refuses it too). Register it as a pytree node "
        "before exporting: torch.utils._pytree.register_pytree_node(Cache, flatten_fn, unflatten_fn)"), message
    assert "test_newcomer_errors.py:" in message and "in ReturnsCache.forward" in message


def test_torch_export_refuses_the_same_output():
    """The message says torch.export refuses it too: pinned here."""
    with pytest.raises(RuntimeError, match="in output, which is not a known type"):
        torch.export.export(ReturnsCache(), (torch.randn(2, 3),))


def test_registering_the_type_as_the_message_says_exports_it():
    torch.utils._pytree.register_pytree_node(
        Cache, lambda c: ([c.keys], None), lambda leaves, _: Cache(leaves[0]),
        serialized_type_name="test_newcomer_errors.Cache")
    try:
        ep = export_checked(ReturnsCache(), (torch.randn(2, 3),))
        assert isinstance(ep.module()(torch.randn(2, 3))["state"][1], Cache)
    finally:
        torch.utils._pytree._deregister_pytree_node(Cache)


def _tiny_gpt2():
    transformers = pytest.importorskip("transformers")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    config = transformers.GPT2Config(vocab_size=100, n_positions=16, n_embd=16, n_layer=2, n_head=2,
                                     bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config).eval(), torch.randint(0, 100, (1, 8))


def test_transformers_gpt2_dynamic_cache_names_the_librarys_helper():
    model, ids = _tiny_gpt2()
    with pytest.raises(pf.UnsupportedError) as caught:
        pf.export(model, (ids,))
    err = caught.value
    assert err.kind is pf.Refusal.OUTPUT_NOT_A_PYTREE
    assert "returned a transformers.cache_utils.DynamicCache at output" in str(err)
    assert "transformers.integrations.executorch.register_dynamic_cache_export_support()" in str(err)
    assert "use_cache=False" in str(err)
    assert err.source is not None and "modeling_gpt2.py" in err.source  # the model's forward, past decorators


def test_transformers_gpt2_without_the_cache_exports_as_the_message_says():
    model, ids = _tiny_gpt2()
    export_checked(model, (ids,), {"use_cache": False})


# --- torch.autograd.grad and backward() inside forward ---------------------------------------


class GradientPenalty(nn.Module):
    """A gradient penalty: the gradient of the output with respect to the input, in forward."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        x = x.detach().requires_grad_()
        energy = self.lin(x).pow(2).sum()
        (force,) = torch.autograd.grad(energy, x, create_graph=True)
        return force * 2


class GradientPenaltyUnused(GradientPenalty):
    """``allow_unused=True, materialize_grads=True`` would hand the trace zeros: silently wrong."""

    def forward(self, x):
        x = x.detach().requires_grad_()
        energy = self.lin(x).pow(2).sum()
        (force,) = torch.autograd.grad(energy, x, create_graph=True, allow_unused=True, materialize_grads=True)
        return force * 2


class BackwardInForward(GradientPenalty):
    def forward(self, x):
        x = x.detach().requires_grad_()
        self.lin(x).pow(2).sum().backward()
        return x.grad * 2


class FuncGrad(GradientPenalty):
    """The traceable spelling the message suggests."""

    def forward(self, x):
        return torch.func.grad(lambda z: self.lin(z).pow(2).sum())(x) * 2


@pytest.mark.parametrize("model, what, line", [
    (GradientPenalty, "torch.autograd.grad", r"\(force,\) = torch\.autograd\.grad\(energy, x, create_graph=True\)"),
    (GradientPenaltyUnused, "torch.autograd.grad", r"\(force,\) = torch\.autograd\.grad\(energy, x, create_graph"),
    (BackwardInForward, "backward()", r"self\.lin\(x\)\.pow\(2\)\.sum\(\)\.backward\(\)"),
])
def test_a_backward_pass_inside_forward_is_refused_with_the_traceable_spelling(model, what, line):
    with pytest.raises(pf.UnsupportedError) as caught:
        pf.export(model(), (torch.randn(2, 3),))
    err = caught.value
    assert err.kind is pf.Refusal.AUTOGRAD_CALL_IN_FORWARD and err.op == what
    after_autograd = (", or export with pre_dispatch=False, where torch.autograd.grad is traced (without "
                      "grad-mode and autocast regions)" if what == "torch.autograd.grad" else "")
    assert err.reason == (
        f"{what} is called inside forward: the pre-dispatch trace runs forward before autograd, so there is "
        "no autograd graph to differentiate yet (torch.export fails on it too). Use torch.func.grad or "
        f"torch.func.vjp inside forward, which export traces{after_autograd}")
    assert re.fullmatch(r".*test_newcomer_errors\.py:\d+ in forward\n\s+" + line + r".*", err.source, re.S), err.source


def test_torch_func_grad_inside_forward_exports():
    export_checked(FuncGrad(), (torch.randn(2, 3),))


def test_after_autograd_torch_autograd_grad_is_traced():
    export_checked(GradientPenalty(), (torch.randn(2, 3),), pre_dispatch=False)


def test_eager_runs_a_backward_pass_inside_forward_while_export_refuses_one():
    """The routing refuses only on the trace: the state judge's eager calls and the caller's run."""
    model = GradientPenalty()
    assert model(torch.randn(2, 3)).shape == (2, 3)


def test_torch_export_still_fails_on_torch_autograd_grad_inside_forward():
    """The message says torch.export cannot export it either (torch 2.13 to 2.15): pinned here."""
    with pytest.raises(RuntimeError, match="fake tensor in the exported program constant's list"):
        torch.export.export(GradientPenalty(), (torch.randn(2, 3),))
