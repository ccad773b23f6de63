"""An ``nn.Module`` passed as an input, as torch.export takes it: its parameters and
buffers are user inputs of the program, so ``ep.module()`` called with another
instance of that module computes with that instance's weights."""

from __future__ import annotations

import torch
from torch.export.graph_signature import InputKind

from tests.support.reference import export_checked


class Scale(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(3, 3)
        self.register_buffer("offset", torch.randn(3))

    def forward(self, x, y):
        return self.linear(x) * y + self.offset


class TakesAModule(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.own = torch.nn.Linear(3, 3)

    def forward(self, x, y, m):
        return m(self.own(x), y) + x + y


def test_module_input_weights_are_user_inputs():
    model, x, y = TakesAModule(), torch.randn(3), torch.randn(3)
    ep = export_checked(model, (x, y, Scale()))
    kinds = [s.kind for s in ep.graph_signature.input_specs]
    assert kinds.count(InputKind.PARAMETER) == 2  # the model's own Linear
    assert kinds.count(InputKind.USER_INPUT) == 2 + 3  # x, y and the input module's weight, bias, offset
    other = Scale()  # another instance: the program computes with its weights
    torch.testing.assert_close(ep.module()(x, y, other), model(x, y, other))
