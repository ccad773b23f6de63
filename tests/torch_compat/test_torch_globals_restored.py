"""Every torch global an export replaces is torch's again after it, also when it raises.

The trace replaces methods of ``nn.Module`` (the state guard's attribute-write record,
``__getattr__``), ``TransformerEncoder.forward`` (trace/fast_paths.py), methods of
``torch.Tensor``, ``autograd.Function.apply``, torch's seeding functions, and adds this
package's mode to each HOP's rule table (``python_key_table``). All but the last go
through ``_torch_compat/patches.py`` and are undone on every path; the HOP tables keep
the rule for our own mode type (found by exact type, so no other mode reaches it), and
every entry torch had is left as it was. torch's global modes the trace's environment
(trace/environment.py) enters and leaves (grad, inference and autocast state, the mode stacks,
functorch's levels, the exporting flag, global module hooks, dynamo's config) are as they were too.
"""

import random

import pytest
import torch
import torch._dynamo.config
import torch._export.wrappers
import torch._ops
import torch.fx.traceback
import torch.nn.modules.module
import torch.utils._python_dispatch
from torch.testing._internal.two_tensor import TwoTensor

import predispatch_func as pf
from predispatch_func import _torch_compat as tc
from predispatch_func.errors import ExportError, UnsupportedError
from predispatch_func.trace.stack import PolicyFunctionalMode

OWNERS = {
    "torch.nn.Module": torch.nn.Module,
    "torch.nn.TransformerEncoder": torch.nn.TransformerEncoder,
    "torch.Tensor": torch.Tensor,
    "torch.autograd.Function": torch.autograd.Function,
    "torch": torch,
    "torch.random": torch.random,
    "random": random,
    "FunctionalTensor": tc.FunctionalTensor,
    "torch._export.wrappers": torch._export.wrappers,
}


def _globals() -> dict[str, object]:
    return {f"{owner}.{name}": value for owner, obj in OWNERS.items() for name, value in list(vars(obj).items())}


_DEVICES = ("cpu", "cuda")


def _modes() -> dict[str, object]:
    """torch's global modes and the tables its global hooks live in, comparable by value."""
    return {
        "grad enabled": torch.is_grad_enabled(),
        "inference mode": torch.is_inference_mode_enabled(),
        "autocast": [(torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in _DEVICES],
        "autocast cache": torch.is_autocast_cache_enabled(),
        "default dtype": torch.get_default_dtype(),
        "torch function modes": torch._C._len_torch_function_stack(),
        "dispatch modes": torch.utils._python_dispatch._len_torch_dispatch_stack(),
        "pre-dispatch modes": torch._ops._len_torch_dispatch_stack_pre_dispatch(),
        "functorch levels": torch._C._functorch.peek_interpreter_stack(),
        "exporting": torch.compiler.is_exporting(),
        "node meta preserved": torch.fx.traceback.has_preserved_node_meta(),
        "global forward pre-hooks": list(torch.nn.modules.module._global_forward_pre_hooks),
        "global forward hooks": list(torch.nn.modules.module._global_forward_hooks),
        "dynamo automatic dynamic shapes": torch._dynamo.config.automatic_dynamic_shapes,
    }


def _torchs_hop_rules() -> dict[str, dict]:
    return {name: {k: v for k, v in table.items() if k is not PolicyFunctionalMode}
            for name, table in tc.hop_rule_tables().items()}


class Double(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


class Everything(torch.nn.Module):
    """Touches each replaced global: attribute writes, the encoder's fast path, a Function,
    a torch HOP, a seed, a region, a tensor subclass built and read apart."""

    def __init__(self, fail: str | None = None):
        super().__init__()
        layer = torch.nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
        self.enc = torch.nn.TransformerEncoder(layer, 1, enable_nested_tensor=False).eval()
        self.pair = torch.nn.Buffer(TwoTensor(torch.zeros(2, 3, 8), torch.ones(2, 3, 8)))
        self.fail = fail
        self.calls = 0

    def forward(self, x):
        self.calls = 0  # an attribute write the state guard records (same value: carried)
        with torch.no_grad():
            y = self.enc(x)
        y = Double.apply(y) + torch.cond(x.sum() > 0, lambda a: a + 1, lambda a: a - 1, (x,))
        y = y + (TwoTensor(x, x) + self.pair).b
        if self.fail == "python":
            raise ValueError("the model's own error")
        if self.fail == "refusal":
            torch.manual_seed(0)
            return y + torch.rand_like(y)  # a draw after reseeding inside forward: refused
        return y


def _export(model):
    pf.export(model, (torch.randn(2, 3, 8),))


@pytest.mark.parametrize("fail", [None, "python", "refusal"])
def test_torch_globals_are_torchs_after_an_export(fail):
    _export(Everything())  # the first export registers our mode's HOP rules
    before, hop_rules, modes = _globals(), _torchs_hop_rules(), _modes()
    if fail is None:
        _export(Everything())
    else:
        raised = UnsupportedError if fail == "refusal" else ExportError
        with pytest.raises(raised, match="draws from the global RNG" if fail == "refusal" else "the model's own error"):
            _export(Everything(fail))
    after = _globals()
    changed = sorted(name for name in before.keys() & after.keys() if before[name] is not after[name])
    assert changed == []
    assert sorted(before.keys() - after.keys()) == []
    assert _torchs_hop_rules() == hop_rules
    assert _modes() == modes


def test_the_check_sees_a_global_left_replaced():
    before = _globals()
    original = torch.nn.TransformerEncoder.forward
    torch.nn.TransformerEncoder.forward = lambda self, *a, **k: None
    try:
        after = _globals()
    finally:
        torch.nn.TransformerEncoder.forward = original
    assert [n for n in before if before[n] is not after[n]] == ["torch.nn.TransformerEncoder.forward"]


def test_the_check_sees_a_mode_left_changed():
    before = _modes()
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        during = _modes()
    assert {k for k in before if before[k] != during[k]} == {"autocast", "grad enabled"}


def test_the_callers_modes_are_the_callers_after_an_export_under_them():
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        modes = _modes()
        _export(Everything())
        assert _modes() == modes
