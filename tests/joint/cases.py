"""Training-step cases: tiny models whose forward returns a scalar loss (or ``loss_fn`` makes one).

Each factory returns ``(model, args, kwargs, loss_fn)`` built from a fixed seed; float
inputs that should receive gradients require grad. ``REGIONS`` lists every case with a
grad-mode or autocast region, and how many region HOP calls its forward program has.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.support.torch_release import torch_release


@dataclasses.dataclass(frozen=True)
class JointCase:
    name: str
    build: Callable[[], tuple[nn.Module, tuple, dict, Any]]
    kept: tuple[str, ...] = ()  # composites the forward keeps as one node (aten op names)


CASES: dict[str, JointCase] = {}

# cases a torch release blocks: strict, so the release that fixes them shows
_ON_211 = torch_release() < (2, 12, 0)
CASE_MARKS = {
    "activation_checkpoint": [pytest.mark.xfail(
        _ON_211, strict=True, reason="torch 2.11's non-reentrant checkpoint asserts 'Did not expect to backward on "
        "this graph' when its _NoopSaveInputs backward is traced into the joint program (2.12 on: right)")],
}


def case_params(names: list[str]) -> list:
    """``names`` as pytest params, each with the marks :data:`CASE_MARKS` gives it."""
    return [pytest.param(n, marks=CASE_MARKS.get(n, [])) for n in names]


def case(*kept: str):
    def register(factory):
        def seeded():
            torch.manual_seed(0)
            return factory()
        CASES[factory.__name__] = JointCase(factory.__name__, seeded, kept)
        return seeded
    return register


def _x(*shape: int, grad: bool = False) -> torch.Tensor:
    return torch.randn(*shape).requires_grad_(grad)


class _Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(6, 8), nn.Linear(8, 3)

    def forward(self, x, y):
        return F.mse_loss(self.fc2(torch.relu(self.fc1(x))), y)


@case("aten.linear.default")
def plain_mlp():
    return _Mlp(), (_x(4, 6), _x(4, 3)), {}, None


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln, self.fc, self.head = nn.LayerNorm(8), nn.Linear(8, 8), nn.Linear(8, 5)

    def forward(self, x):
        h = F.gelu(self.fc(self.ln(x)))
        return self.head(h).softmax(-1)


@case("aten.layer_norm.default", "aten.gelu.default", "aten.softmax.int", "aten.linear.default")
def layernorm_gelu_softmax_with_loss_fn():
    target = torch.rand(3, 5)
    return _Block(), (_x(3, 8, grad=True),), {}, lambda probs: ((probs - target) ** 2).sum()


class _Ema(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.register_buffer("ema", torch.zeros(4))

    def forward(self, x):
        y = self.fc(x)
        with torch.no_grad():
            self.ema.mul_(0.9).add_(y.mean(0), alpha=0.1)
        return (y * self.ema).sum() + y.pow(2).mean()


@case("aten.linear.default")
def no_grad_ema_buffer_update():
    return _Ema(), (_x(3, 4),), {}, None


class _Autocast(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 8), nn.Linear(8, 2)

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = torch.relu(self.fc1(x))
            h = h @ self.fc1.weight
        return self.fc2(h.float()).logsumexp(-1).mean()


@case("aten.linear.default")
def autocast_bf16_block():
    return _Autocast(), (_x(4, 8, grad=True),), {}, None


class _Nested(nn.Module):
    def __init__(self):
        super().__init__()
        self.frozen, self.head = nn.Linear(4, 4), nn.Linear(4, 1)
        self.register_buffer("count", torch.zeros(()))

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            with torch.no_grad():
                f = self.frozen(x)
                self.count.add_(1)
                with torch.enable_grad():
                    g = self.head(x.float()).float()
            h = self.head(f.float() + x)
        return (h.float() * g).sum() + h.float().mean()


@case("aten.linear.default")
def nested_regions():
    return _Nested(), (_x(3, 4, grad=True),), {}, None


class _BatchNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3)

    def forward(self, x):
        return self.bn(self.conv(x)).relu().mean()


@case()
def batchnorm_training_running_stats():
    return _BatchNorm().train(), (_x(2, 2, 6, 6),), {}, None


class _Cube(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x ** 3

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * 3 * x * x + 1.0  # deliberately not the true derivative: the program must run this


class _Custom(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        return _Cube.apply(self.fc(x)).sum()


@case("aten.linear.default")
def custom_autograd_function():
    return _Custom(), (_x(2, 3, grad=True),), {}, None


class _Dropout(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.drop = nn.Linear(8, 8), nn.Dropout(0.5)

    def forward(self, x):
        # a mean, not a sum: with SGD's lr=0.1 a sum of squares diverges (momentum buffers of 1e3 by
        # step 3), and a float32 rounding step of such a buffer exceeded 1e-5 on a CPU without AVX-512
        return self.drop(self.fc(x)).pow(2).mean()


@case("aten.linear.default")
def dropout_train():
    return _Dropout().train(), (_x(4, 8),), {}, None


class _DropoutInPlace(nn.Module):
    """``inplace=True`` dropout (torchvision's classifiers) draws its mask by ``bernoulli_``."""

    def __init__(self):
        super().__init__()
        self.fc, self.drop = nn.Linear(8, 8), nn.Dropout(0.3, inplace=True)

    def forward(self, x):
        return self.drop(self.fc(x)).pow(2).sum()


@case("aten.linear.default")
def dropout_in_place_train():
    return _DropoutInPlace().train(), (_x(4, 8),), {}, None


class _StochasticDepth(nn.Module):
    """A residual branch dropped per sample, as torchvision's ``stochastic_depth`` draws it."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        survival = 0.8
        noise = torch.empty((x.shape[0], 1), dtype=x.dtype, device=x.device).bernoulli_(survival).div_(survival)
        return (x + self.fc(x) * noise).pow(2).sum()


@case("aten.linear.default")
def stochastic_depth_train():
    return _StochasticDepth().train(), (_x(16, 8),), {}, None


class _Issue41(nn.Module):
    """The issue's repro: a no_grad EMA update, an autocast(bfloat16) block, Linear and LayerNorm."""

    def __init__(self):
        super().__init__()
        self.lin, self.ln, self.out = nn.Linear(8, 8), nn.LayerNorm(8), nn.Linear(8, 4)
        self.register_buffer("ema", torch.zeros(8))

    def forward(self, x, labels):
        h = self.ln(self.lin(x))
        with torch.no_grad():
            self.ema.lerp_(h.mean(0), 0.1)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = self.out(h)
        loss = F.cross_entropy(logits.float(), labels)
        return loss, logits


@case("aten.linear.default", "aten.layer_norm.default")
def issue_41_repro():
    return _Issue41(), (_x(4, 8), torch.tensor([0, 3, 1, 2])), {}, None


class _SetGradCall(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x):
        torch.set_grad_enabled(False)
        frozen = self.a(x)
        torch.set_grad_enabled(True)
        return (self.b(frozen) * self.b(x)).sum()


@case("aten.linear.default")
def set_grad_enabled_as_call():
    return _SetGradCall(), (_x(2, 4, grad=True),), {}, None


class _Decorated(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)

    @torch.no_grad()
    def _stats(self, y):
        return y.std(0)

    def forward(self, x):
        y = self.a(x)
        return (y / (1 + self._stats(y))).sum()


@case("aten.linear.default")
def no_grad_decorator():
    return _Decorated(), (_x(5, 4),), {}, None


class _ClampedWeight(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        with torch.no_grad():
            self.lin.weight.clamp_(-0.3, 0.3)
        return self.lin(x).sum()


@case("aten.linear.default")
def weight_clamped_under_no_grad():
    return _ClampedWeight(), (_x(2, 4),), {}, None


class _AutocastInsideNoGrad(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x):
        with torch.no_grad():
            with torch.autocast("cpu", dtype=torch.bfloat16):
                t = self.a(x)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=False):
            u = self.b(x)
        return (t.float() * u).sum()


@case("aten.linear.default")
def autocast_inside_no_grad_and_disabled_autocast():
    return _AutocastInsideNoGrad(), (_x(2, 4, grad=True),), {}, None


class _Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv, self.gn = nn.Linear(8, 24), nn.GroupNorm(2, 4)

    def forward(self, x):
        q, k, v = self.qkv(x).view(1, 4, 3, 3, 8).unbind(2)
        a = F.scaled_dot_product_attention(q, k, v)
        return self.gn(a).square().mean()


@case("aten.linear.default", "aten.scaled_dot_product_attention.default", "aten.group_norm.default")
def attention_and_group_norm():
    return _Attention(), (_x(1, 4, 3, 8),), {}, None


REGION_CASES = ("no_grad_ema_buffer_update", "autocast_bf16_block", "nested_regions", "issue_41_repro",
                "set_grad_enabled_as_call", "no_grad_decorator", "weight_clamped_under_no_grad",
                "autocast_inside_no_grad_and_disabled_autocast")


class _HookInForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)
        h.register_hook(lambda g: g * 0.5)
        return h.tanh().sum()


