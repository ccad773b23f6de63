"""The same property, checked on torch 2.13's own functional entry points.

Numbers for the closing note, not tests: how often does a generated program
come out of ``torch.export.export(m, args).run_decompositions({})`` or
``aot_export_module(m, args, trace_joint=False, pre_dispatch=True)`` raising,
or running but different from eager? Each checker returns an :class:`Outcome`.
"""

from __future__ import annotations

import dataclasses
import warnings

import torch

import predispatch_func as pf
from predispatch_func.verify import _compare, _loss, _none_as_zeros

from .harness import eager_backward_runs
from .program import Program


@dataclasses.dataclass(frozen=True)
class Outcome:
    status: str  # "pass" | "raised" | "wrong"
    detail: str = ""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:200]


def check_torch_export(program: Program) -> Outcome:
    """``export().run_decompositions({})``, replayed through ``.module()`` by our verifier."""
    model, args = program.build()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ep = torch.export.export(model, args).run_decompositions({})
    except Exception as exc:
        return Outcome("raised", _first_line(exc))
    model, args = program.build()
    try:
        report = pf.verify(ep, model, args, check_grads=eager_backward_runs(program))
    except Exception as exc:
        return Outcome("wrong", "replay raised " + _first_line(exc))
    return Outcome("pass") if report.ok else Outcome("wrong", report.problems[0][:200])


def check_torch_aot(program: Program) -> Outcome:
    """``aot_export_module(pre_dispatch=True)``: we run its graph and write mutations back."""
    from torch._functorch.aot_autograd import aot_export_module

    model, args = program.build()
    try:
        gm, sig = aot_export_module(model, args, trace_joint=False, pre_dispatch=True)
    except Exception as exc:
        return Outcome("raised", _first_line(exc))
    try:
        problems = _replay_aot(program, gm, sig)
    except Exception as exc:
        return Outcome("wrong", "replay raised " + _first_line(exc))
    return Outcome("pass") if not problems else Outcome("wrong", problems[0][:200])


def _fresh(program: Program, grad: bool):
    model, args = program.build()
    if not grad:
        args = tuple(a.detach() for a in args)
    return model, args


def _replay_aot(program: Program, gm: torch.fx.GraphModule, sig) -> list[str]:
    """Outputs are the new values of mutated parameters, buffers and inputs first (in
    input order), then user outputs."""
    grad = eager_backward_runs(program)
    e_model, e_args = _fresh(program, grad)
    e_out = e_model(*e_args)
    p_model, p_args = _fresh(program, grad)
    state = {**dict(p_model.named_parameters()), **dict(p_model.named_buffers())}
    flat = [state[n] for n in sig.parameters] + [state[n] for n in sig.buffers] + list(p_args)
    outs = gm(*flat)
    mutated = {**sig.parameters_to_mutate, **sig.buffers_to_mutate, **sig.user_inputs_to_mutate}
    out_names = [getattr(n, "name", None) for n in next(iter(reversed(gm.graph.nodes))).args[0]]
    writes = [mutated[name] for name in out_names[:len(mutated)]]
    p_args = list(p_args)
    for target, new in zip(writes, outs):
        if target in state:
            with torch.no_grad():
                state[target].copy_(new)
        else:
            p_args[sig.user_inputs.index(target)] = new
    p_out = tuple(outs[len(writes):])
    problems: list[str] = []
    _compare("output", tuple(e_out), p_out, 1e-4, 1e-5, True, problems)
    _compare("input after call", tuple(e_args), tuple(p_args), 1e-4, 1e-5, True, problems)
    p_state = {**dict(p_model.named_parameters()), **dict(p_model.named_buffers())}
    for name, value in [*e_model.named_parameters(), *e_model.named_buffers()]:
        _compare(f"{name} after call", value, p_state[name], 1e-4, 1e-5, True, problems)
    e_loss, p_loss = _loss(e_out, 1), _loss(p_out, 1)
    if grad and e_loss is not None and p_loss is not None:
        e_loss.backward()
        p_loss.backward()
        _compare("input grads", *_none_as_zeros([a.grad for a in e_args], [a.grad for a in p_args]),
                 1e-4, 1e-5, True, problems)
    elif (e_loss is None) != (p_loss is None):
        problems.append("outputs require grad in one of eager and program only")
    return problems
