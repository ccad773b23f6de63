"""The tests/models corpus as training steps (marker ``models``: slow, run by the models CI job).

Each model in train mode (dropout 0), loss = mean of its first floating output squared:
the joint program equals eager over 2 steps, also lowered to core ATen; with AdamW and with
SGD(momentum) 3 steps equal eager's parameters and optimizer state. (scripts/joint_corpus.py
prints the same as a table.)
"""

from __future__ import annotations

import pytest
import torch

import predispatch_func as pf
from scripts.joint_corpus import first_float_loss
from tests.joint.reference import export_joint_checked
from tests.models.corpus import CASES, build
from tests.models.custom_op_decompositions import transformers_decompositions

pytestmark = pytest.mark.models

# transformers' grouped_mm custom op has no decomposition torch knows: lowered by the one a user
# gives (OpSet.with_decompositions), as tests/models/custom_op_decompositions.py writes it
NEEDS_USER_DECOMPOSITIONS = {"mixtral"}


@pytest.mark.parametrize("name", list(CASES))
def test_corpus_joint_program_equals_eager(name):
    model, args, kwargs = build(name, train=True)
    export_joint_checked(model, args, kwargs, loss_fn=first_float_loss)


@pytest.mark.parametrize("name", list(CASES))
def test_corpus_joint_program_in_core_aten_equals_eager(name):
    model, args, kwargs = build(name, train=True)
    target = pf.OpSet.core_aten()
    if name in NEEDS_USER_DECOMPOSITIONS:
        target = target.with_decompositions(transformers_decompositions())
    export_joint_checked(model, args, kwargs, loss_fn=first_float_loss, target=target)


@pytest.mark.parametrize("optimizer", ["adamw", "sgd_momentum"])
@pytest.mark.parametrize("name", list(CASES))
def test_corpus_three_optimizer_steps_equal_eager(name, optimizer):
    model, args, kwargs = build(name, train=True)
    opt = (torch.optim.AdamW(model.parameters(), lr=1e-3) if optimizer == "adamw"
           else torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9))
    export_joint_checked(model, args, kwargs, loss_fn=first_float_loss, optimizer=opt, calls=3)
