"""Conformance cases from PyTorch's own test databases, shipped in the torch wheel.

Nobody here wrote them, so they find what our own tests cannot. Each suite
module turns one database into named cases:

* ``exportdb``: ``torch._export.db.examples`` (as given, and with gradients);
* ``modules``: ``common_modules.module_db`` (default and ``inplace=True``
  builds, train and eval), each module exported as itself;
* ``opinfo``: ``common_methods_invocations.op_db``: each op's in-place variant
  on an input, on a view of an input and on a buffer, its ``out=`` variant,
  and the plain op with gradients, 2 samples each;
* ``hop``: ``hop_db``, torch's higher-order ops.

A case name is ``suite/entry/variant/index`` and is all a worker process needs
to rebuild the case (``build``): samples are drawn under a seed derived from the
name, so every run sees the same tensors. ``judge.judge`` exports a case with
ours or with ``torch.export.export`` and replays it against the reference.
"""

from __future__ import annotations

import importlib
import re

from .case import Case, NotApplicable

SUITES = ("exportdb", "modules", "opinfo", "hop")


def _suite(name: str):
    return importlib.import_module(f"{__name__}.{name}")


def case_names(suite: str) -> list[str]:
    """Every case of ``suite``, in a stable order."""
    return _suite(suite).case_names()


# the default test run's sample: a few cases of each suite, drawn with a fixed seed
TEST_SAMPLE = {"exportdb": 6, "modules": 8, "opinfo": 20, "hop": 4}


def sampled_cases() -> list[str]:
    """The cases ``tests/external/test_conformance.py`` judges in the default run."""
    import random

    rng = random.Random(11)
    names: list[str] = []
    for suite in SUITES:
        all_names = case_names(suite)
        names += sorted(rng.sample(all_names, min(TEST_SAMPLE[suite], len(all_names))))
    return names


def torch_release(version: str | None = None) -> str:
    """The torch release of ``version`` (default: the installed torch) without its
    local build tag: ``2.15.0+cu132`` -> ``2.15.0``. Results and known gaps are per release."""
    if version is None:
        import torch

        version = torch.__version__
    return str(version).split("+", 1)[0]


def release_key(release: str) -> tuple:
    """Sort key of a release string (``2.9.1`` before ``2.10.0``)."""
    return tuple(int(n) for n in re.findall(r"\d+", release))


def build(name: str) -> Case:
    """The case called ``name``; raises ``NotApplicable`` where the database has
    no such sample or the sample does not fit the variant."""
    return _suite(name.split("/", 1)[0]).build(name)


__all__ = ["SUITES", "TEST_SAMPLE", "Case", "NotApplicable", "build", "case_names", "release_key", "sampled_cases",
           "torch_release"]
