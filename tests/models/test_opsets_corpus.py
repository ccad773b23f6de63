"""Every corpus model exported to Core ATen plus a backend's five composites.

Each program is checked for membership (every graph), for keeping the
default program's regions, and replayed against the reference with gradients, in
eval and train mode. Where torch has no ATen decomposition for an op a model
needs, the export is refused naming exactly those ops, and succeeds once the
target holds them. The quick model runs in the default suite.
"""

import pytest
import torch

import predispatch_func as pf
from predispatch_func.graphs import all_graph_modules
from tests.models.corpus import CASES, build
from tests.models.custom_op_decompositions import transformers_decompositions
from tests.support.reference import export_checked
from tests.support.torch_release import torch_release

BACKEND = pf.OpSet.core_aten() | pf.OpSet.from_names(
    ["aten.linear.default", "aten.layer_norm.default", "aten.softmax.int", "aten.gelu.default",
     "aten.scaled_dot_product_attention.default"], name="backend")

# Ops torch cannot decompose into ATen (run_decompositions() keeps them too; histc and
# empty_permuted: ours); torch 2.15 added an ATen decomposition of linalg_vector_norm.
TORCH_CANNOT_LOWER = {
    "mixtral": {"transformers.grouped_mm_fallback.default"},
    **({} if torch_release() >= (2, 15) else {"wav2vec2": {"aten.linalg_vector_norm.default"}}),
}


# transformers' grouped_mm: the user's decomposition (tests/models/custom_op_decompositions.py)
USER_DECOMPOSES = {"mixtral": transformers_decompositions}


def _hops(ep) -> list[str]:
    return sorted(n.target.name() for _, gm in all_graph_modules(ep.graph_module)
                  for n in gm.graph.nodes if isinstance(n.target, torch._ops.HigherOrderOperator))


def _check(name: str, train: bool) -> None:
    model, args, kwargs = build(name, train=train)
    target = BACKEND
    if name in TORCH_CANNOT_LOWER:
        with pytest.raises(pf.UnsupportedError) as info:
            pf.export(model, args, kwargs, target=target)
        assert info.value.kind is pf.Refusal.OP_NOT_IN_TARGET
        named = {line.split(":")[0].strip() for line in str(info.value).splitlines()
                 if line.startswith("  ") and not line.startswith("      ")}
        assert named == TORCH_CANNOT_LOWER[name], str(info.value)
        target = target | pf.OpSet.from_names(sorted(named))
        ep = export_checked(model, args, kwargs, target=target)
        assert pf.verify(ep, target=target).ok
        if name in USER_DECOMPOSES:  # or kept out of the target, lowered by the user's own decomposition
            target = BACKEND.with_decompositions(USER_DECOMPOSES[name]())
    ep = export_checked(model, args, kwargs, target=target)
    assert pf.verify(ep, target=target).ok
    assert _hops(ep) == _hops(pf.export(model, args, kwargs))


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_quick_model_lowers_to_backend(train):
    _check("small_cnn", train)


@pytest.mark.models
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("name", list(CASES))
def test_corpus_model_lowers_to_backend(name, train):
    _check(name, train)
