"""Recurrent layers in a training step. torch's decomposition of ``lstm`` (which every trace
runs) took oneDNN's inference layer whenever the input did not require grad, so a model's first
LSTM, over data, made a step whose backward failed when run (its workspace missing): torch's own
joint path fails so too. And its RNN helper applies no dropout between layers: a lowered program
ran without it, and a kept ``lstm``'s backward, recomputed through it, was silently wrong.
tc.rnn_decompositions_as_eager fixes both while we trace."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import predispatch_func as pf
from tests.joint.reference import export_joint_checked


class Recurrent(nn.Module):
    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind
        if kind == "lstm":
            self.rnn = nn.LSTM(4, 6, num_layers=2, batch_first=True)
        elif kind == "lstm_bidirectional":
            self.rnn = nn.LSTM(4, 6, bidirectional=True)
        elif kind == "lstm_projected":
            self.rnn = nn.LSTM(4, 6, proj_size=3, batch_first=True)
        elif kind == "gru":
            self.rnn = nn.GRU(4, 6, num_layers=2)
        elif kind == "lstm_dropout":
            self.rnn = nn.LSTM(4, 6, num_layers=3, dropout=0.3, batch_first=True)
        elif kind == "gru_dropout_bidirectional":
            self.rnn = nn.GRU(4, 6, num_layers=2, dropout=0.4, bidirectional=True)
        elif kind == "rnn_tanh_dropout":
            self.rnn = nn.RNN(4, 6, num_layers=2, dropout=0.5)
        else:
            self.rnn = nn.LSTMCell(4, 6)
        self.head = nn.Linear(self.out_features(), 1)

    def out_features(self) -> int:
        return {"lstm_bidirectional": 12, "lstm_projected": 3, "gru_dropout_bidirectional": 12}.get(self.kind, 6)

    def forward(self, x):
        if self.kind == "lstm_cell":
            h, c = self.rnn(x[:, 0])
            h, c = self.rnn(x[:, 1], (h, c))
            return self.head(h).pow(2).mean() + c.mean()
        out, _ = self.rnn(x)
        return self.head(out).pow(2).mean()


KINDS = ["lstm", "lstm_bidirectional", "lstm_projected", "gru", "lstm_cell", "lstm_dropout",
         "gru_dropout_bidirectional", "rnn_tanh_dropout"]


@pytest.mark.parametrize("target", [None, "core_aten"])
@pytest.mark.parametrize("kind", KINDS)
def test_recurrent_layer_over_data_trains_as_eager(kind, target):
    torch.manual_seed(0)
    model, x = Recurrent(kind), torch.randn(2, 5, 4)
    export_joint_checked(model, (x,), target=pf.OpSet.core_aten() if target else None)


@pytest.mark.parametrize("kind", ["lstm", "lstm_dropout"])
def test_lstm_steps_with_adamw_as_eager(kind):
    torch.manual_seed(0)
    model, x = Recurrent(kind), torch.randn(2, 5, 4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    export_joint_checked(model, (x,), optimizer=optimizer, calls=3)


@pytest.mark.parametrize("target", [None, "core_aten"])
def test_a_forward_program_with_lstm_decomposed_trains_through_its_module(target):
    """The forward export decomposes ``lstm`` where asked (or lowered): ``ep.module()`` trains."""
    torch.manual_seed(0)
    model, x = Recurrent("lstm"), torch.randn(2, 5, 4)
    reference = copy.deepcopy(model)
    if target:
        ep = pf.export(model, (x,), target=pf.OpSet.core_aten())
    else:
        ep = pf.export(model, (x,), composite_overrides={"aten.lstm.input": "decompose"})
    assert "aten.lstm.input" not in [str(n.target) for n in ep.graph.nodes]
    report = pf.verify(ep, reference, (x,), calls=2)
    assert report.ok, report.problems


@pytest.mark.parametrize("target", [None, "core_aten"])
def test_the_dropout_between_layers_draws_eagers_masks(target):
    """With dropout 0.5 the loss of a step without it differs by far more than rounding: the
    program's loss equal to eager's (same seed) means the same masks were drawn."""
    torch.manual_seed(0)
    model, x = Recurrent("lstm_dropout"), torch.randn(2, 5, 4)
    model.rnn.dropout = 0.5
    ep = pf.export_joint(copy.deepcopy(model), (x,), target=pf.OpSet.core_aten() if target else None)
    torch.manual_seed(7)
    expected = model(x)
    torch.manual_seed(7)
    loss = ep.module()(x)[0]
    torch.testing.assert_close(loss, expected.detach())
    model.eval()
    assert not torch.allclose(model(x), expected)  # without dropout: another loss
