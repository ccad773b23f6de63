"""Every corpus model exports, satisfies the contract and replays against eager.

``export_checked`` compares outputs, buffers (BatchNorm running stats in train
mode) and gradients of a loss over the outputs, and proves that exporting left
the model, its inputs and the RNG untouched. The quick subset runs in the
default suite; the whole corpus runs with ``-m models``.
"""

import pytest
import torch

from tests.models.corpus import CASES, build
from tests.support.oracle import export_checked

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


class UnderCpuAutocast(torch.nn.Module):
    """The model called under ``autocast("cpu", bfloat16)``, as a mixed-precision user calls it."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, *args, **kwargs):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return self.model(*args, **kwargs)


# bf16 kernels round differently when the program and eager group ops differently
# (a kept composite vs its pieces): the tolerance of a bf16 comparison
_BF16 = {"rtol": 2e-2, "atol": 2e-2}


def _check_bf16(name: str, train: bool) -> None:
    model, args, kwargs = build(name, train=train)
    ep = export_checked(UnderCpuAutocast(model), args, kwargs, tolerance=_BF16)
    assert any("pf_autocast_region" in str(n.target) for n in ep.graph.nodes), name


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("name", _QUICK)
def test_quick_model_under_cpu_autocast_replays_against_eager(name, train):
    """Inside the region the model's composites (conv, linear, sdpa) meet bf16 activations
    beside fp32 weights; the export once failed on them (see tests/regions/test_autocast_composites.py)."""
    _check_bf16(name, train)


# outputs equal eager's at 1e-4; parameter gradients differ by up to 0.48 on values
# near 50 (embeddings, v_proj, o_proj), beyond 2e-2. Eager is deterministic here
# (two runs equal), and small attention/RMSNorm/rotary modules under autocast match
# it, so the cause is ours and not yet found
_BF16_GRADS_APART = pytest.mark.xfail(strict=True, reason=(
    "ours: bf16 parameter gradients differ from eager's by up to 1% (outputs equal); cause not found"))


def _bf16_corpus_params():
    for name in CASES:
        for train in (False, True):
            marks = [_BF16_GRADS_APART] if name in ("llama", "qwen2", "mixtral") else []
            yield pytest.param(name, train, marks=marks, id=f"{name}-{'train' if train else 'eval'}")


@pytest.mark.models
@pytest.mark.parametrize("name,train", list(_bf16_corpus_params()))
def test_corpus_model_under_cpu_autocast_replays_against_eager(name, train):
    _check_bf16(name, train)
