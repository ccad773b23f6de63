"""A composite that autocast casts as a whole, decomposed in the program
(trace/autocast_composites.py).

CUDA autocast promotes ``grid_sampler``'s arguments to their widest dtype, then runs its
piece ``grid_sampler_2d`` with autocast off; autocast has no policy for the piece, so a
program that records it bare feeds it a bf16 input beside an fp32 grid (raised in
``ep.module()`` on the GPU: torchvision's raft_small). The program records autocast's
casts and the piece inside a nested ``autocast(enabled=False)`` region. Traced here on
fake CUDA tensors (no GPU needed); the values are checked on the GPU
(tests/cuda/test_cuda.py::test_a_composite_autocast_casts_as_a_whole_is_cast_as_eager_casts_it).
"""

import pytest
import torch
import torch.nn.functional as F

import predispatch_func as pf
from tests.support.fresh_process import run_in_fresh_process

pytestmark = pytest.mark.skipif(not torch.backends.cuda.is_built(), reason="fake CUDA tensors need a CUDA build")


class GridSampleThenMatmul(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(2, 2, 1)

    def forward(self, x, grid):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = self.conv(x)
            return F.grid_sample(y, grid, align_corners=True), torch.matmul(y, y)


@pytest.mark.parametrize("cudnn", [True, False], ids=["cudnn", "no_cudnn"])
def test_autocast_casts_of_a_decomposed_composite_are_recorded_with_its_pieces_in_a_disabled_region(cudnn):
    run_in_fresh_process(__name__, "_casts_recorded_with_cudnn" if cudnn else "_casts_recorded_without_cudnn")


def _region_bodies(ep):
    return {name: gm for name, gm in ep.graph_module.named_modules() if isinstance(gm, torch.fx.GraphModule) and name}


def _casts_recorded_with_cudnn():
    _casts_recorded("cudnn_grid_sampler")  # what the GPU host records: a fake kernel stands in here


def _casts_recorded_without_cudnn():
    torch.backends.cudnn.enabled = False
    _casts_recorded("grid_sampler_2d")


def _casts_recorded(piece):
    from torch._subclasses.fake_tensor import FakeTensorMode

    with torch.device("meta"):
        model = GridSampleThenMatmul()
    with FakeTensorMode(allow_non_fake_inputs=True):
        model = model.to_empty(device="cuda")
        ep = pf.export(model, (torch.randn(1, 2, 4, 4, device="cuda"), torch.rand(1, 3, 3, 2, device="cuda")))
    assert pf.verify(ep).ok  # the contract: no mutation, no grad or autocast call outside a region
    regions = [n for gm in _region_bodies(ep).values() for n in gm.graph.nodes
               if n.op == "call_function" and "pf_autocast_region" in str(n.target)]
    outer = [n for n in ep.graph.nodes if "pf_autocast_region" in str(n.target)]
    assert len(outer) == 1 and outer[0].args[:3] == ("cuda", torch.bfloat16, True)
    assert [n.args[2] for n in regions] == [False], "one nested region, autocast off"
    inner = next(gm for gm in _region_bodies(ep).values()
                 if any(piece in str(n.target) for n in gm.graph.nodes)
                 and not any("pf_autocast_region" in str(n.target) for n in gm.graph.nodes))
    sampled = next(n for n in inner.graph.nodes if piece in str(n.target))
    assert [a.meta["val"].dtype for a in sampled.args[:2]] == [torch.float32, torch.float32]
    outer_body = next(gm for gm in _region_bodies(ep).values()
                      if any("pf_autocast_region" in str(n.target) for n in gm.graph.nodes))
    casts = [n for n in outer_body.graph.nodes if "_to_copy" in str(n.target)]
    assert [n.kwargs["dtype"] for n in casts] == [torch.float32], "the bf16 activation cast up, the grid as is"
    assert any("matmul" in str(n.target) for n in outer_body.graph.nodes), "matmul's pieces need no casts: left as is"
