"""Training-mode batch norm for CUDA, traced on fake CUDA tensors (no GPU needed): torch 2.11
and 2.12 decompose ``batch_norm`` at pre-dispatch into ``cudnn_batch_norm``, whose schema
declares no write although the kernel writes the running statistics. The program must carry
those writes in its signature, and run the kernel eager runs (cuDNN or the native one, picked
at run time: ``_batch_norm_with_update_functional``); on a host without a GPU as on the GPU's
(checked against the reference on the GPU: tests/cuda/)."""

import pytest
import torch

import predispatch_func as pf
from tests.support.fresh_process import run_in_fresh_process
from tests.support.reference import call_targets

pytestmark = pytest.mark.skipif(not torch.backends.cuda.is_built(), reason="fake CUDA tensors need a CUDA build")


def test_running_stats_written_by_cuda_batch_norm_are_in_the_signature():
    # a fresh process: in the whole suite an earlier test's CUDA state made the fake `.to("cuda")`
    # reach the driver ("CUDA driver version is insufficient") on a host without a GPU
    run_in_fresh_process(__name__, "_running_stats_written_by_cuda_batch_norm_are_in_the_signature")


def _running_stats_written_by_cuda_batch_norm_are_in_the_signature():
    from torch._subclasses.fake_tensor import FakeTensorMode

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8)).train()
    with FakeTensorMode(allow_non_fake_inputs=True):
        model = model.to_empty(device="cuda")
        x = torch.randn(4, 3, 10, 10).to("cuda")
    ep = pf.export(model, (x,))
    written = {s.target for s in ep.graph_signature.output_specs if s.kind.name == "BUFFER_MUTATION"}
    assert written == {"1.running_mean", "1.running_var", "1.num_batches_tracked"}
    assert not {"aten.cudnn_batch_norm.default", "aten.miopen_batch_norm.default"} & call_targets(ep)
    assert "aten._batch_norm_with_update_functional.default" in call_targets(ep)
