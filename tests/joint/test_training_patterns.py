"""What training code writes, one small model each, as a training step: parametrizations (spectral
and weight norm), embeddings (max_norm renormalised in forward, padding_idx, bags, tied to the
output layer), normalisation layers and in-place activations, a VAE's reparameterisation,
distributions, Gumbel-softmax, ``vmap`` and ``functional_call`` in forward. Each is replayed against
eager over two steps, plain and under Core ATen, and over three with AdamW; where the program
cannot be made (torch.export cannot either, or no Core ATen op draws what eager draws) the refusal
is pinned by what it says. Found with these: the LSTM, module-hook, clipping and random-composite
work of 2026-12-01 (their own tests: test_recurrent.py, hops/test_module_backward_hooks.py, ...).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrizations

import predispatch_func as pf
from tests.joint.reference import export_joint_checked
from tests.support.torch_release import torch_release


def _mean_square(out):
    return out.pow(2).mean()


def spectral_norm():
    model = nn.Sequential(parametrizations.spectral_norm(nn.Linear(4, 5)), nn.ReLU(), nn.Linear(5, 1))
    return model, (torch.randn(3, 4),), _mean_square


def weight_norm():
    model = nn.Sequential(parametrizations.weight_norm(nn.Linear(4, 5)), nn.Tanh(), nn.Linear(5, 1))
    return model, (torch.randn(3, 4),), _mean_square


def orthogonal():
    model = nn.Sequential(parametrizations.orthogonal(nn.Linear(4, 4)), nn.Linear(4, 1))
    return model, (torch.randn(3, 4),), _mean_square


class _Embedded(nn.Module):
    def __init__(self, **options):
        super().__init__()
        self.embed, self.head = nn.Embedding(10, 4, **options), nn.Linear(4, 3)

    def forward(self, ids, labels):
        return F.cross_entropy(self.head(self.embed(ids)).flatten(0, 1), labels, label_smoothing=0.1, ignore_index=2)


def embedding_max_norm():  # renormalises the looked-up rows in place, under no_grad, in forward
    return _Embedded(max_norm=1.0), (torch.tensor([[1, 2, 3], [3, 4, 9]]), torch.tensor([0, 1, 2, 2, 1, 0])), None


def embedding_padding_idx():
    return _Embedded(padding_idx=0), (torch.tensor([[0, 2, 3], [3, 0, 9]]), torch.tensor([0, 1, 2, 2, 1, 0])), None


class _Bag(nn.Module):
    def __init__(self):
        super().__init__()
        self.bag, self.head = nn.EmbeddingBag(10, 4, mode="mean"), nn.Linear(4, 1)

    def forward(self, ids, offsets):
        return self.head(self.bag(ids, offsets)).pow(2).mean()


def embedding_bag():
    return _Bag(), (torch.tensor([1, 2, 3, 4, 5, 9]), torch.tensor([0, 2])), None


class _Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.norm = nn.Embedding(11, 8), nn.LayerNorm(8)
        self.head = nn.Linear(8, 11, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids, labels):
        return F.cross_entropy(self.head(self.norm(self.embed(ids))).flatten(0, 1), labels.flatten())


def tied_embedding():
    return _Tied(), (torch.randint(0, 11, (2, 5)), torch.randint(0, 11, (2, 5))), None


def in_place_activations():
    model = nn.Sequential(nn.Linear(4, 5), nn.ReLU(inplace=True), nn.Linear(5, 5), nn.Hardswish(inplace=True),
                          nn.Linear(5, 5), nn.SiLU(inplace=True), nn.Linear(5, 1), nn.LeakyReLU(0.1, inplace=True))
    return model, (torch.randn(3, 4),), _mean_square


def group_norm_transposed_conv():
    model = nn.Sequential(nn.ConvTranspose2d(3, 4, 3, stride=2), nn.GroupNorm(2, 4), nn.Mish(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 1))
    return model, (torch.randn(2, 3, 5, 5),), _mean_square


def instance_norm_tracking():
    model = nn.Sequential(nn.Conv1d(3, 4, 3), nn.InstanceNorm1d(4, affine=True, track_running_stats=True),
                          nn.PReLU(), nn.Flatten(), nn.Linear(24, 1))
    return model, (torch.randn(2, 3, 8),), _mean_square


class _Vae(nn.Module):
    def __init__(self):
        super().__init__()
        self.encode, self.decode = nn.Linear(6, 8), nn.Linear(2, 6)

    def forward(self, x):
        h = self.encode(x)
        mu, log_var = h[:, :2], h[:, 2:4]
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * log_var)
        kl = -0.5 * torch.sum(1 + log_var - mu.pow(2) - log_var.exp())
        return F.mse_loss(self.decode(z), x, reduction="sum") + kl


def vae():
    return _Vae(), (torch.randn(5, 6),), None


class _Policy(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(4, 4)

    def forward(self, x):
        h = self.layer(x)
        # validate_args explicit: another test may have turned the process-wide default off
        normal = torch.distributions.Normal(h[:, :2], F.softplus(h[:, 2:]) + 1e-3, validate_args=True)
        action = normal.rsample()
        return -(normal.log_prob(action).sum() - normal.entropy().sum()) + action.pow(2).mean()


def distributions():
    return _Policy(), (torch.randn(5, 4),), None


class _Gumbel(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(4, 5)

    def forward(self, x):
        return (F.gumbel_softmax(self.layer(x), tau=0.5, hard=True) * torch.arange(5.0)).sum()


def gumbel_softmax():
    return _Gumbel(), (torch.randn(3, 4),), None


class _PerSample(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 3))

    def forward(self, x):
        return torch.vmap(lambda row: (row @ self.w).tanh().sum())(x).pow(2).mean()


def vmap_in_forward():
    return _PerSample(), (torch.randn(5, 4),), None


class _Functional(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner, self.delta = nn.Linear(4, 4), nn.Parameter(torch.zeros(4, 4))

    def forward(self, x):
        weights = {"weight": self.inner.weight + self.delta, "bias": self.inner.bias}
        return torch.func.functional_call(self.inner, weights, (x,)).pow(2).mean()


def functional_call_in_forward():
    return _Functional(), (torch.randn(3, 4),), None


PATTERNS = {f.__name__: f for f in (
    spectral_norm, weight_norm, orthogonal, embedding_max_norm, embedding_padding_idx, embedding_bag,
    tied_embedding, in_place_activations, group_norm_transposed_conv, instance_norm_tracking, vae, distributions,
    gumbel_softmax, vmap_in_forward, functional_call_in_forward)}
# under Core ATen: what no Core ATen op computes as eager does, named in the refusal
CORE_REFUSED = {
    "orthogonal": "linalg_matrix_exp",  # its decomposition reads data
    "distributions": "normal_functional",  # rsample's draw (torch decomposes it into prims only)
    "gumbel_softmax": "exponential",  # torch decomposes it into prims only; its CPU kernel's draws are MKL's
}


# refused on every path where torch.export refuses it too
REFUSED = {
    # before torch 2.15 the distribution's argument validation branches on tensor data in Python
    **({"distributions": "data-dependent"} if torch_release() < (2, 15) else {}),
}


@pytest.mark.parametrize("target", [None, "core_aten"])
@pytest.mark.parametrize("name", list(PATTERNS))
def test_training_pattern_steps_as_eager(name, target):
    torch.manual_seed(0)
    model, args, loss_fn = PATTERNS[name]()
    core = pf.OpSet.core_aten() if target else None
    if name in REFUSED:
        with pytest.raises(pf.ExportError, match=REFUSED[name]):
            pf.export_joint(model.train(), args, loss_fn=loss_fn, target=core)
        return
    if target and name in CORE_REFUSED:
        with pytest.raises(pf.ExportError, match=CORE_REFUSED[name]):
            pf.export_joint(model.train(), args, loss_fn=loss_fn, target=core)
        return
    export_joint_checked(model.train(), args, loss_fn=loss_fn, target=core)


@pytest.mark.parametrize("name", list(PATTERNS))
def test_training_pattern_steps_with_adamw_as_eager(name):
    torch.manual_seed(0)
    model, args, loss_fn = PATTERNS[name]()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    if name in REFUSED:
        with pytest.raises(pf.ExportError, match=REFUSED[name]):
            pf.export_joint(model.train(), args, loss_fn=loss_fn, optimizer=optimizer)
        return
    export_joint_checked(model.train(), args, loss_fn=loss_fn, optimizer=optimizer, calls=3)


def test_batch_norm_with_cumulative_averages_is_refused_as_torch_export_refuses_it():
    """``momentum=None`` reads ``num_batches_tracked`` as a Python float in forward."""
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4, momentum=None), nn.Flatten(), nn.Linear(144, 1))
    with pytest.raises(pf.ExportError, match="data-dependent"):
        pf.export_joint(model.train(), (torch.randn(2, 3, 8, 8),), loss_fn=_mean_square)


def test_a_gradient_penalty_computed_with_autograd_in_forward_is_refused():
    class Critic(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = nn.Linear(4, 1)

        def forward(self, x):
            out = self.layer(x)
            (grad,) = torch.autograd.grad(out.sum(), x, create_graph=True)
            return out.mean() + ((grad.norm(2, dim=1) - 1) ** 2).mean()

    with pytest.raises(pf.UnsupportedError, match="torch.autograd.grad is called inside forward"):
        pf.export_joint(Critic(), (torch.randn(5, 4, requires_grad=True),))
