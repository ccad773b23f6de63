"""Differential fuzzing against the reference: ``python -m scripts.fuzz --budget N --seed S``.

Generates N programs (tests/fuzz/strategies.py), exports each with
``predispatch_func.export``, checks the contract and replays it against the reference.
Prints the time, counts per kind of program (and failures per kind), and each
distinct failure with the source of a program that shows it; ``--shrink``
then asks hypothesis for the smallest program with the first failure.

``--joint`` exports each program's training step instead (``export_joint`` with the loss
``tests.fuzz.harness.fuzz_loss``: every float output, float inputs requiring grad where
eager can train so) and replays two steps against eager's: loss, gradients, writes.
Programs eager itself cannot train are counted apart. ``--optimizer sgd|adamw`` (with
``--joint``): each step also updates the parameters, compared with eager's step; a program
that differs in float32 and equals eager in float64 is counted apart as rounding (the update's
``p - g * lr`` rounds twice where eager's fused ``add(alpha=-lr)`` rounds once).

``--against torch`` runs the same programs through torch 2.13's own
functional paths instead (``export().run_decompositions({})`` and
``aot_export_module(pre_dispatch=True)``) and prints how often each raises
or silently differs from eager.
"""

from __future__ import annotations

import argparse
import collections
import functools
import re
import sys
import time
import traceback
import warnings

from hypothesis import HealthCheck, Phase, given, seed, settings  # noqa: E402

from tests.fuzz.harness import (  # noqa: E402
    OPTIMIZERS,
    DiffersByRounding,
    EagerCannotTrain,
    KnownRefusal,
    check_joint_program,
    check_program,
)
from tests.fuzz.strategies import FuzzConfig, programs  # noqa: E402


