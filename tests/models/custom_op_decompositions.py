"""Decompositions a user would give for custom ops of the zoo's libraries (test material).

transformers' MoE layers call ``transformers::grouped_mm_fallback`` under export: a custom
op whose loop count is read from data (``offs.tolist()``), which torch cannot decompose.
Its meaning is simple: row ``r`` of ``input`` is multiplied by the weight of the expert
whose range holds it. Here that is a loop over the experts, whose number is static (the
weight's first size): each expert's product of every row, kept where the row is that
expert's. The numbers are eager's per row (the same vectors meet in each product); the cost
is one dense product per expert, where the kernel multiplies each row once.
"""

from __future__ import annotations

import torch


def grouped_mm_by_expert(input: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """``transformers::grouped_mm_fallback``: rows ``offs[e-1]:offs[e]`` times ``weight[e]``,
    rows past ``offs[-1]`` zero (as the op leaves them)."""
    rows = torch.arange(input.shape[0], device=input.device)
    expert = (rows.unsqueeze(1) >= offs.unsqueeze(0)).sum(1)  # how many ranges end at or before the row
    out = input.new_zeros(input.shape[0], weight.shape[2])
    for e in range(weight.shape[0]):
        out = torch.where((expert == e).unsqueeze(1), input @ weight[e], out)
    return out


def grouped_mm_backward_by_expert(input: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor,
                                  grad_output: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``transformers::grouped_mm_fallback_backward`` (met below autograd, by ``pf.eager``)."""
    rows = torch.arange(input.shape[0], device=input.device)
    expert = (rows.unsqueeze(1) >= offs.unsqueeze(0)).sum(1)
    grad_input = torch.zeros_like(input)
    grads = []
    for e in range(weight.shape[0]):
        mine = (expert == e).unsqueeze(1)
        grad_input = torch.where(mine, grad_output @ weight[e].T, grad_input)
        grads.append(input.T @ torch.where(mine, grad_output, 0.0))
    return grad_input, torch.stack(grads)


def transformers_decompositions() -> dict[str, object]:
    """The table for ``OpSet.with_decompositions``, for the ops this transformers registers."""
    try:
        import transformers.integrations.moe  # noqa: F401  (registers the custom ops)
    except ImportError:
        return {}
    table = {"transformers::grouped_mm_fallback": grouped_mm_by_expert,
             "transformers::grouped_mm_fallback_backward": grouped_mm_backward_by_expert}
    return {name: fn for name, fn in table.items() if _registered(name)}


def _registered(name: str) -> bool:
    namespace, op = name.split("::")
    return hasattr(getattr(torch.ops, namespace), op)
