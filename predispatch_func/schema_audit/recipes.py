"""Hand-written samples for ops that models use but whose schemas cannot describe their inputs.

An RNN takes its weights as a ``Tensor[]`` whose shapes depend on the gate
count; an embedding bag needs integer indices and offsets. No schema profile
can guess those, and without a run these composites would be ``untested``
(so decomposed), although they are honest.
"""

from __future__ import annotations

import torch

from .. import _torch_compat as tc
from .samples import Sample


def _rnn_weights(gates: int, inp: int = 3, hidden: int = 4) -> list[torch.Tensor]:
    return [torch.randn(gates * hidden, inp), torch.randn(gates * hidden, hidden),
            torch.randn(gates * hidden), torch.randn(gates * hidden)]


def _rnn_samples(packet: str, overload: str) -> list[Sample]:
    """Recurrent ops pack their weights in lists whose shapes no profile can guess."""
    gates = {"lstm": 4, "gru": 3, "rnn_tanh": 1, "rnn_relu": 1}[packet.removesuffix("_cell")]
    h = torch.randn(1, 4)
    if packet.endswith("_cell"):
        w_ih, w_hh, b_ih, b_hh = _rnn_weights(gates)
        hx = [h, torch.randn(1, 4)] if gates == 4 else h
        return [Sample("recipe:rnn-cell", (torch.randn(1, 3), hx, w_ih, w_hh, b_ih, b_hh), {})]
    hx = [h[None], torch.randn(1, 1, 4)] if gates == 4 else h[None]
    flags = (True, 1, 0.0, False, False)  # has_biases, layers, dropout, train, bidirectional
    if overload == "input":
        return [Sample("recipe:rnn-sequence", (torch.randn(2, 1, 3), hx, _rnn_weights(gates), *flags, False), {})]
    batch_sizes = torch.tensor([1, 1])
    return [Sample("recipe:rnn-packed", (torch.randn(2, 3), batch_sizes, hx, _rnn_weights(gates), *flags), {})]


def _embedding_bag_samples(overload: str) -> list[Sample]:
    weight, indices, offsets = torch.randn(5, 3), torch.tensor([0, 2, 1, 4]), torch.tensor([0, 2])
    if overload == "padding_idx":
        return [Sample("recipe:embedding-bag", (weight, indices, offsets, False, mode, False, None, False, None), {})
                for mode in (0, 1, 2)]
    return [Sample("recipe:embedding-bag", (weight, indices, offsets, False, mode), {}) for mode in (0, 1, 2)]


def recipe_samples(op: tc.OpOverload) -> list[Sample]:
    """Hand-written samples for ops models use but schemas cannot describe."""
    if op.namespace != "aten":
        return []
    packet = tc.schema_of(op).name.split("::")[-1]
    if packet in ("lstm", "gru", "rnn_tanh", "rnn_relu", "lstm_cell", "gru_cell", "rnn_tanh_cell",
                  "rnn_relu_cell"):
        return _rnn_samples(packet, tc.overload_name(op))
    if packet == "embedding_bag":
        return _embedding_bag_samples(tc.overload_name(op))
    if packet == "cosine_embedding_loss":  # target: one +-1 per row
        return [Sample("recipe:pairs", (torch.randn(2, 3), torch.randn(2, 3), torch.tensor([1.0, -1.0])), {})]
    return []
