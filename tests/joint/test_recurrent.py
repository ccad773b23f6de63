"""Recurrent layers in a training step. torch's decomposition of ``lstm`` (which every trace
runs) took oneDNN's inference layer whenever the input did not require grad, so a model's first
LSTM, over data, made a step whose backward failed when run (its workspace missing): torch's own
joint path fails so too. tc.lstm_decomposed_for_training keeps that layer for inference only."""

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
        else:
            self.rnn = nn.LSTMCell(4, 6)
        self.head = nn.Linear(self.out_features(), 1)

    def out_features(self) -> int:
        return {"lstm_bidirectional": 12, "lstm_projected": 3}.get(self.kind, 6)

    def forward(self, x):
        if self.kind == "lstm_cell":
            h, c = self.rnn(x[:, 0])
            h, c = self.rnn(x[:, 1], (h, c))
            return self.head(h).pow(2).mean() + c.mean()
        out, _ = self.rnn(x)
        return self.head(out).pow(2).mean()


KINDS = ["lstm", "lstm_bidirectional", "lstm_projected", "gru", "lstm_cell"]


@pytest.mark.parametrize("target", [None, "core_aten"])
@pytest.mark.parametrize("kind", KINDS)
def test_recurrent_layer_over_data_trains_as_eager(kind, target):
    torch.manual_seed(0)
    model, x = Recurrent(kind), torch.randn(2, 5, 4)
    export_joint_checked(model, (x,), target=pf.OpSet.core_aten() if target else None)


def test_lstm_steps_with_adamw_as_eager():
    torch.manual_seed(0)
    model, x = Recurrent("lstm"), torch.randn(2, 5, 4)
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
