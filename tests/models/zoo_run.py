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
                      grads: bool, contract: bool, timeout: int) -> Outcome:
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
            replay_calls(ep, model, args, kwargs, calls=CALLS, grads=grads)
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


def run_one(zm: ZooModel, *, exporters: tuple[str, ...] = ("ours", "torch"), timeout: int = 300) -> ZooResult:
    result = ZooResult(zm.name, zm.library, zm.family, zm.train, built=False)
    try:
        model, args, kwargs = zm.build()
        with torch.no_grad():  # eager runs on these inputs, or the model is not built (a copy: a first
            copy.deepcopy(model)(*args, **kwargs)  # call may fill caches the export must see written)
    except Exception as e:  # noqa: BLE001
        result.build_error = _first_line(e)
        return result
    result.built = True
    if "ours" in exporters:
        result.ours = _export_and_judge(lambda: pf.export(model, args, kwargs), model, args, kwargs,
                                        grads=zm.train, contract=True, timeout=timeout)
    if "torch" in exporters:
        result.torch = _export_and_judge(lambda: torch.export.export(model, args, kwargs), model, args, kwargs,
                                         grads=zm.train, contract=False, timeout=timeout)
    return result