@case("aten.linear.default")
def tensor_hook_in_forward():
    return _HookInForward(), (_x(2, 4, grad=True),), {}, None


class _RequiresGradAndDetach(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        stats = x.mean(0, keepdim=True).requires_grad_()  # a new leaf: no gradient to x through it
        h = self.fc(x - stats)
        return (h * h.detach()).sum() + stats.sum()


@case("aten.linear.default")
def requires_grad_and_detach():
    return _RequiresGradAndDetach(), (_x(3, 4),), {}, None


class _Checkpointed(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 1)

    def forward(self, x):
        h = torch.utils.checkpoint.checkpoint(lambda t: torch.relu(self.a(t)), x, use_reentrant=False)
        return self.b(h).sum()


@case("aten.linear.default")
def activation_checkpoint():
    return _Checkpointed(), (_x(3, 4, grad=True),), {}, None


class _CheckpointedReentrant(nn.Module):
    """transformers' default gradient checkpointing (``use_reentrant=True``): a dropout inside,
    whose mask eager's recomputation redraws from the forward's RNG state; the input comes from a
    layer with parameters (so it requires grad, as a hidden state does)."""

    def __init__(self):
        super().__init__()
        self.embed, self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 1)
        self.drop = nn.Dropout(0.3)

    def forward(self, x):
        h = torch.utils.checkpoint.checkpoint(lambda t: self.drop(torch.relu(self.a(t))), self.embed(x),
                                              use_reentrant=True)
        return self.b(h).pow(2).mean()


