"""Every torch global an export replaces is torch's again after it, also when it raises.

The trace replaces methods of ``nn.Module`` (the state guard's attribute-write record,
``__getattr__``), ``TransformerEncoder.forward`` (trace/fast_paths.py), methods of
``torch.Tensor``, ``autograd.Function.apply``, torch's seeding functions, and adds this
package's mode to each HOP's rule table (``python_key_table``). All but the last go
through ``_torch_compat/patches.py`` and are undone on every path; the HOP tables keep
the rule for our own mode type (found by exact type, so no other mode reaches it), and
every entry torch had is left as it was.
"""

import random

import pytest
import torch

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
}


def _globals() -> dict[str, object]:
    return {f"{owner}.{name}": value for owner, obj in OWNERS.items() for name, value in list(vars(obj).items())}


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
    a torch HOP, a seed, a region."""

    def __init__(self, fail: str | None = None):
        super().__init__()
        layer = torch.nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
        self.enc = torch.nn.TransformerEncoder(layer, 1, enable_nested_tensor=False).eval()
        self.fail = fail
        self.calls = 0

    def forward(self, x):
        self.calls = 0  # an attribute write the state guard records (same value: carried)
        with torch.no_grad():
            y = self.enc(x)
        y = Double.apply(y) + torch.cond(x.sum() > 0, lambda a: a + 1, lambda a: a - 1, (x,))
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
    before, hop_rules = _globals(), _torchs_hop_rules()
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


def test_the_check_sees_a_global_left_replaced():
    before = _globals()
    original = torch.nn.TransformerEncoder.forward
    torch.nn.TransformerEncoder.forward = lambda self, *a, **k: None
    try:
        after = _globals()
    finally:
        torch.nn.TransformerEncoder.forward = original
    assert [n for n in before if before[n] is not after[n]] == ["torch.nn.TransformerEncoder.forward"]
