"""The built-in example shown by ``predispatch-func demo``.

One small module that exercises each promise of the IR at once: an input
mutated through a view, a buffer mutation, an honest composite kept as one
node, and a lying composite (``type_as`` returning its input) decomposed so
the in-place op after it still reaches the input.
"""

from __future__ import annotations

import torch


class DemoBlock(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)
        self.norm = torch.nn.LayerNorm(4)
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    calls: torch.Tensor

    def forward(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        x[:, 0].mul_(2)                     # input mutated through a view
        self.calls.add_(1)                  # buffer mutation
        same = scale.type_as(x)             # lying composite: returns `scale` itself
        same.add_(1)                        # ... so this must write to `scale`
        return self.norm(self.proj(x)) * same  # honest composites: linear, layer_norm


def example() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return DemoBlock(), (torch.randn(3, 4), torch.randn(3, 4))
