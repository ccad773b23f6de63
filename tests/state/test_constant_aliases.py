"""A tensor constant held under two names is one input of the program and both names
among its constants, as torch.export has it (a submodule's attribute handed to its
parent too: ``M1(m2, m2.foo)``)."""

from __future__ import annotations

import pytest
import torch
from torch.export import unflatten
from torch.export.graph_signature import InputKind

from tests.support.reference import export_checked


class Inner(torch.nn.Module):
    def __init__(self, requires_grad: bool) -> None:
        super().__init__()
        self.foo = torch.ones(3, 3, requires_grad=requires_grad)

    def forward(self, x):
        return x * self.foo


class Outer(torch.nn.Module):
    def __init__(self, inner: Inner) -> None:
        super().__init__()
        self.inner = inner
        self.foo = inner.foo

    def forward(self, x):
        return x + self.foo + self.inner(x)


@pytest.mark.parametrize("requires_grad", [False, True])
def test_constant_under_two_names_is_one_input_with_both_names(requires_grad):
    model = Outer(Inner(requires_grad))
    x = torch.randn(3, 3)
    ep = export_checked(model, (x,))
    assert sorted(ep.constants) == ["foo", "inner.foo"]
    assert ep.constants["foo"] is ep.constants["inner.foo"]
    kinds = [s.kind for s in ep.graph_signature.input_specs]
    assert kinds.count(InputKind.CONSTANT_TENSOR) == 1
    torch.testing.assert_close(unflatten(ep)(x), model(x))
    torch.testing.assert_close(ep.module()(x), model(x))