def _signature(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    detail = next((ln for ln in lines if ln.startswith("- ")), lines[0] if lines else "")
    detail = re.sub(r"\(max abs diff [^)]*\)|fuzz_program_\w+\.py:\d+", "", detail)
    return f"{type(exc).__name__}: {detail}"[:160]


CHECK = {"export": check_program, "export_joint": check_joint_program,
         **{f"export_joint+{name}": functools.partial(check_joint_program, optimizer=name) for name in OPTIMIZERS}}


def run_ours(program, entry: str = "export") -> tuple[str, str]:
    try:
        CHECK[entry](program)
    except EagerCannotTrain as exc:  # nothing for a training program to equal
        return "eager cannot train", str(exc)[:160]
    except KnownRefusal as exc:  # a clear error on purpose (torch blocks the case)
        return "refused (known)", str(exc)[:160]
    except DiffersByRounding as exc:  # an optimizer step's rounding, amplified: equal in float64
        return "rounding (equal in float64)", str(exc)[:160]
    except Exception as exc:  # every failure is reported, none stops the run
        return "fail", _signature(exc)
    return "pass", ""


def run_torch(program) -> dict[str, tuple[str, str]]:
    from tests.fuzz.torch_baselines import check_torch_aot, check_torch_export

    return {"torch.export+run_decompositions": _as_pair(check_torch_export(program)),
            "aot_export_module(pre_dispatch)": _as_pair(check_torch_aot(program))}


def _as_pair(outcome) -> tuple[str, str]:
    return outcome.status, outcome.detail


def fuzz(budget: int, seed_value: int, config: FuzzConfig, against: str, entry: str = "export"):
    results = []

    @seed(seed_value)
    @settings(max_examples=budget, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(programs(config))
    def one(program):
        if against == "ours":
            results.append((program, {"ours": run_ours(program, entry)}))
        else:
            results.append((program, run_torch(program)))

    one()
    return results


def shrink_first_failure(signature: str, budget: int, seed_value: int, config: FuzzConfig, entry: str = "export"):
    """Search again, failing only on ``signature``, and let hypothesis shrink it."""
    found = []

    @seed(seed_value)
    @settings(max_examples=budget, deadline=None, database=None,
              phases=[Phase.generate, Phase.shrink], suppress_health_check=list(HealthCheck))
    @given(programs(config))
    def one(program):
        status, sig = run_ours(program, entry)
        if status == "fail" and sig == signature:
            found.append(program)
            raise AssertionError(sig)

    try:
        one()
    except AssertionError:
        pass
    return found[-1] if found else None


def summarize(results, elapsed: float, show: int) -> int:
    paths = list(results[0][1]) if results else []
    kinds_total = collections.Counter()
    for program, _ in results:
        kinds_total.update(program.kinds())
    print(f"{len(results)} programs in {elapsed:.1f}s ({elapsed / max(len(results), 1) * 1000:.0f} ms each)")
    failed_any = 0
    for path in paths:
        status = collections.Counter(outcomes[path][0] for _, outcomes in results)
        rate = {k: f"{v} ({100 * v / len(results):.1f}%)" for k, v in sorted(status.items())}
        print(f"\n== {path}: {rate}")
        bad = [(p, o[path]) for p, o in results if o[path][0] != "pass"]
        failed_any += len(bad)
        kinds_bad = collections.Counter()
        for p, _ in bad:
            kinds_bad.update(p.kinds())
        print(f"{'kind of program':32} {'programs':>9} {'not passing':>12}")
        for kind, n in sorted(kinds_total.items()):
            print(f"{kind:32} {n:9} {kinds_bad.get(kind, 0):12}")
        by_signature = collections.defaultdict(list)
        for p, (st, detail) in bad:
            by_signature[(st, detail)].append(p)
        for (st, detail), progs in sorted(by_signature.items(), key=lambda kv: -len(kv[1])):
            print(f"\n-- {len(progs)} x {st}: {detail}")
            if show:
                smallest = min(progs, key=lambda p: len(p.source()))
                print(smallest.source())
        if not bad:
            print("no failures")
    return failed_any


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", type=int, default=1000, help="number of programs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--regions", action=argparse.BooleanOptionalAction, default=False,
                        help="generate grad-mode / autocast regions")
    parser.add_argument("--hops", action=argparse.BooleanOptionalAction, default=False,
                        help="generate torch.cond, while_loop, scan and custom autograd Functions")
    parser.add_argument("--against", choices=["ours", "torch"], default="ours")
    parser.add_argument("--max-statements", type=int, default=FuzzConfig.max_statements)
    parser.add_argument("--no-source", action="store_true", help="do not print failing programs")
    parser.add_argument("--shrink", action="store_true", help="shrink the first failure (ours only)")
    parser.add_argument("--joint", action="store_true", help="training steps through export_joint (ours only)")
    parser.add_argument("--optimizer", choices=sorted(OPTIMIZERS), help="with --joint: each step also runs it")
    ns = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    config = FuzzConfig(regions=ns.regions, hops=ns.hops, max_statements=ns.max_statements, trains=ns.joint)
    entry = "export_joint" if ns.joint else "export"
    if ns.optimizer is not None:
        if not ns.joint:
            parser.error("--optimizer needs --joint")
        entry += f"+{ns.optimizer}"
    if ns.joint and ns.against != "ours":
        parser.error("--joint runs our export_joint only")
    print(f"fuzz: budget={ns.budget} seed={ns.seed} regions={ns.regions} hops={ns.hops} against={ns.against} "
          f"entry={entry}")
    start = time.time()
    results = fuzz(ns.budget, ns.seed, config, ns.against, entry)
    failed = summarize(results, time.time() - start, show=not ns.no_source)
    if failed and ns.shrink and ns.against == "ours" and any(o["ours"][0] == "fail" for _, o in results):
        first = next(o["ours"][1] for _, o in results if o["ours"][0] == "fail")
        small = shrink_first_failure(first, ns.budget, ns.seed, config, entry)
        if small is not None:
            print(f"\n== shrunk program for: {first}\n{small.source()}")
            try:
                CHECK[entry](small)
            except Exception:
                traceback.print_exc()
    real_failures = sum(o["ours"][0] == "fail" for _, o in results) if ns.against == "ours" else 0
    return 1 if real_failures else 0


if __name__ == "__main__":
    sys.exit(main())
