"""The training patterns of 2026-12-01 on the GPU: custom Functions that save their output, attention
and RNNs with dropout (CUDA's fused kernels draw with philox, cuDNN runs the RNNs), reentrant
checkpointing, and gradient clipping (eager's ``clip_grad_norm_`` takes ``_foreach_norm`` there).
Each step exported with CUDA weights and inputs and replayed against eager (2 steps; 3 with an
optimizer), under the same seeds."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import predispatch_func as pf
from tests.joint.cases import CASES as JOINT_CASES
from tests.joint.test_function_saved_values import FUNCTIONS, Step
from tests.joint.test_random_composites import MODELS as RANDOM_COMPOSITES
from tests.joint.test_recurrent import Recurrent

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

CUDA = "cuda"


def _checked(model, args, *, loss_fn=None, optimizer=None, calls=2, **kwargs):
    ep = pf.export_joint(model, args, loss_fn=loss_fn, optimizer=optimizer, **kwargs)
    report = pf.verify_joint(ep, model, args, loss_fn=loss_fn, optimizer=optimizer, calls=calls,
                             target=kwargs.get("target"))
    assert report.ok, report.problems[:4]


@pytest.mark.parametrize("fn", FUNCTIONS, ids=lambda f: f.__name__)
def test_function_saving_what_its_backward_reads_on_cuda(fn):
    torch.manual_seed(0)
    _checked(Step(fn).to(CUDA), (torch.randn(3, 4, device=CUDA),))


@pytest.mark.parametrize("name", [n for n in RANDOM_COMPOSITES if n != "rrelu"])
def test_attention_with_dropout_on_cuda(name, deterministic_kernels):
    torch.manual_seed(0)
    _checked(RANDOM_COMPOSITES[name]().train().to(CUDA), (torch.randn(2, 5, 8, device=CUDA),))


@pytest.mark.parametrize("kind", ["lstm", "lstm_bidirectional", "gru", "lstm_cell"])
def test_recurrent_layers_on_cuda(kind, deterministic_kernels):
    """nn.LSTM on CUDA failed to export at all (its weights flattened for cuDNN by data pointer). In
    float64: the backward of a kept RNN is the decomposition's, which in float32 rounds 1e-5 away
    from cuDNN's kernel (TF32 and another summation order), as any two kernels do."""
    torch.manual_seed(0)
    model, x = Recurrent(kind).to(CUDA).double(), torch.randn(2, 5, 4, device=CUDA, dtype=torch.float64)
    ep = pf.export_joint(model, (x,))
    report = pf.verify_joint(ep, model, (x,), calls=2, rtol=1e-9, atol=1e-10)
    assert report.ok, report.problems[:4]


@pytest.mark.parametrize("kind", ["lstm_dropout", "gru_dropout_bidirectional"])
def test_rnn_dropout_between_layers_on_cuda_is_refused_where_decomposed(kind):
    """cuDNN draws it from its own dropout state: the decomposition's mask differed from eager's,
    silently. The forward alone (one lstm node) still exports and trains as eager."""
    torch.manual_seed(0)
    model, x = Recurrent(kind).to(CUDA), torch.randn(2, 5, 4, device=CUDA)
    with pytest.raises(pf.UnsupportedError, match="cuDNN draws that mask") as caught:
        pf.export_joint(model, (x,))
    assert caught.value.kind is pf.Refusal.RNG_STREAM_NOT_REPRODUCIBLE
    ep = pf.export(model, (x,))
    report = pf.verify(ep, model, (x,), calls=2)
    assert report.ok, report.problems[:3]


def test_reentrant_checkpoint_with_dropout_on_cuda():
    model, args, kwargs, loss_fn = JOINT_CASES["activation_checkpoint_reentrant"].build()
    _checked(model.to(CUDA), tuple(a.to(CUDA) for a in args), loss_fn=loss_fn)


@pytest.mark.parametrize("max_norm", [0.05, 1e4])
def test_clipped_adamw_step_on_cuda(max_norm):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.GELU(), nn.Linear(8, 1)).to(CUDA)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    _checked(model, (torch.randn(16, 4, device=CUDA) * 10,), loss_fn=lambda out: out.pow(2).mean(),
             optimizer=optimizer, calls=3, clip_grad_norm=max_norm)
