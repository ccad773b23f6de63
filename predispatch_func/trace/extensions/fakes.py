"""Fresh fake values for traced bodies and the values a traced graph returns.

Every subgraph our HOPs hold is traced over fresh tensors shaped like the
operands (never aliases of them), and its results are read back from the
graph's ``val`` metadata to make the caller's results.
"""

from __future__ import annotations

from typing import Any

import torch

from ... import _torch_compat as tc


def fresh_like(t: torch.Tensor, contiguous: bool = False) -> torch.Tensor:
    """A new (fake) tensor with ``t``'s metadata, never an alias of an operand."""
    mode = tc.fake_mode_of([t])
    with tc.outside_trace(), tc.only_function_modes(_none), (mode if mode is not None else torch.no_grad()):
        if contiguous:
            return torch.empty(t.shape, dtype=t.dtype, device=t.device)
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)


def _none(mode: object) -> bool:
    """No torch-function mode sees a fake being made: it records nothing (``only_function_modes``)."""
    return False


def output_values(gm: torch.fx.GraphModule) -> list[Any]:
    """The ``val`` of each output of a traced graph."""
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    return [a.meta["val"] if isinstance(a, torch.fx.Node) else a for a in out.args[0]]


__all__ = ["fresh_like", "output_values"]
