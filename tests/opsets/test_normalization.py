"""Batch norm's backward (opsets/decompositions/normalization.py): torch's decomposition's values,
bit for bit, in fewer ops, on both lowerings.

Bit equality with torch's decomposition is the claim the module makes (a backend's gradients do
not move when we pick ours); closeness to eager's fused kernel is the op_db check's job
(tests/opsets/test_decompositions.py) and is checked here once more through a session.
"""

from __future__ import annotations

import pytest
import torch
from torch._decomp import decomposition_table

import predispatch_func as pf
from predispatch_func.opsets import lowering
from predispatch_func.opsets.decompositions import normalization

aten = torch.ops.aten
OP = aten.native_batch_norm_backward.default

SHAPES = [(4, 3), (2, 5, 7), (2, 3, 4, 5), (1, 2, 3, 2, 2), (3, 1, 4, 4)]


def _arguments(shape, dtype, *, train, weight, channels_last=False):
    generator = torch.Generator().manual_seed(sum(shape) + len(shape))
    channels = shape[1]

    def draw(*size, positive=False):
        value = torch.randn(*size, generator=generator, dtype=torch.float64)
        return (value.abs() + 0.5 if positive else value * 3 + 1).to(dtype)

    x = draw(*shape)
    grad = draw(*shape)
    if channels_last and len(shape) == 4:
        x, grad = x.contiguous(memory_format=torch.channels_last), grad.contiguous(memory_format=torch.channels_last)
    stats = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    w = draw(channels).to(stats) if weight else None
    running_mean, running_var = draw(channels).to(stats), draw(channels, positive=True).to(stats)
    save_mean, save_invstd = draw(channels).to(stats), draw(channels, positive=True).to(stats)
    return (grad, x, w, running_mean, running_var, save_mean, save_invstd, train, 1e-5, [True, True, weight])


CASES = [(shape, dtype, train, weight, channels_last)
         for shape in SHAPES for dtype in (torch.float32, torch.float64)
         for train in (True, False) for weight in (True, False) for channels_last in (False, True)
         if not channels_last or len(shape) == 4]
CASES += [((2, 3, 4, 5), dtype, True, True, False) for dtype in (torch.float16, torch.bfloat16)]


def _same_bits(ours, theirs):
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert (a is None) == (b is None)
        if a is not None:
            assert a.dtype == b.dtype and a.shape == b.shape
            assert torch.equal(a, b) or (a.isnan() == b.isnan()).all() and torch.equal(a.nan_to_num(), b.nan_to_num())


@pytest.mark.parametrize(("shape", "dtype", "train", "weight", "channels_last"), CASES)
def test_values_are_torchs_decomposition_bit_for_bit(shape, dtype, train, weight, channels_last):
    arguments = _arguments(shape, dtype, train=train, weight=weight, channels_last=channels_last)
    _same_bits(normalization.native_batch_norm_backward(*arguments), decomposition_table[OP](*arguments))


def _traced_calls(decomposition, arguments):
    graph = torch.fx.experimental.proxy_tensor.make_fx(decomposition)(*arguments).graph
    return [node.target for node in graph.nodes if node.op == "call_function"]


def test_fewer_calls_than_torchs_decomposition():
    """The point of the module: a 4-d input's backward in training, traced as a session traces it."""
    arguments = _arguments((2, 3, 4, 5), torch.float32, train=True, weight=True)
    ours, theirs = _traced_calls(normalization.native_batch_norm_backward, arguments), _traced_calls(
        decomposition_table[OP], arguments)
    assert len(ours) <= len(theirs) * 2 // 3, (len(ours), len(theirs))
    assert aten.unsqueeze.default not in ours


def test_both_lowerings_pick_it():
    assert lowering.core_decompositions()[OP] is normalization.native_batch_norm_backward


def trains_as_eager(device: str, memory_format, lowered: set[str], atol: float) -> None:
    """A conv + batch norm + relu step through pf.eager.on(core_aten) on ``device``: the gradients
    are eager's, to float32's rounding of another summation order, and the session lowered one of
    ``lowered`` (the batch norm backward eager's kernel choice reaches)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU()).to(device)
    x = torch.randn(4, 3, 12, 12, device=device).contiguous(memory_format=memory_format)

    def grads():
        model.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        return [p.grad.clone() for p in model.parameters()]

    expected = grads()
    session = pf.eager.on(pf.OpSet.core_aten())
    with session:
        got = grads()
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=atol)
    decomposed = {str(op) for op in session.stats.decomposed}
    assert decomposed & lowered, decomposed


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last])
def test_a_batch_norm_trains_in_a_session_as_in_eager(memory_format):
    trains_as_eager("cpu", memory_format, {"aten.native_batch_norm_backward.default"}, atol=1e-6)
