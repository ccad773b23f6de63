"""``pf.eager`` on the GPU: sdpa takes its math path where the target has none of CUDA's fused
attention kernels (``eager/attention_path.py``), as torch's choice answers a backend without them;
a target holding them keeps them."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import predispatch_func as pf
from predispatch_func.eager import attention_path

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

aten = torch.ops.aten
CORE = pf.OpSet.core_aten()
MASKS = {"none": lambda: {}, "causal": lambda: {"is_causal": True},
         "bool": lambda: {"attn_mask": torch.rand(6, 6, device="cuda") > 0.3},
         "float": lambda: {"attn_mask": torch.randn(2, 1, 6, 6, device="cuda")}}


def _step(options, dtype):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 6, 16, device="cuda", dtype=dtype, requires_grad=True) for _ in range(3))
    out = F.scaled_dot_product_attention(q, k, v, **options)
    out.float().pow(2).sum().backward()
    return [out.detach(), *(t.grad for t in (q, k, v))]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mask", list(MASKS))
def test_sdpa_on_cuda_takes_the_math_path_without_the_fused_kernels(mask, dtype):
    torch.manual_seed(1)
    options = MASKS[mask]()
    with sdpa_kernel([SDPBackend.MATH]):
        expected = _step(options, dtype)
    with pf.eager.on(CORE) as session:
        got = _step(options, dtype)
    torch.testing.assert_close(got[0], expected[0], rtol=0, atol=0)  # the math kernel's own result
    torch.testing.assert_close(got[1:], expected[1:])  # its backward, through lowered ops
    assert session.stats.above_autograd[aten.scaled_dot_product_attention.default] == 1
    fused = [str(op) for op in session.stats.decomposed if "attention" in str(op) and "scaled_dot" not in str(op)]
    assert not fused, fused


def test_a_target_with_cudas_fused_kernels_keeps_them():
    fused = [name.replace("::", ".") for name in attention_path.FUSED_KERNELS["cuda"]]
    backward = [name.replace("forward", "backward") if "forward" in name else name + "_backward" for name in fused]
    names = [f"{name}.default" for name in fused + backward]
    target = CORE | pf.OpSet.from_names([n for n in names if _exists(n)], name="with_cuda_attention")
    assert attention_path.devices_taking_math(frozenset(op.name() for op in target)) == frozenset({"cpu"})
    with pf.eager.on(target) as session:
        got = _step({}, torch.bfloat16)
    expected = _step({}, torch.bfloat16)
    torch.testing.assert_close(got, expected)
    assert aten.scaled_dot_product_attention.default not in session.stats.above_autograd


def _exists(name: str) -> bool:
    namespace, _, rest = name.partition(".")
    packet, _, overload = rest.partition(".")
    return hasattr(getattr(torch.ops, namespace), packet) and hasattr(getattr(getattr(torch.ops, namespace), packet),
                                                                      overload)
