"""Which ops a program uses: the data behind ``predispatch-func ops``.

For each operator: how often it is called (all graphs), whether it is Core
ATen, what the composite policy decided for it (a composite kept because the
audit found it honest), whether torch can decompose it, and where in the model
it is called (the innermost module of ``nn_module_stack`` and the user's
line). Given a target, each op outside it says why it is missing.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any

import torch

from .. import _torch_compat as tc
from ..artifacts import program_facts
from ..graphs import all_graph_modules
from .lowering import Lowering, MissingOp, _user_line, is_infrastructure
from .opset import OpSet

_WHERE_SHOWN = 3


@dataclasses.dataclass
class OpUse:
    """One operator of a program (JSON-ready through :func:`dataclasses.asdict`)."""

    op: str
    count: int
    core_aten: bool
    composite: str  # "" for a kernel; else "kept (audit)", "kept (trace-time guard)", ...
    has_decomposition: bool
    where: list[str]
    in_target: bool | None = None  # None without a target
    missing_why: str | None = None


def ops_report(ep: torch.export.ExportedProgram, target: OpSet | None = None,
               missing: dict[str, MissingOp] | None = None) -> list[OpUse]:
    """One :class:`OpUse` per operator in ``ep``, most called first.

    ``missing`` (from a failed ``export(..., target=)``) overrides the reasons
    for ops the lowering could not remove.
    """
    core = OpSet.core_aten()
    lowering = Lowering(target if target is not None else core)
    decisions = program_facts(ep.graph_module).composite_decisions
    counts: dict[Any, int] = {}
    places: dict[Any, list[str]] = {}
    for _, gm in all_graph_modules(ep.graph_module):
        for node in gm.graph.nodes:
            if node.op != "call_function" or not isinstance(node.target, tc.OpOverload) \
                    or is_infrastructure(node.target):
                continue
            counts[node.target] = counts.get(node.target, 0) + 1
            where = places.setdefault(node.target, [])
            place = _where(node)
            if place and place not in where:
                where.append(place)
    counts_by_name = {str(op) for op in counts}
    uses = []
    for op, count in sorted(counts.items(), key=lambda kv: (-kv[1], str(kv[0]))):
        name = str(op)
        use = OpUse(op=name, count=count, core_aten=op in core,
                    composite=_composite(op, decisions.get(name)),
                    has_decomposition=Lowering(OpSet()).decomposition(op) is not None,
                    where=_shorten(places[op]))
        if target is not None:
            use.in_target = op in target
            if not use.in_target:
                use.missing_why = (missing[name].why if missing and name in missing
                                   else _why(lowering, op))
        uses.append(use)
    for name, miss in sorted((missing or {}).items()):  # emitted while lowering, not in ep
        if name not in counts_by_name:
            uses.append(OpUse(op=name, count=len(miss.lines), core_aten=False, composite="",
                              has_decomposition=False, where=_shorten([_short(x) for x in miss.lines]),
                              in_target=False, missing_why=f"{miss.why} (emitted while lowering)"))
    return uses


def _composite(op: tc.OpOverload, decision: tuple[str, str] | None) -> str:
    if not tc.has_composite_implicit_kernel(op):
        return ""
    if decision is None:
        return "kept"
    verdict, why = decision
    return f"{'kept' if verdict == 'keep' else 'decomposed'} ({why})"


def _why(lowering: Lowering, op: tc.OpOverload) -> str:
    if lowering.decomposition(op) is not None:
        return "decomposes: export(..., target=) lowers it"
    return lowering.why_missing(str(op))


def _where(node: torch.fx.Node) -> str | None:
    line = _user_line(node)
    place = _short(line) if line else ""
    stack = node.meta.get("nn_module_stack")
    if stack:
        fqn, kind = list(stack.values())[-1]
        kind_name = kind if isinstance(kind, str) else getattr(kind, "__name__", str(kind))
        place = f"{fqn or '<root>'} ({kind_name.rsplit('.', 1)[-1]}) {place}".strip()
    return place or None


def _short(line: str) -> str:
    """``File "/a/b/m.py", line 7, in forward: code`` -> ``m.py:7 code``."""
    match = re.match(r'File "(.*)", line (\d+), in [^:]*: ?(.*)', line)
    return f"{os.path.basename(match[1])}:{match[2]} {match[3]}".strip() if match else line


def _shorten(places: list[str]) -> list[str]:
    if len(places) <= _WHERE_SHOWN:
        return places
    return [*places[:_WHERE_SHOWN], f"... {len(places) - _WHERE_SHOWN} more"]
