"""The test oracle: export, check the contract, replay against eager, snapshot.

Every edge-case test goes through :func:`export_checked`, so no test can
check a printed graph without also proving the program equals eager.
"""

from __future__ import annotations

import copy

import torch
from torch.export.graph_signature import OutputKind

import predispatch_func as pf
from predispatch_func.verify import all_graph_modules


def _state_snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict(keep_vars=True).items()}


def export_checked(model: torch.nn.Module, args: tuple, kwargs: dict | None = None, *,
                   check_values: bool = True, check_grads: bool = True,
                   **export_kwargs) -> torch.export.ExportedProgram:
    """Export, then prove: contract holds, replay equals eager, nothing of the caller changed."""
    kwargs = kwargs or {}
    before_state = _state_snapshot(model)
    before_inputs = copy.deepcopy((args, kwargs))
    before_rng = torch.get_rng_state()
    ep = pf.export(model, args, kwargs, **export_kwargs)
    assert torch.equal(torch.get_rng_state(), before_rng), "export moved the RNG state"
    after_state = _state_snapshot(model)
    assert before_state.keys() == after_state.keys()
    for k in before_state:
        assert torch.equal(before_state[k], after_state[k]), f"export changed model state {k}"
    flat_before = torch.utils._pytree.tree_leaves(before_inputs)
    flat_now = torch.utils._pytree.tree_leaves((args, kwargs))
    for a, b in zip(flat_before, flat_now):
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b), "export changed an input"
    pf.verify(ep, model, args, kwargs, raise_on_failure=True, check_values=check_values,
              check_grads=check_grads)
    return ep


def graph_code(ep: torch.export.ExportedProgram) -> str:
    """The top graph's code followed by each region body, for snapshots."""
    parts = []
    for where, gm in all_graph_modules(ep.graph_module):
        header = "" if where == "<top>" else f"# {where}\n"
        parts.append(header + gm.code.strip())
    return "\n\n".join(parts)


def export_case(name: str, **export_kwargs) -> torch.export.ExportedProgram:
    """Build the catalogue case ``name`` (tests/cases_core.py) and :func:`export_checked` it."""
    from cases_core import CASES

    case = CASES[name]
    model, args, kwargs = case.build()
    return export_checked(model, args, kwargs, check_values=case.check_values, **export_kwargs)


def mutations(ep: torch.export.ExportedProgram) -> list[tuple[str, str]]:
    """(kind, target) of every mutation output, in signature order."""
    return [(s.kind.name, s.target) for s in ep.graph_signature.output_specs
            if s.kind != OutputKind.USER_OUTPUT]


def call_targets(ep: torch.export.ExportedProgram) -> set[str]:
    """The names of every op called anywhere in the program, e.g. ``aten.linear.default``."""
    return {str(n.target) for _, gm in all_graph_modules(ep.graph_module)
            for n in gm.graph.nodes if n.op == "call_function"}
