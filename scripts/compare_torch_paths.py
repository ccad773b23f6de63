"""Run the edge-case catalogue through our exporter and torch 2.13's functional paths.

Every case of ``tests/support/cases_core.py`` is exported three ways, and each result
is replayed against the reference by the same code (``predispatch_func.verify``):
outputs, written-back inputs and buffers, and gradients. The contract check
(no mutable node) is applied to all three.

* ours: ``predispatch_func.export(m, args, kwargs)``;
* torch ``export(m, args).run_decompositions({})``;
* torch ``aot_export_module(m, args, trace_joint=False, pre_dispatch=True)``,
  replayed through a wrapper that feeds parameters, buffers and flat inputs to
  the graph and writes the mutation outputs (which come first) back (the
  model's outputs are flattened to a tuple, as that API requires).

A cell reads ``ok``, ``WRONG`` (the program runs but differs from eager, or
holds a mutable node, or raises when replayed) or ``error`` (the exporter
raised). A second table runs the cases we refuse (``REFUSED``): ours reads
``refused`` when it raises its clear UnsupportedError. Usage:
``python -m scripts.compare_torch_paths [-k SUBSTRING]``.
"""

from __future__ import annotations

import argparse
import copy
import warnings
from collections.abc import Callable
from typing import Any

import torch
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

import predispatch_func as pf  # noqa: E402
from predispatch_func import _torch_compat as tc  # noqa: E402
from predispatch_func.verify import VerifyReport, mutable_target_reason  # noqa: E402
from predispatch_func.verify import replay_against_reference as replay  # noqa: E402
from tests.support.cases_core import REFUSED, Case, all_cases  # noqa: E402

Outcome = tuple[str, str]  # (status, detail)


def _outcome(report: VerifyReport) -> Outcome:
    return ("ok", "") if report.ok else ("WRONG", report.problems[0])


def _error(exc: BaseException) -> Outcome:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return "error", f"{type(exc).__name__}: {first}"


def _checked(report: Callable[[], VerifyReport]) -> Outcome:
    """Replay; a program that raises while replayed (e.g. in backward) is WRONG."""
    try:
        return _outcome(report())
    except Exception as exc:
        return "WRONG", f"replay raised {_error(exc)[1]}"


def run_ours(case: Case) -> Outcome:
    model, args, kwargs = case.build()
    try:
        ep = pf.export(model, args, kwargs)
    except pf.UnsupportedError as exc:
        return "refused", str(exc).splitlines()[0]
    return _checked(lambda: pf.verify(ep, model, args, kwargs, check_values=case.check_values))


def run_torch_run_decompositions(case: Case) -> Outcome:
    model, args, kwargs = case.build()
    ep = torch.export.export(copy.deepcopy(model), args, kwargs).run_decompositions({})
    return _checked(lambda: pf.verify(ep, model, args, kwargs, check_values=case.check_values))


def run_torch_export_replay_only(case: Case) -> Outcome:
    """Plain ``torch.export.export`` (not functional, so only its replay is judged)."""
    model, args, kwargs = case.build()
    ep = torch.export.export(copy.deepcopy(model), args, kwargs)
    return _checked(lambda: replay(ep.module(), model, args, kwargs, check_values=case.check_values))


def _returning_flat_tuple(model: torch.nn.Module) -> torch.nn.Module:
    """torch's aot_export_module wants a tuple of outputs: flatten the pytree the model returns."""
    flat_model = copy.deepcopy(model)
    forward = flat_model.forward
    flat_model.forward = lambda *a, **k: tuple(tc.pytree.tree_leaves(forward(*a, **k)))
    return flat_model


def aot_program(model: torch.nn.Module, gm: torch.fx.GraphModule, sig: Any,
                out_spec: Any) -> torch.nn.Module:
    """A copy of ``model`` whose forward runs torch's aot graph and applies its mutations.

    Keeping the model's own parameters and buffers (same names) lets the replay
    compare buffers and parameter gradients exactly as for an ExportedProgram.
    """
    program = copy.deepcopy(model)
    params = dict(program.named_parameters(remove_duplicate=False))
    buffers = dict(program.named_buffers(remove_duplicate=False))
    outputs = [a.name if isinstance(a, torch.fx.Node) else None
               for a in next(n for n in reversed(gm.graph.nodes) if n.op == "output").args[0]]
    n_mutations = len(outputs) - len(sig.user_outputs)

    def forward(*args, **kwargs):
        flat = tc.pytree.tree_leaves((args, kwargs))
        state = [params[n] for n in sig.parameters] + [buffers[n] for n in sig.buffers]
        results = gm(*state, *flat)
        for name, value in zip(outputs[:n_mutations], results[:n_mutations]):
            if name in sig.buffers_to_mutate:
                buffers[sig.buffers_to_mutate[name]].copy_(value)
            elif name in sig.parameters_to_mutate:
                params[sig.parameters_to_mutate[name]].copy_(value)
            else:
                flat[sig.user_inputs.index(sig.user_inputs_to_mutate[name])].copy_(value)
        return tc.pytree.tree_unflatten(list(results[n_mutations:]), out_spec)

    program.forward = forward
    return program