@case("aten.linear.default")
def activation_checkpoint_reentrant():
    return _CheckpointedReentrant().train(), (_x(3, 4),), {}, None


class _DataWrite(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.register_buffer("seen", torch.zeros(4))

    def forward(self, x):
        self.seen.data = self.seen.data + x.detach().abs().mean(0)
        return (self.fc(x) * self.seen).sum()


@case("aten.linear.default")
def data_write_to_buffer():
    return _DataWrite(), (_x(3, 4),), {}, None


class _RmsNorm(nn.Module):
    """transformers' diffllama shape: rms_norm's C++ decomposition, recomputed in the backward
    for its saved rstd, writes a temporary in place (``mean(x.pow(2)).add_(eps)``)."""

    def __init__(self):
        super().__init__()
        self.norm, self.fc = nn.RMSNorm(8, eps=1e-5), nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(self.norm(x)).pow(2).mean()


@case("aten.rms_norm.default")
def rms_norm_recomputed_with_its_own_writes():
    return _RmsNorm(), (_x(3, 8, grad=True),), {}, None


class _Upsample(nn.Module):
    """transformers' segformer shape: a kept ``upsample_bilinear2d`` recomputed in the backward;
    under a target its decomposition's ``arange`` must be lowered there too."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 1)

    def forward(self, x):
        return F.interpolate(self.conv(x), scale_factor=2.0, mode="bilinear", align_corners=False).pow(2).mean()


@case("aten.upsample_bilinear2d.vec")
def bilinear_upsample_recomputed():
    return _Upsample(), (_x(1, 2, 6, 6, grad=True),), {}, None


class _ReadThenDataWrite(nn.Module):
    """Writes through ``.data`` after autograd saved the written tensor: no version bump, so
    eager's backward reads the new values (the fuzzer's find). A parameter read whole, a row of
    another read and its other row written, a kept ``linear`` (its ``mm`` saved ``w.t()``), and a
    user input."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))
        self.rows = nn.Parameter(torch.randn(2, 4))
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        y = self.fc(x * self.w.cos()) * self.rows[0].sin() + x.exp()
        self.w.data.mul_(1.5)
        self.w.data.add_(0.25)  # written twice: the backward reads the last value
        self.rows.data[1].mul_(2.0)
        self.rows.data[0].add_(1.0)
        self.fc.weight.data.mul_(0.9)  # weight decay in forward
        x.data.mul_(0.5)
        return y.pow(2).mean()


