"""Hand-written samples for ops that models use but whose schemas cannot describe their inputs.

An RNN takes its weights as a ``Tensor[]`` whose shapes depend on the gate
count; an embedding bag needs integer indices and offsets. No schema profile
can guess those, and without a run these composites would be ``untested``
(so decomposed), although they are honest.

Some lie only on inputs no profile makes: ``to_sparse(2)`` of a COO tensor and
``to_sparse_bsr((2, 2))`` of a BSR tensor of that blocksize return the input
itself (the layout samples of :mod:`.layouts` convert with other parameters,
which these ops refuse), and ``fbgemm_pack_gemm_matrix_fp16`` clamps its input
in place to float16's range, so only values beyond it show the write.
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


def _sparse_conversion_samples(packet: str) -> list[Sample]:
    """A dense input, and one already in the target layout with the parameters the call asks for."""
    x = torch.randn(4, 4)
    if packet.endswith("to_sparse"):  # the sparse_dim overload
        return [Sample("recipe:to-sparse", (x, 2), {}),
                *(Sample("recipe:same-layout", (x.to_sparse(dim), dim), {}, layout="sparse_coo") for dim in (2, 1))]
    compressed = packet.removeprefix("_").removeprefix("to_")  # sparse_bsr | sparse_bsc
    same = x.to_sparse(layout=getattr(torch, compressed), blocksize=(2, 2))
    return [Sample("recipe:to-sparse", (x, [2, 2]), {}),
            Sample("recipe:same-layout", (same, [2, 2]), {}, layout=compressed)]


def _fbgemm_fp16_pack_samples() -> list[Sample]:
    """Values beyond float16's range, which the packing clamps in the input itself; only where
    the build has fbgemm (elsewhere the op raises, so it stays untested and is decomposed)."""
    if not tc.has_fbgemm():
        return []
    return [Sample("recipe:beyond-float16", (torch.tensor([[7e4, -1e5, 1.0], [2.0, 3.0, 7e4]]),), {})]


_SPARSE_CONVERSIONS = {("to_sparse", "sparse_dim"), ("_to_sparse", "sparse_dim"), ("to_sparse_bsr", "default"),
                       ("_to_sparse_bsr", "default"), ("to_sparse_bsc", "default"), ("_to_sparse_bsc", "default")}


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
    if (packet, tc.overload_name(op)) in _SPARSE_CONVERSIONS:
        return _sparse_conversion_samples(packet)
    if packet == "fbgemm_pack_gemm_matrix_fp16":
        return _fbgemm_fp16_pack_samples()
    if packet == "cosine_embedding_loss":  # target: one +-1 per row
        return [Sample("recipe:pairs", (torch.randn(2, 3), torch.randn(2, 3), torch.tensor([1.0, -1.0])), {})]
    return []
