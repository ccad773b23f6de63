"""Export one case with ours or with ``torch.export.export`` and judge the result.

Both exporters are judged by the same replay (``pf.replay_against_reference``:
outputs, written-back inputs, buffers and parameters, each output's
``requires_grad``, gradients, under one RNG seed), and both must leave the
caller's model, inputs and RNG state as they were. Our program must also keep
the IR contract (``pf.check_contract``); torch.export's is not functional, so
only its replay is judged.

Statuses:

* ``ok``: the program equals eager;
* ``wrong``: it exports but differs from eager (silently wrong), or breaks
  the contract, or changed the caller's state;
* ``refusal``: a clear error (our ``UnsupportedError``; torch's ``UserError``);
* ``error``: any other exception while exporting, with a short signature
  (type, innermost frame of the exporter's package, message without numbers)
  for clustering;
* ``n/a``: not a case (no such sample, or eager itself raises).
"""

from __future__ import annotations

import copy
import dataclasses
import gc
import os
import re
import time
import traceback
import warnings

import torch

import predispatch_func as pf

from . import NotApplicable, build
from .case import Case, fresh, seeded

EXPORTERS = ("ours", "torch")


@dataclasses.dataclass
class Outcome:
    status: str
    detail: str = ""
    signature: str = ""
    seconds: float = 0.0


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else ""


def signature(exc: BaseException, package: str) -> str:
    """``Type @ file:function: message`` with numbers, addresses and names of
    generated nodes masked, so one cause is one cluster."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f"{os.sep}{package}{os.sep}" in f.filename]
    where = f" @ {os.path.basename(frames[-1].filename)}:{frames[-1].name}" if frames else ""
    msg = _first_line(exc)
    msg = re.sub(r"0x[0-9a-f]+", "0x?", msg)
    msg = re.sub(r"\d+", "N", msg)
    return f"{type(exc).__name__}{where}: {msg[:120]}"


def _snapshot(case: Case):
    state = {}
    if isinstance(case.model, torch.nn.Module):
        state = {k: v.detach().clone() for k, v in case.model.state_dict(keep_vars=True).items()}
    return state, fresh((case.args, case.kwargs)), torch.get_rng_state()


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal metadata and values, NaN equal to NaN."""
    a, b = a.detach(), b.detach()
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if torch.equal(a, b):
        return True
    return (a.is_floating_point() or a.is_complex()) and bool(torch.allclose(a, b, rtol=0, atol=0, equal_nan=True))


def _changed(case: Case, before) -> str | None:
    """What exporting changed of the caller's model, inputs or RNG state."""
    state, inputs, rng = before
    if not torch.equal(rng, torch.get_rng_state()):
        return "export moved the RNG state"
    if isinstance(case.model, torch.nn.Module):
        now = case.model.state_dict(keep_vars=True)
        for k, v in state.items():
            if k not in now or not _same(now[k], v):
                return f"export changed model state {k}"
    flat_before = torch.utils._pytree.tree_leaves(inputs)
    flat_now = torch.utils._pytree.tree_leaves((case.args, case.kwargs))
    for a, b in zip(flat_before, flat_now):
        if isinstance(a, torch.Tensor) and not _same(a, b):
            return "export changed an input"
    return None


def _eager_runs(case: Case) -> str | None:
    try:
        with seeded(case.name), torch.no_grad():
            copy.deepcopy(case.model)(*fresh(case.args), **fresh(case.kwargs))
    except Exception as exc:  # noqa: BLE001 (any failure is a finding)
        return f"eager raises {type(exc).__name__}: {_first_line(exc)}"
    return None


def _export(case: Case, exporter: str) -> torch.export.ExportedProgram:
    if exporter == "ours":
        return pf.export(case.model, case.args, case.kwargs, dynamic_shapes=case.dynamic_shapes)
    return torch.export.export(case.model, case.args, case.kwargs, dynamic_shapes=case.dynamic_shapes)


def _is_refusal(exc: BaseException, exporter: str) -> bool:
    if exporter == "ours":
        return isinstance(exc, pf.UnsupportedError)
    return isinstance(exc, torch._dynamo.exc.UserError)


def _replay(case: Case, ep: torch.export.ExportedProgram, exporter: str) -> list[str]:
    opts = {"check_values": case.check_values, "check_grads": case.check_grads, "nonleaf_inputs": True}
    if exporter == "ours":
        return pf.verify(ep, case.model, case.args, case.kwargs, **opts).problems
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = copy.deepcopy(ep).module()
    return pf.replay_against_reference(program, case.model, case.args, case.kwargs, **opts).problems


def judge_case(case: Case, exporter: str) -> Outcome:
    if (why := _eager_runs(case)) is not None:
        return Outcome("n/a", why)
    before = _snapshot(case)
    # torch's OpInfo sample iterators sit in reference cycles; a collection during the
    # trace would run their no_grad exits inside it (a stray _set_grad_enabled node)
    gc.collect()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ep = _export(case, exporter)
    except Exception as exc:  # noqa: BLE001 (any failure is a finding)
        package = "predispatch_func" if exporter == "ours" else "torch"
        status = "refusal" if _is_refusal(exc, exporter) else "error"
        return Outcome(status, f"{type(exc).__name__}: {_first_line(exc)}", signature(exc, package))
    if (what := _changed(case, before)) is not None:
        return Outcome("wrong", what, what)
    try:
        problems = _replay(case, ep, exporter)
    except Exception as exc:  # noqa: BLE001 (any failure is a finding)
        return Outcome("wrong", f"replay raised {type(exc).__name__}: {_first_line(exc)}",
                       signature(exc, "predispatch_func"))
    if problems:
        return Outcome("wrong", "; ".join(problems)[:500], re.sub(r"\d+", "N", problems[0])[:120])
    return Outcome("ok")


def judge(name: str, exporter: str) -> Outcome:
    """Build case ``name`` and judge ``exporter`` on it."""
    start = time.perf_counter()
    try:
        case = build(name)
    except NotApplicable as exc:
        outcome = Outcome("n/a", str(exc))
    else:
        outcome = judge_case(case, exporter)
    outcome.seconds = round(time.perf_counter() - start, 3)
    return outcome