@case("aten.linear.default")
def data_write_after_saved_read():
    return _ReadThenDataWrite(), (_x(3, 4, grad=True),), {}, None


class _CondBranches(nn.Module):
    """``torch.cond`` on a parameter: a branch whose backward reads its own result (``tanh``,
    saved as an output: the engine hands the backward's body trace a new tensor object) and
    holds a ``no_grad`` block; the other holds a kept ``linear`` (its ``mm`` saves ``w.t()``, a
    view made inside the composite). Every branch is traced for the backward, the one not
    taken too."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.rand(4) + 0.1)
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        def positive(x, w):
            with torch.no_grad():
                shift = w.cos() * 2
            return ((x * w + shift) * 0.5).tanh()

        def negative(x, w):
            return self.fc(x).exp() * w

        return torch.cond(self.w.sum() > 0, positive, negative, (x, self.w)).pow(2).mean()


@case()
def cond_in_training():
    return _CondBranches(), (_x(3, 4, grad=True),), {}, None


class _MapRows(nn.Module):
    """``map`` whose body reads its unmapped operand twice and saves ``exp`` of it."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))

    def forward(self, x):
        from torch._higher_order_ops.map import map as map_rows

        return map_rows(lambda row, w: (row * w).tanh() * w + w.exp(), x, self.w).pow(2).mean()


@case()
def map_in_training():
    return _MapRows(), (_x(3, 4, grad=True),), {}, None


class _WhileLoop(nn.Module):
    """torch's while_loop keeps its per-iteration values on its autograd ctx (not saved tensors)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))

    def forward(self, x):
        _, y = torch._higher_order_ops.while_loop(
            lambda i, t: i < 3, lambda i, t: (i + 1, (t * self.w).sin() + 1.0),
            (torch.zeros((), dtype=torch.int64), x * 1.0))
        return y.pow(2).mean()


@case()
def while_loop_in_training():
    return _WhileLoop(), (_x(4, grad=True),), {}, None


class _OneElementWindow(nn.Module):
    """``as_strided`` to one element: autograd writes its gradient into a fresh buffer through a
    0-d window (``new_zeros`` + ``as_strided(..., [], [], 6)`` + ``copy_``; found by fuzz.py)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 2, 4))

    def forward(self, x):
        v = self.w.as_strided((1, 1), (3, 3), 6)
        return (v * x).square().mean() + v.sum()


@case()
def one_element_window_of_a_parameter():
    return _OneElementWindow(), (_x(3, grad=True),), {}, None


class _Scan(nn.Module):
    """torch's scan with a parameter and an input requiring grad (its autograd kernel saves each
    step's values on its ctx; its body's joint graph is traced apart from the joint program's)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 4))
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        def step(carry, row):
            new = carry * 0.5 + self.lin(row * self.w[0]).tanh()
            return new, new.clone()

        last, rows = torch._higher_order_ops.scan(step, x[0] * 0, x)
        return rows.pow(2).mean() + last.sum()


@case()  # its linear is in the body, whose joint graphs torch traces below autograd: decomposed there
def scan_in_training():
    return _Scan(), (_x(3, 4, grad=True),), {}, None


class _ScanCarriesAParameter(nn.Module):
    """The carry starts from a parameter, and the body holds a no_grad block (a region in the
    forward program; inside the joint program's body, torch's trace bakes it: no gradient through it)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(3))

    def forward(self, x):
        def step(carry, row):
            with torch.no_grad():
                damp = (carry * 0.5).tanh()
            return (carry * row).sin() + self.w - damp, (carry + row).cos()

        carry, ys = torch._higher_order_ops.scan(step, self.w * 1.0, x)
        return carry.sum() + ys.pow(2).mean()


@case()
def scan_carry_from_a_parameter():
    return _ScanCarriesAParameter(), (_x(4, 3),), {}, None
