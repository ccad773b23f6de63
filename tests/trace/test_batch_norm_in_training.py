"""Training batch norm on the CPU, traced straight as ``_native_batch_norm_legit``
(composite_policy's ``_batch_norm_as_on_the_cpu``): the program is the one the composite
chain gives, and the cases the shortcut leaves to the chain still export right."""

from __future__ import annotations

import pytest
import torch

import predispatch_func as pf
from predispatch_func.trace import composite_policy
from tests.support.reference import export_checked


def _program(model: torch.nn.Module, args: tuple) -> str:
    ep = pf.export(model, args)
    return ep.graph_module.code + str(ep.graph_signature)


class _ConvNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3)
        self.bn = torch.nn.BatchNorm2d(8)
        self.bn_no_affine = torch.nn.BatchNorm2d(8, affine=False, momentum=0.5)
        self.bn1d = torch.nn.BatchNorm1d(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.bn_no_affine(torch.relu(self.bn(self.conv(x))))
        return self.bn1d(y.mean((2, 3)))


def test_the_shortcut_gives_the_program_of_the_composite_chain(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pins torch: on the CPU, ``batch_norm`` in training ends in ``_native_batch_norm_legit``
    (through ``_batch_norm_impl_index`` and ``native_batch_norm``); should torch route it
    elsewhere, the shortcut would give another program than the chain and this fails."""
    model, args = _ConvNet().train(), (torch.randn(4, 3, 10, 10),)
    shortcut = _program(model, args)
    monkeypatch.setattr(composite_policy, "_cpu_chain_known", lambda *a: False)
    assert _program(model, args) == shortcut


def test_the_shortcut_is_taken() -> None:
    model, args = _ConvNet().train(), (torch.randn(4, 3, 10, 10),)
    calls = []
    original = composite_policy._batch_norm_as_on_the_cpu

    def counted(*a: object) -> object:
        calls.append(1)
        return original(*a)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(composite_policy, "_batch_norm_as_on_the_cpu", counted)
        export_checked(model, args)
    assert len(calls) == 3


def test_eagers_kernel_is_the_one_the_shortcut_calls() -> None:
    """Bit for bit: output and running statistics, as eager's ``F.batch_norm`` in training."""
    x, weight, bias = torch.randn(4, 5, 6, 6), torch.randn(5), torch.randn(5)
    stats = [torch.randn(5), torch.rand(5) + 0.5]
    theirs = [s.clone() for s in stats]
    out = torch.nn.functional.batch_norm(x, *stats, weight, bias, training=True, momentum=0.3, eps=1e-3)
    legit = torch.ops.aten._native_batch_norm_legit.default(x, weight, bias, *theirs, True, 0.3, 1e-3)[0]
    assert torch.equal(out, legit)
    assert all(torch.equal(a, b) for a, b in zip(stats, theirs))


@pytest.mark.parametrize("case", ["empty_batch", "autocast", "eval", "no_running_stats"])
def test_calls_the_shortcut_leaves_to_the_chain_export_right(case: str) -> None:
    bn = torch.nn.BatchNorm2d(4, track_running_stats=case != "no_running_stats").train(case != "eval")
    x = torch.randn(0 if case == "empty_batch" else 3, 4, 5, 5)
    if case == "autocast":
        class InAutocast(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.conv, self.bn = torch.nn.Conv2d(4, 4, 1), bn

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    return self.bn(self.conv(x))
        export_checked(InAutocast().train(), (x,), tolerance={"rtol": 1e-2, "atol": 1e-2})
    else:
        export_checked(bn, (x,))
