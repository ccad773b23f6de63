"""A kept composite that draws random numbers inside (attention with dropout in training: BERT's,
``nn.TransformerEncoderLayer``'s, ``nn.MultiheadAttention``'s defaults) cannot be recomputed for
its backward: the recomputation would draw another mask. export_joint refused it, so training
any attention model with its default dropout was refused. It now exports the forward again with
that op decomposed, the mask a value of the graph that forward and backward share."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import predispatch_func as pf
from predispatch_func.artifacts import program_facts
from predispatch_func.opsets import TargetUnreachableError
from tests.joint.reference import export_joint_checked, forward_targets


class Attention(nn.Module):
    def __init__(self, dropout: float = 0.2):
        super().__init__()
        self.qkv, self.dropout = nn.Linear(8, 24), dropout

    def forward(self, x):
        q, k, v = self.qkv(x).view(2, 5, 3, 2, 4).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0)
        return out.pow(2).mean()


class EncoderLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.1, batch_first=True)
        self.head = nn.Linear(8, 1)

    def forward(self, x):
        return self.head(self.layer(x)).pow(2).mean()


class SelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention = nn.MultiheadAttention(8, 2, dropout=0.2, batch_first=True)

    def forward(self, x):
        out, _ = self.attention(x, x, x, need_weights=False)
        return out.pow(2).mean()


class RandomizedReLU(nn.Module):
    """``nn.RReLU`` in training: slopes drawn per element; decomposed, torch's formula for the
    functional op read the empty noise buffer (joint/formula_fixes.py)."""

    def __init__(self):
        super().__init__()
        self.linear, self.act = nn.Linear(8, 8), nn.RReLU()

    def forward(self, x):
        return self.act(self.linear(x)).pow(2).mean()


MODELS = {"sdpa": Attention, "encoder_layer": EncoderLayer, "multihead_attention": SelfAttention,
          "rrelu": RandomizedReLU}



@pytest.mark.parametrize("target", [None, "core_aten"])
@pytest.mark.parametrize("name", [n for n in MODELS if n != "rrelu"])
def test_a_composite_drawing_random_numbers_trains_as_eager(name, target):
    torch.manual_seed(0)
    model = MODELS[name]().train()
    export_joint_checked(model, (torch.randn(2, 5, 8),), target=pf.OpSet.core_aten() if target else None)


def test_rrelu_in_training_trains_as_eager():
    torch.manual_seed(0)
    export_joint_checked(RandomizedReLU().train(), (torch.randn(2, 5, 8),))


def test_rrelu_in_training_under_a_target_is_refused_naming_the_op():
    """Its functional op reads data (the count of slopes it draws), which no program holds."""
    torch.manual_seed(0)
    with pytest.raises(TargetUnreachableError, match="rrelu_with_noise_functional"):
        pf.export_joint(RandomizedReLU().train(), (torch.randn(2, 5, 8),), target=pf.OpSet.core_aten())


def test_attention_with_dropout_steps_with_sgd_as_eager():
    torch.manual_seed(0)
    model = Attention().train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    export_joint_checked(model, (torch.randn(2, 5, 8),), optimizer=optimizer, calls=3)


def test_the_drawing_composite_is_decomposed_and_the_others_kept():
    torch.manual_seed(0)
    ep = pf.export_joint(Attention().train(), (torch.randn(2, 5, 8),))
    targets = forward_targets(ep)
    assert "aten.scaled_dot_product_attention.default" not in targets
    assert "aten.linear.default" in targets  # kept: only the op that draws is decomposed
    decision, why = program_facts(ep.graph_module).composite_decisions["aten.scaled_dot_product_attention.default"]
    assert decision == "decompose" and "computed from random numbers" in why, why


def test_without_dropout_attention_stays_one_node():
    torch.manual_seed(0)
    ep = pf.export_joint(Attention(dropout=0.0).train(), (torch.randn(2, 5, 8),))
    assert "aten.scaled_dot_product_attention.default" in forward_targets(ep)


def test_a_users_keep_wins_and_the_refusal_says_why():
    torch.manual_seed(0)
    with pytest.raises(pf.JointError, match="computed from random numbers") as caught:
        pf.export_joint(Attention().train(), (torch.randn(2, 5, 8),),
                        composite_overrides={"aten.scaled_dot_product_attention.default": "keep"})
    assert caught.value.kind is pf.JointProblem.SAVED_VALUE_NOT_RECOMPUTABLE


def test_torchs_derivative_of_functional_rrelu_reads_the_noise_input():
    """Why joint/formula_fixes.py rewires rrelu's backward: through ``rrelu_with_noise_functional``
    eager's gradient is the noise *input* (777 here), not the slopes drawn. A torch that reads
    ``noise_out`` fails here: drop the fix."""
    torch.manual_seed(0)
    x = torch.randn(6, requires_grad=True)
    out, drawn = torch.ops.aten.rrelu_with_noise_functional(x, torch.full((6,), 777.0), 0.1, 0.3, True)
    out.sum().backward()
    assert torch.equal(x.grad, torch.full((6,), 777.0)) and not torch.equal(drawn, torch.full((6,), 777.0))
