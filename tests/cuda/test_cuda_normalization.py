"""Batch norm's backward (opsets/decompositions/normalization.py) on the GPU: torch's decomposition's
values bit for bit there too, and a session's conv + batch norm step trains as eager does."""

from __future__ import annotations

import pytest
import torch
from torch._decomp import decomposition_table

from predispatch_func.opsets.decompositions import normalization
from tests.opsets.test_normalization import trains_as_eager

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

aten = torch.ops.aten


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("channels_last", [False, True])
def test_values_are_torchs_decomposition_bit_for_bit(dtype, train, channels_last):
    generator = torch.Generator(device="cuda").manual_seed(0)
    shape, channels = (4, 6, 5, 7), 6
    x, grad = (torch.randn(shape, device="cuda", generator=generator).to(dtype) for _ in range(2))
    if channels_last:
        x, grad = x.contiguous(memory_format=torch.channels_last), grad.contiguous(memory_format=torch.channels_last)
    stats = [torch.rand(channels, device="cuda", generator=generator) + 0.5 for _ in range(5)]
    arguments = (grad, x, stats[0], stats[1], stats[2], stats[3], stats[4], train, 1e-5, [True, True, True])
    ours = normalization.native_batch_norm_backward(*arguments)
    theirs = decomposition_table[aten.native_batch_norm_backward.default](*arguments)
    for a, b in zip(ours, theirs):
        assert a.dtype == b.dtype and torch.equal(a, b)


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last])
def test_a_batch_norm_trains_in_a_session_as_in_eager(memory_format):
    # on CUDA eager's batch norm may be cuDNN's: torch's decomposition of its backward calls ours
    trains_as_eager("cuda", memory_format, {"aten.native_batch_norm_backward.default",
                                            "aten.cudnn_batch_norm_backward.default"}, atol=1e-5)
