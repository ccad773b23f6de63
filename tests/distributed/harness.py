"""Run cases on several ranks of a gloo process group on this machine, in fresh processes.

One ``run_cases`` call spawns ``world_size`` processes (``torch.multiprocessing``,
start method ``spawn``), joins them into one process group on the gloo backend, runs
the named cases of ``tests/distributed/cases.py`` in order on every rank (each rank
calls ``case(rank, world_size)`` with the others, as torch.distributed programs run)
and hands back, per case, what each rank returned or the error it raised. Starting
the processes costs most (importing torch and the exporter), so a test module runs
all its cases in one call. A case that hangs in a collective ends at the group's
timeout; the whole run at ``timeout_s``.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import pickle
import socket
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp


@dataclasses.dataclass(frozen=True)
class RankResult:
    """What one rank's case returned (``value``), or the error it raised."""

    value: Any = None
    error_type: str | None = None
    error_kind: str | None = None  # a pf.UnsupportedError's Refusal name
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.error_type is None


def run_cases(names: list[str], world_size: int = 2, timeout_s: float = 240) -> dict[str, list[RankResult]]:
    """``{case name: [rank 0's result, rank 1's, ...]}`` for ``names`` run on ``world_size`` ranks."""
    with tempfile.TemporaryDirectory() as out:
        context = mp.start_processes(_rank_main, args=(world_size, _free_port(), names, out), nprocs=world_size,
                                     join=False, start_method="spawn")
        deadline = time.monotonic() + timeout_s
        while not context.join(timeout=max(deadline - time.monotonic(), 0.1)):
            if time.monotonic() > deadline:
                for process in context.processes:
                    process.kill()
                raise TimeoutError(f"the distributed cases {names} did not finish in {timeout_s:.0f} s")
        per_rank = [pickle.loads(Path(out, f"rank{r}.pkl").read_bytes()) for r in range(world_size)]
    return {name: [results[name] for results in per_rank] for name in names}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world_size: int, port: int, names: list[str], out: str) -> None:
    import torch.distributed as dist

    from tests.distributed import cases

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)  # two ranks on a shared two-core machine
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=90))
    results = {}
    try:
        for name in names:
            try:
                results[name] = RankResult(value=getattr(cases, name)(rank, world_size))
            except Exception as err:  # noqa: BLE001 -- the test judges it
                results[name] = RankResult(error_type=type(err).__name__,
                                           error_kind=getattr(getattr(err, "kind", None), "name", None),
                                           message=f"{err}\n{traceback.format_exc()}")
            dist.barrier()
    finally:
        Path(out, f"rank{rank}.pkl").write_bytes(pickle.dumps(results))
        dist.destroy_process_group()
