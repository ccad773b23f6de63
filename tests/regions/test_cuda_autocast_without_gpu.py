"""``autocast("cuda")`` on a host without a GPU: torch's constructor turns the region off
("CUDA is not available ... Disabling autocast"), so a program exported there silently lost
the region a GPU host records. The export keeps it (``tc.cuda_autocast_kept_without_gpu``),
warning once with the model's line, so a build machine exports the GPU host's program."""

import warnings

import pytest
import torch

import predispatch_func as pf
from predispatch_func import _torch_compat as tc
from tests.support.fresh_process import run_in_fresh_process
from tests.support.reference import call_targets, export_checked

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the case of a host without a GPU")


class CudaAutocastLinear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return self.lin(x) * 2


def _region_calls(ep):
    return [n.args[:4] for n in ep.graph.nodes if str(n.target) == "pf_autocast_region"]


def test_cuda_autocast_region_is_kept_on_a_host_without_a_gpu_and_warns_once():
    model, x = CudaAutocastLinear(), torch.randn(3, 4)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        ep = pf.export(model, (x,))
    assert _region_calls(ep) == [("cuda", torch.bfloat16, True, True)]
    ours = [w for w in seen if str(w.message) == tc.CUDA_AUTOCAST_KEPT_WARNING]
    assert len(ours) == 1 and ours[0].filename == __file__  # the model's line
    assert not any("Disabling autocast" in str(w.message) for w in seen)
    # replayed here, the program's region turns itself off as eager's does: same values
    export_checked(model, (x,))


def test_outside_an_export_torch_still_turns_the_cuda_region_off():
    with pytest.warns(UserWarning, match="Disabling autocast"):
        region = torch.autocast("cuda", dtype=torch.bfloat16)
    assert not region._enabled


@pytest.mark.skipif(not torch.backends.cuda.is_built(), reason="fake CUDA tensors need a CUDA build of torch")
def test_model_on_fake_cuda_tensors_exports_its_autocast_region_in_bfloat16():
    # a fresh process: torch state earlier tests leave (the test backend registered as PrivateUse1,
    # CUDA's lazy-init queue) changes what autocast and fake CUDA tensors do
    run_in_fresh_process(__name__, "_model_on_fake_cuda_tensors_exports_its_autocast_region_in_bfloat16")


def _model_on_fake_cuda_tensors_exports_its_autocast_region_in_bfloat16():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with torch.device("meta"):
        model = CudaAutocastLinear()
    with FakeTensorMode(allow_non_fake_inputs=True):
        model = model.to_empty(device="cuda")
        x = torch.randn(3, 4).to("cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ep = pf.export(model, (x,))
    assert _region_calls(ep) == [("cuda", torch.bfloat16, True, True)]
    (out,) = [n for n in ep.graph.nodes if n.op == "output"][0].args[0]
    assert out.meta["val"].dtype == torch.bfloat16 and out.meta["val"].device.type == "cuda"
    assert "aten.linear.default" in call_targets(ep)
