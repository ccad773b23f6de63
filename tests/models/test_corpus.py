"""Every corpus model exports, satisfies the contract and replays against the reference.

``export_checked`` compares outputs, buffers (BatchNorm running stats in train
mode) and gradients of a loss over the outputs, and proves that exporting left
the model, its inputs and the RNG untouched. The quick subset runs in the
default suite; the whole corpus runs with ``-m models``.
"""

import pytest

from tests.models.corpus import CASES, build
from tests.support.reference import export_checked

_QUICK = [name for name, case in CASES.items() if case.quick]


def _check(name: str, train: bool) -> None:
    model, args, kwargs = build(name, train=train)
    export_checked(model, args, kwargs)


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("name", _QUICK)
def test_quick_model_replays_against_eager(name, train):
    _check(name, train)


@pytest.mark.models
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("name", list(CASES))
def test_corpus_model_replays_against_eager(name, train):
    _check(name, train)
