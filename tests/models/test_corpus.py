"""Every corpus model exports, satisfies the contract and replays against the reference.

``export_checked`` compares outputs, buffers (BatchNorm running stats in train
mode) and gradients of a loss over the outputs, and proves that exporting left
the model, its inputs and the RNG untouched. The quick subset runs in the
default suite; the whole corpus runs with ``-m models``.
"""

import pytest

from tests.models.corpus import CASES, UnderAutocast, build
from tests.support.reference import export_checked, on_export_branch

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


# bf16 kernels round differently when the program and eager group ops differently
# (a kept composite vs its pieces): the tolerance of a bf16 comparison
_BF16 = {"rtol": 2e-2, "atol": 2e-2}


def _check_bf16(name: str, train: bool, tolerance: dict | None = _BF16, on_branch: bool = False) -> None:
    model, args, kwargs = build(name, train=train)
    wrapped = UnderAutocast(model, "cpu")
    reference = on_export_branch(wrapped) if on_branch else None
    ep = export_checked(wrapped, args, kwargs, tolerance=tolerance, reference=reference)
    assert any("pf_autocast_region" in str(n.target) for n in ep.graph.nodes), name


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("name", _QUICK)
def test_quick_model_under_cpu_autocast_replays_against_eager(name, train):
    """Inside the region the model's composites (conv, linear, sdpa) meet bf16 activations
    beside fp32 weights; the export once failed on them (see tests/regions/test_autocast_composites.py)."""
    _check_bf16(name, train)


# transformers' attention takes another path while exported: torch.compiler.is_exporting()
# makes it build an explicit causal mask (masking_utils._ignore_causal_mask_sdpa), so with
# fewer key/value heads than query heads it repeats them (repeat_kv) instead of passing
# sdpa is_causal=True, enable_gqa=True as eager does. sdpa's GQA backward sums a key/value
# head's gradients before rounding them to bf16, the expand backward after: k/v_proj and
# embedding gradients apart by up to 1% (outputs bit-equal). torch.export's program differs
# alike; ours equals eager down that branch exactly (the test below; the mechanism:
# tests/regions/test_autocast_composites.py). mistral's sliding window takes the mask in both.
_GQA_EXPORT_BRANCH = ("llama", "qwen2", "mixtral")
_BF16_GRADS_APART = pytest.mark.xfail(strict=True, reason=(
    "transformers' own export branch (is_exporting(): explicit mask + repeat_kv, not sdpa's "
    "enable_gqa): bf16 gradients of the repeated key/value heads round apart by up to 1%"))


def _bf16_corpus_params():
    for name in CASES:
        for train in (False, True):
            marks = [_BF16_GRADS_APART] if name in _GQA_EXPORT_BRANCH else []
            yield pytest.param(name, train, marks=marks, id=f"{name}-{'train' if train else 'eval'}")


@pytest.mark.models
@pytest.mark.parametrize("name,train", list(_bf16_corpus_params()))
def test_corpus_model_under_cpu_autocast_replays_against_eager(name, train):
    _check_bf16(name, train)


@pytest.mark.models
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("name", _GQA_EXPORT_BRANCH)
def test_gqa_model_under_cpu_autocast_equals_eager_down_its_export_branch(name, train):
    """What the xfail above leaves unchecked: at fp32 tolerance, not bf16's, the program
    equals eager running the branch transformers takes while exported."""
    _check_bf16(name, train, tolerance=None, on_branch=True)
