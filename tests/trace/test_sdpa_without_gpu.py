"""sdpa of fake CUDA tensors on a host without a GPU takes the GPU's kernel choice.

The fused kernels' results are laid out otherwise than the math kernel's, and
the program follows (``transpose(1, 2).reshape`` a view of a fused result, a copy
of the math one), so a build machine without a GPU exported another program than
the GPU host (``tc.cuda_sdpa_choice_without_gpu``; the rule: ``sdpa_choice.py``,
pinned against a real GPU in tests/cuda/test_cuda.py).
"""

import pytest
import torch

from predispatch_func._torch_compat.sdpa_choice import CUDNN, EFFICIENT, FLASH, MATH, fused_sdp_choice_on_gpu
from tests.models.corpus import UnderAutocast
from tests.support.fresh_process import run_in_fresh_process

pytestmark = [
    pytest.mark.skipif(torch.cuda.is_available(), reason="the case of a host without a GPU"),
    pytest.mark.skipif(not torch.backends.cuda.is_built(), reason="fake CUDA tensors need a CUDA build of torch"),
]


class Attention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(32, 96)
        self.out = torch.nn.Linear(32, 32)

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, 4, 8).permute(2, 0, 3, 1, 4)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        return self.out(a.transpose(1, 2).reshape(b, n, 32))


def test_program_on_fake_cuda_keeps_the_fused_kernels_layout():
    run_in_fresh_process(__name__, "_program_on_fake_cuda_keeps_the_fused_kernels_layout")


def _program_on_fake_cuda_keeps_the_fused_kernels_layout():
    from torch._subclasses.fake_tensor import FakeTensorMode

    import predispatch_func as pf
    from predispatch_func.graphs import all_graph_modules

    model = Attention()
    with FakeTensorMode(allow_non_fake_inputs=True):
        model = model.to_empty(device="cuda")
        x = torch.randn(2, 5, 32).to("cuda")
    for wrapped in (model, UnderAutocast(model, "cuda")):
        ep = pf.export(wrapped, (x,))
        nodes = [n for _, gm in all_graph_modules(ep.graph_module) for n in gm.graph.nodes]
        (sdpa,) = [n for n in nodes if n.target is torch.ops.aten.scaled_dot_product_attention.default]
        # (batch, seq, heads, dim) in memory, seen as (batch, heads, seq, dim): as on an H200
        assert sdpa.meta["val"].stride() == (160, 8, 32, 1), sdpa.meta["val"].stride()
        assert not any(n.target is torch.ops.aten.clone.default for n in nodes), "reshape copied"
    # torch's own kernels again after the export: the math kernel's dense layout
    with FakeTensorMode():
        q = torch.empty(2, 4, 5, 8, device="cuda")
        assert torch.nn.functional.scaled_dot_product_attention(q, q, q).stride() == (160, 40, 8, 1)


def _qkv(dtype, heads=4, kv_heads=4, dim=8, q_len=5, k_len=5):
    return (torch.empty(2, heads, q_len, dim, dtype=dtype), torch.empty(2, kv_heads, k_len, dim, dtype=dtype),
            torch.empty(2, kv_heads, k_len, dim, dtype=dtype))


@pytest.mark.parametrize("case,expected", [
    (dict(dtype=torch.float32), EFFICIENT),  # cuDNN and flash take fp16/bf16 only
    (dict(dtype=torch.bfloat16), CUDNN),  # preferred on sm90
    (dict(dtype=torch.float16, dim=12), FLASH),  # cuDNN wants multiples of 8; flash pads
    (dict(dtype=torch.float32, dim=6), MATH),  # efficient wants multiples of 4 in fp32
    (dict(dtype=torch.bfloat16, mask=True), CUDNN),
    (dict(dtype=torch.bfloat16, causal=True, q_len=3), CUDNN),
    (dict(dtype=torch.bfloat16, kv_heads=2, gqa=True), CUDNN),
    (dict(dtype=torch.float32, kv_heads=2, gqa=True), MATH),  # efficient has no grouped queries
    (dict(dtype=torch.float32, mask="broadcast"), MATH),  # a mask broadcast along its last dim
    (dict(dtype=torch.bfloat16, mask="broadcast"), MATH),
])
def test_choice_rule(case, expected):
    case = dict(case)
    mask, causal, gqa = case.pop("mask", False), case.pop("causal", False), case.pop("gqa", False)
    q, k, v = _qkv(**case)
    attn_mask = torch.ones(q.size(-2), k.size(-2), dtype=torch.bool) if mask else None
    if mask == "broadcast":  # (q_len, 1) seen as (q_len, k_len): HF's padding masks
        attn_mask = torch.ones(1, 1, q.size(-2), 1, dtype=torch.bool).expand(2, 1, q.size(-2), k.size(-2))
    assert fused_sdp_choice_on_gpu(q, k, v, attn_mask, 0.0, causal, None, gqa) == expected


def test_choice_follows_the_sdpa_kernel_switches():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = _qkv(torch.bfloat16)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]):
        assert fused_sdp_choice_on_gpu(q, k, v) == FLASH
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
        assert fused_sdp_choice_on_gpu(q, k, v) == EFFICIENT
    with sdpa_kernel([SDPBackend.MATH]):
        assert fused_sdp_choice_on_gpu(q, k, v) == MATH


def _stand_in_registered() -> bool:
    return "AutogradCUDA: registered at" in torch._C._dispatch_dump("aten::scaled_dot_product_attention") \
        and "_torch_compat" in torch._C._dispatch_dump("aten::scaled_dot_product_attention")


def test_nested_traces_share_one_stand_in():
    """A custom Function's body is traced inside the model's trace: the inner trace keeps the
    outer registration (registering twice raises), and it is gone after the outer one only."""
    from predispatch_func import _torch_compat as tc

    with tc.cuda_sdpa_choice_without_gpu():
        with tc.cuda_sdpa_choice_without_gpu():
            assert _stand_in_registered()
        assert _stand_in_registered()
    assert not _stand_in_registered()


class SineFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a):
        ctx.save_for_backward(a)
        return a.sin()

    @staticmethod
    def backward(ctx, g):
        (a,) = ctx.saved_tensors
        return g * a.cos()


class WithFunction(torch.nn.Module):
    def forward(self, x):
        return SineFunction.apply(x)


def test_a_custom_function_body_exports_under_the_stand_in():
    from tests.support.reference import export_checked

    export_checked(WithFunction(), (torch.randn(3),))
    assert not _stand_in_registered()
