"""Which overloads to audit, and running the checker over them without dying with them.

Running arbitrary overloads on synthesised inputs finds torch bugs as well as
lies: ``native_batch_norm`` without running statistics and ``training=False``
segfaults. So a full audit runs in a forked child (torch and op_db already
imported, so a fork costs milliseconds); when the child dies or hangs, the op it
was on is marked ``untested`` with the signal and the sample, and a new child
carries on with the next op.
"""

from __future__ import annotations

import faulthandler
import multiprocessing
import os
from collections.abc import Callable, Iterable

import torch

from .. import _torch_compat as tc
from .checker import UNTESTED, CheckResult, check
from .opinfo import opinfo_samples
from .sample_sources import samples_for
from .samples import Sample

OP_TIMEOUT_S = 30.0
Progress = Callable[[str], None]


def overloads_in(namespace: str) -> list[tc.OpOverload]:
    """Every registered overload of ``namespace``, sorted by name."""
    found = []
    for qualified in tc.all_op_names():
        ns, _, rest = qualified.partition("::")
        if ns != namespace:
            continue
        op = tc.resolve_overload(ns, rest)
        if op is not None:
            found.append(op)
    return sorted(found, key=str)


def audit_scope(namespace: str = "aten") -> list[tc.OpOverload]:
    """What a full audit covers.

    aten: every overload, composite or not: kernels can lie too
    (``native_batch_norm`` writes running stats without ``!``, ``unsafe_split``
    returns views), and a kernel that no sample fits is simply ``untested``.
    Other namespaces: their CompositeImplicitAutograd overloads, the ones
    export has to keep or decompose.
    """
    ops = overloads_in(namespace)
    if namespace != "aten":
        return [op for op in ops if tc.has_composite_implicit_kernel(op)]
    return ops


def audit_op(op: tc.OpOverload, *, use_opinfo: bool = True,
             skip: dict[int, str] | None = None,
             on_sample: Callable[[int, Sample], None] | None = None) -> CheckResult:
    """Audit one overload in this process (seeded, caller's RNG untouched).

    ``skip`` maps sample indices that crashed a previous child to why.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        samples, reasons = samples_for(op, use_opinfo=use_opinfo)
        return check(op, samples, reasons, skip=skip or {}, on_sample=on_sample)


def audit_many(ops: Iterable[tc.OpOverload], *, isolate: bool = True,
               use_opinfo: bool = True, progress: Progress | None = None) -> list[CheckResult]:
    """Audit each op; with ``isolate`` a crash or hang costs only that op."""
    ops = list(ops)
    if not isolate:
        results = []
        for op in ops:
            results.append(audit_op(op, use_opinfo=use_opinfo))
            if progress:
                progress(str(op))
        return results
    threads = torch.get_num_threads()
    # a child forked from a process whose OpenMP pool has run deadlocks on its
    # first parallel op; with one thread the pool is never started
    torch.set_num_threads(1)
    try:
        return _audit_in_children(ops, use_opinfo, progress)
    finally:
        torch.set_num_threads(threads)


MAX_CRASHES_PER_OP = 30  # sparse samples (layouts.py) crash some composites one by one


def _child(ops: list[tc.OpOverload], start: int, skip: dict[int, dict[int, str]],
           use_opinfo: bool, conn) -> None:
    faulthandler.disable()  # a crash here is expected and reported by the parent
    for i in range(start, len(ops)):
        op = ops[i]
        conn.send(("start", i))
        try:
            # the callback runs inside this audit_op call, so it sees this iteration's op
            result = audit_op(op, use_opinfo=use_opinfo, skip=skip.get(i, {}),
                              on_sample=lambda j, s: conn.send(("sample", j, s.describe(str(op)))))  # noqa: B023
        except Exception as exc:  # a bug of ours must not pass for a crash of torch's
            result = CheckResult(str(op), UNTESTED, f"the audit itself failed: {type(exc).__name__}: {exc}")
        conn.send(("done", i, result))
    conn.close()
    os._exit(0)


def _run_child(ops: list[tc.OpOverload], start: int, skip: dict[int, dict[int, str]],
               use_opinfo: bool, results: dict[int, CheckResult],
               progress: Progress | None) -> tuple[int, int | None, str, str] | None:
    """Run ops[start:] in one forked child; return (op, sample, description, why) if it died."""
    ctx = multiprocessing.get_context("fork")
    parent_end, child_end = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(ops, start, skip, use_opinfo, child_end), daemon=True)
    proc.start()
    child_end.close()
    current, sample, described = start, None, ""
    try:
        while True:
            if not parent_end.poll(OP_TIMEOUT_S):
                proc.kill()
                proc.join()
                return current, sample, described, f"timed out after {OP_TIMEOUT_S:.0f}s"
            try:
                msg = parent_end.recv()
            except EOFError:
                proc.join()
                if current == len(ops) - 1 and current in results:
                    return None
                return current, sample, described, "crashed the interpreter"
            if msg[0] == "start":
                current, sample, described = msg[1], None, ""
            elif msg[0] == "sample":
                sample, described = msg[1], msg[2]
            else:
                results[msg[1]] = msg[2]
                if progress:
                    progress(str(ops[msg[1]]))
    finally:
        parent_end.close()


def _audit_in_children(ops: list[tc.OpOverload], use_opinfo: bool,
                       progress: Progress | None) -> list[CheckResult]:
    if use_opinfo:
        for op in ops:  # load OpInfo samples once, before forking, so children share them
            if op.namespace == "aten":
                opinfo_samples(op)
    results: dict[int, CheckResult] = {}
    skip: dict[int, dict[int, str]] = {}
    start = 0
    while start < len(ops):
        died = _run_child(ops, start, skip, use_opinfo, results, progress)
        if died is None:
            break
        i, sample, described, why = died
        note = f"{why} on {described}" if described else why
        hung = why.startswith("timed out")  # another try would cost the timeout again
        if sample is None or hung or len(skip.get(i, {})) >= MAX_CRASHES_PER_OP:
            results[i] = CheckResult(str(ops[i]), UNTESTED, note)
            if progress:
                progress(str(ops[i]))
            start = i + 1
        else:
            skip.setdefault(i, {})[sample] = note
            start = i
    return [results[i] for i in range(len(ops))]
