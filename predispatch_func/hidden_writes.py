"""Run a program's graph itself and check that it wrote none of its inputs.

The contract check reads op schemas, so it cannot see a kept node whose kernel
writes an input its schema does not mark (``batch_norm`` updating its running
statistics): the program's replay then even matches eager, because the kernel
writes the real buffer. Running ``ep.graph_module`` on copies of every input
it takes (parameters, buffers, constants, user inputs) and comparing each with
its value before the call shows any such write, whatever op made it.
"""

from __future__ import annotations

from typing import Any

import torch

from . import _torch_compat as tc


def _comparable(t: Any) -> bool:
    """Plain dense tensors with data (a subclass, sparse or meta tensor is left out)."""
    return type(t) in (torch.Tensor, torch.nn.Parameter) and t.layout == torch.strided and not t.is_meta


def _same(before: torch.Tensor, after: torch.Tensor) -> bool:
    if before.is_complex() or before.is_floating_point():
        return bool(torch.equal(before.isnan(), after.isnan())) and bool(
            torch.equal(before.nan_to_num(), after.nan_to_num()))
    return bool(torch.equal(before, after))


def inputs_the_graph_writes(ep: torch.export.ExportedProgram, args: tuple, kwargs: dict,
                            seed: int) -> list[str]:
    """The placeholders whose values a call of ``ep.graph_module`` changed, by name.

    ``ep`` must be a copy the caller may spend: its state is what the graph reads.
    A graph that raises is not judged here (the replay reports it)."""
    flat = tc.graph_module_flat_inputs(ep, args, kwargs)
    names = [n.name for n in ep.graph_module.graph.nodes if n.op == "placeholder"]
    before = {i: t.detach().clone() for i, t in enumerate(flat) if _comparable(t)}
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():  # the caller's RNG stays as it was
            torch.manual_seed(seed)
            ep.graph_module(*flat)
    except Exception:  # noqa: BLE001 (the replay runs the same program and reports how it fails)
        return []
    return [names[i] if i < len(names) else f"input {i}"
            for i, old in before.items() if not _same(old, flat[i].detach())]