def _eager_out_spec(model: torch.nn.Module, args: tuple, kwargs: dict) -> Any:
    with torch.random.fork_rng(devices=[]):
        out = copy.deepcopy(model)(*copy.deepcopy(args), **copy.deepcopy(kwargs))
    return tc.pytree.tree_flatten(out)[1]


def run_torch_aot_pre_dispatch(case: Case, judge_contract: bool = True) -> Outcome:
    """``judge_contract=False`` judges the replay only (its grad toggles are side-effect nodes)."""
    model, args, kwargs = case.build()
    gm, sig = tc.torch_aot_export_module(_returning_flat_tuple(model), args, kwargs, pre_dispatch=True)
    program = aot_program(model, gm, sig, _eager_out_spec(model, args, kwargs))

    def report() -> VerifyReport:
        found = VerifyReport(checked=["contract"])
        for node in gm.graph.nodes if judge_contract else ():
            if node.op == "call_function" and (why := mutable_target_reason(node.target)):
                found.problems.append(f"node {node.format_node()} is not functional: {why}")
        found.problems += replay(program, model, args, kwargs, check_values=case.check_values).problems
        return found
    return _checked(report)


PATHS: dict[str, Callable[[Case], Outcome]] = {
    "ours": run_ours,
    "torch run_decompositions({})": run_torch_run_decompositions,
    "torch aot_export_module(pre_dispatch)": run_torch_aot_pre_dispatch,
}


# for what we refuse, plain torch.export is worth a look too: it often "succeeds"
REFUSED_PATHS = {**PATHS, "torch export, in-place kept (replay only)": run_torch_export_replay_only}


def run_all(cases: list[Case], paths: dict[str, Callable[[Case], Outcome]] = PATHS
            ) -> dict[str, dict[str, Outcome]]:
    results: dict[str, dict[str, Outcome]] = {}
    for case in cases:
        results[case.name] = {}
        for path, run in paths.items():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    results[case.name][path] = run(case)
                except Exception as exc:  # an exporter that raises is a result, not a crash
                    results[case.name][path] = _error(exc)
    return results


_STYLE = {"ok": "green", "WRONG": "bold red", "error": "yellow", "refused": "cyan"}


def render(results: dict[str, dict[str, Outcome]], details: bool, title: str,
           paths: dict[str, Callable[[Case], Outcome]] = PATHS) -> None:
    console = Console(width=200)
    table = Table(title=title)
    table.add_column("case")
    for path in paths:
        table.add_column(path)
    for name, row in results.items():
        cells = []
        for path in paths:
            status, detail = row[path]
            text = f"[{_STYLE[status]}]{status}[/]"
            cells.append(f"{text} {detail[:70]}" if details and detail else text)
        table.add_row(name, *cells)
    totals = []
    for path in paths:
        counts = {s: sum(row[path][0] == s for row in results.values()) for s in _STYLE}
        totals.append(" / ".join(f"{counts[s]} {s}" for s in _STYLE if counts[s] or s != "refused"))
    table.add_section()
    table.add_row("[bold]total[/]", *totals)
    console.print(table)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-k", default="", help="only cases whose name contains this")
    parser.add_argument("--details", action="store_true", help="show the first problem of each cell")
    opts = parser.parse_args(argv)
    cases = [c for c in all_cases() if opts.k in c.name]
    render(run_all(cases), opts.details, f"{len(cases)} edge cases, replayed against the reference")
    refused = [c for c in REFUSED.values() if opts.k in c.name]
    if refused:
        render(run_all(refused, REFUSED_PATHS), opts.details,
               f"{len(refused)} cases we refuse with a clear error (ok/WRONG: torch's program vs eager)",
               REFUSED_PATHS)


if __name__ == "__main__":
    main()
