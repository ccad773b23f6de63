"""Module backward hooks: torch runs them from autograd nodes around a module call, which a
program has no place for. The full kind crashed inside torch's hook setup ("Error while setting
up backward hooks"); the deprecated ``register_backward_hook`` exported, and its program trained
without the hook, silently. Both refused now, naming the module, in export and export_joint."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import predispatch_func as pf
from predispatch_func import _torch_compat as tc


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 5), nn.GELU(), nn.Linear(5, 1)), (torch.randn(3, 4),)


def _halve(module, grad_input, grad_output):
    return (grad_input[0] * 0.5,)


HOOKS = {
    "full": lambda m: m.register_full_backward_hook(_halve),
    "full_pre": lambda m: m.register_full_backward_pre_hook(lambda module, grad_output: (grad_output[0] * 2,)),
    "deprecated": lambda m: m.register_backward_hook(_halve),
}


@pytest.mark.parametrize("entry", ["export", "export_joint"])
@pytest.mark.parametrize("kind", list(HOOKS))
def test_a_module_backward_hook_is_refused_naming_the_module(kind, entry):
    model, args = _net()
    HOOKS[kind](model[1])
    call = (lambda: pf.export(model, args)) if entry == "export" else (
        lambda: pf.export_joint(model, args, loss_fn=lambda out: out.pow(2).mean()))
    with pytest.raises(pf.UnsupportedError, match=r"module '1' \(GELU\) has a backward hook") as caught:
        call()
    assert caught.value.kind is pf.Refusal.MODULE_BACKWARD_HOOK


def test_a_global_module_backward_hook_is_refused():
    model, args = _net()
    handle = torch.nn.modules.module.register_module_full_backward_hook(_halve)
    try:
        with pytest.raises(pf.UnsupportedError, match="every module has a backward hook"):
            pf.export(model, args)
    finally:
        handle.remove()


def test_a_full_backward_hook_registered_inside_forward_is_refused_at_its_call():
    """Registered during the trace (past the check before it): caught where torch wraps the call."""

    class HooksItself(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = nn.Linear(4, 4)

        def forward(self, x):
            if not self.inner._backward_hooks:
                self.inner.register_full_backward_hook(_halve)
            return self.inner(x).sum()

    with pytest.raises(pf.UnsupportedError, match="full backward hook") as caught:
        pf.export(HooksItself(), (torch.randn(2, 4),), python_state="warn")
    assert caught.value.kind is pf.Refusal.MODULE_BACKWARD_HOOK


def test_the_hook_tables_read_are_torchs():
    """tc.module_backward_hooks reads each module's tables and torch's global registries."""
    model, _ = _net()
    assert tc.module_backward_hooks(model) == []
    handle = model[2].register_full_backward_hook(_halve)
    assert tc.module_backward_hooks(model) == [("module '2' (Linear)", "register_full_backward_hook")]
    handle.remove()
    assert tc.module_backward_hooks(model) == []
