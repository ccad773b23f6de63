"""Differential fuzzing against the reference (tests/fuzz): a bounded deterministic run in
the default suite, a longer one under the ``fuzz_long`` marker.

A failure prints the shrunk program as the source of an ``nn.Module`` with its
``make_args()``: paste it, trimmed, into the test file of the stage whose behaviour it
pins (tests/trace/test_copy_writes.py, tests/program/test_write_back.py, ...: docs/testing.md).
"""

import pytest
from hypothesis import HealthCheck, Phase, assume, given, settings

from tests.fuzz.harness import EagerCannotTrain, KnownRefusal, check_joint_program, check_program
from tests.fuzz.strategies import FuzzConfig, programs

REGIONS = True  # grad-mode / autocast regions (landed on main)
_SETTINGS = dict(deadline=None, database=None, suppress_health_check=list(HealthCheck),
                 print_blob=False, phases=[Phase.explicit, Phase.generate, Phase.shrink])


def _check(program, check=check_program):
    try:
        check(program)
    except (KnownRefusal, EagerCannotTrain):  # a deliberate clear error (with its own strict-xfail
        assume(False)                         # regression); or nothing for a training step to equal
    except Exception as exc:
        raise AssertionError(f"{type(exc).__name__}: {exc}\n\nprogram:\n{program.source()}") from exc


@settings(max_examples=300, derandomize=True, **_SETTINGS)
@given(programs(FuzzConfig(regions=REGIONS)))
def test_generated_programs_match_eager(program):
    _check(program)


@pytest.mark.fuzz_long
@settings(max_examples=5000, derandomize=True, **_SETTINGS)
@given(programs(FuzzConfig(regions=REGIONS, max_statements=20)))
def test_generated_programs_match_eager_long(program):
    _check(program)


@settings(max_examples=12, derandomize=True, **_SETTINGS)
@given(programs(FuzzConfig(regions=REGIONS, hops=True, max_statements=8)))
def test_generated_programs_with_hops_match_eager(program):
    """torch.cond, while_loop, scan and custom autograd Functions among the statements."""
    _check(program)


@pytest.mark.fuzz_long
@settings(max_examples=150, derandomize=True, **_SETTINGS)
@given(programs(FuzzConfig(regions=REGIONS, hops=True, max_statements=16)))
def test_generated_programs_with_hops_match_eager_long(program):
    _check(program)


def _check_joint(program):
    try:
        check_joint_program(program)
    except (KnownRefusal, EagerCannotTrain):  # a deliberate clear error; nothing to train
        assume(False)
    except Exception as exc:
        raise AssertionError(f"{type(exc).__name__}: {exc}\n\nprogram:\n{program.source()}") from exc


@settings(max_examples=15, derandomize=True, **_SETTINGS)  # few: CI's 90 minutes; fuzz_long runs 500
@given(programs(FuzzConfig(regions=REGIONS, max_statements=10, trains=True)))
def test_generated_programs_train_as_eager(program):
    """export_joint: two training steps (loss, every gradient, writes) equal eager's."""
    _check(program, check_joint_program)


@pytest.mark.fuzz_long
@settings(max_examples=500, derandomize=True, **_SETTINGS)
@given(programs(FuzzConfig(regions=REGIONS, max_statements=16, trains=True)))
def test_generated_programs_train_as_eager_long(program):
    _check(program, check_joint_program)
