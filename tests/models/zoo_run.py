"""One zoo model through both exporters, judged by the same replay against the reference.

:func:`run_one` builds the model, exports it with ours and with
``torch.export.export`` (CPU time of each export), replays each program against
eager over three calls (outputs, inputs written back, buffers; gradients for the
models the zoo marks ``train``) and checks our program's contract. Each exporter
ends in one :class:`Outcome`: ok, export failed (with our refusal kind where we
refused), or wrong (exported, but a replay differs: silently wrong).
"""

from __future__ import annotations

import copy
import dataclasses
import signal
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch

import predispatch_func as pf
from tests.support.reference import replay_calls

from .zoo import ZooModel

CALLS = 3


@dataclasses.dataclass
class Outcome:
    status: str  # ok | failed | wrong
    seconds: float | None = None  # CPU time of the export
    error: str = ""
    refusal: str = ""  # our Refusal kind, where we refused


@dataclasses.dataclass
class ZooResult:
    name: str
    library: str
    family: str
    train: bool
    built: bool
    build_error: str = ""
    ours: Outcome | None = None
    torch: Outcome | None = None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class _TimedOut(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise _TimedOut("timed out")


def _first_line(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".strip()
    return text.splitlines()[0][:300] if text else type(e).__name__


def _export_and_judge(export: Callable[[], Any], model: torch.nn.Module, args: tuple, kwargs: dict,
                      grads: bool, contract: bool, timeout: int, tolerance: dict | None = None) -> Outcome:
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(timeout)
    try:
        start = time.process_time()
        try:
            ep = export()
        except Exception as e:  # noqa: BLE001 (every failure of an exporter is a result)
            return Outcome("failed", error=_first_line(e), refusal=getattr(getattr(e, "kind", None), "name", ""))
        seconds = time.process_time() - start
        try:
            if contract:
                report = pf.verify(ep)
                if not report.ok:
                    return Outcome("wrong", seconds, "contract: " + "; ".join(report.problems)[:300])
            replay_calls(ep, model, args, kwargs, calls=CALLS, grads=grads, **(tolerance or {}))
        except AssertionError as e:
            return Outcome("wrong", seconds, _first_line(e))
        except _TimedOut:  # a replay that ran out of time is no evidence of a wrong program
            raise
        except Exception as e:  # noqa: BLE001 (a program that raises where eager runs is wrong too)
            where = traceback.extract_tb(e.__traceback__)[-1]
            return Outcome("wrong", seconds, f"replay raised {_first_line(e)} ({where.filename}:{where.lineno})")
        return Outcome("ok", seconds)
    except _TimedOut:
        return Outcome("failed", error=f"timed out after {timeout} s (export and replay)")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


# the reference and the program run the same kernels in fp32; under autocast a composite the program
# decomposes rounds in other places (as tests/cuda/test_cuda.py judges the corpus)
_AUTOCAST_DTYPE = {"bf16": torch.bfloat16, "fp16": torch.float16}


def tolerance(device: str, precision: str) -> dict | None:
    """The replay's tolerance: the reference's own on CPU fp32; cuDNN picks its algorithms per call."""
    if precision in _AUTOCAST_DTYPE:
        return {"rtol": 2e-2, "atol": 2e-2}
    return {"rtol": 1e-3, "atol": 1e-4} if device != "cpu" else None


def _placed(built: tuple, device: str, precision: str) -> tuple:
    """The built model and inputs on ``device``, called under autocast for bf16/fp16."""
    from .corpus import UnderAutocast

    model, args, kwargs = built
    if device != "cpu":
        model = model.to(device)
        args, kwargs = torch.utils._pytree.tree_map_only(torch.Tensor, lambda t: t.to(device), (args, kwargs))
    if precision in _AUTOCAST_DTYPE:
        model = UnderAutocast(model, device, _AUTOCAST_DTYPE[precision])
    return model, args, kwargs


def _trained_once(model: torch.nn.Module, args: tuple, kwargs: dict) -> None:
    """The usual order before an export: one eager training step (forward in train mode, then
    backward); what the model keeps of that call (caches, hidden states) stays, its gradients go."""
    was_training = model.training
    model.train()
    outs = [t for t in torch.utils._pytree.tree_leaves(model(*args, **kwargs))
            if isinstance(t, torch.Tensor) and t.requires_grad]
    if outs:
        sum(t.float().sum() for t in outs).backward()
    model.zero_grad(set_to_none=True)
    model.train(was_training)


def run_one(zm: ZooModel, *, exporters: tuple[str, ...] = ("ours", "torch"), timeout: int = 300,
            device: str = "cpu", precision: str = "fp32", torch_only_where_ours_misses: bool = False,
            trained_first: bool = False) -> ZooResult:
    """``device``/``precision``: where the model runs and whether under autocast (the CUDA zoo);
    ``torch_only_where_ours_misses``: torch.export is judged only where ours is not ok (enough to
    tell an ours-only failure from one torch shares, at half the time); ``trained_first``: one
    eager training step before the export (run, then export)."""
    result = ZooResult(zm.name, zm.library, zm.family, zm.train, built=False)
    try:
        model, args, kwargs = _placed(zm.build(), device, precision)
        if trained_first:
            _trained_once(model, args, kwargs)
        with torch.no_grad():  # eager runs on these inputs, or the model is not built (a copy: a first
            copy.deepcopy(model)(*args, **kwargs)  # call may fill caches the export must see written)
    except Exception as e:  # noqa: BLE001
        result.build_error = _first_line(e)
        return result
    result.built = True
    tol = tolerance(device, precision)
    if "ours" in exporters:
        result.ours = _export_and_judge(lambda: pf.export(model, args, kwargs), model, args, kwargs,
                                        grads=zm.train, contract=True, timeout=timeout, tolerance=tol)
    if "torch" in exporters and not (torch_only_where_ours_misses and result.ours and result.ours.status == "ok"):
        result.torch = _export_and_judge(lambda: torch.export.export(model, args, kwargs), model, args, kwargs,
                                         grads=zm.train, contract=False, timeout=timeout, tolerance=tol)
    return result
