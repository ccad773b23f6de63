"""What pf.distributed and the DTensor refusal assume of torch's DTensor, pinned on one rank
in this process (gloo, world size 1): the multi-rank behaviour is tests/distributed's."""

import pytest
import torch

from predispatch_func import _torch_compat as tc

pytestmark = pytest.mark.skipif(not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
                                reason="this torch build has no torch.distributed with gloo")


@pytest.fixture
def mesh():
    from torch.distributed.device_mesh import init_device_mesh

    torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        torch.distributed.destroy_process_group()


def test_the_local_shard_and_a_dtensor_around_it(mesh):
    from torch.distributed.tensor import Shard, distribute_tensor

    d = distribute_tensor(torch.randn(4, 3), mesh, [Shard(0)])
    local = tc.dtensor_local_shard(d)
    assert type(local) is torch.Tensor and local.untyped_storage().data_ptr() == d.to_local().untyped_storage().data_ptr()
    again = tc.dtensor_around(local * 2, d)
    assert again.placements == d.placements and again.shape == d.shape and again.device_mesh is d.device_mesh
    torch.testing.assert_close(again.to_local(), local * 2)


def test_dtensors_own_functions_are_the_ones_refused_in_forward():
    """trace/extensions/function_trace.py tells DTensor's Functions by their module."""
    from torch.distributed.tensor._api import _FromTorchTensor, _ToTorchTensor
    from torch.distributed.tensor._redistribute import Redistribute

    from predispatch_func.trace.extensions.function_trace import _steps_between_dtensor_and_shard

    assert all(_steps_between_dtensor_and_shard(cls) for cls in (_FromTorchTensor, _ToTorchTensor, Redistribute))
    assert not _steps_between_dtensor_and_shard(torch.autograd.Function)


class TwoLayers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(3, 4)
        self.down = torch.nn.Linear(4, 3)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def test_export_local_on_one_rank_keeps_names_shards_and_layouts(mesh):
    """The whole path on one rank (the cheap leg of every CI torch): names, shards, layouts."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    import predispatch_func as pf

    model = parallelize_module(TwoLayers(), mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    x = torch.randn(2, 3)
    ep = pf.distributed.export_local(model, (x,))
    assert pf.check_contract(ep).ok
    torch.testing.assert_close(ep.module()(x), model(x))
    assert sorted(ep.state_dict) == sorted(n for n, _ in model.named_parameters())
    layouts = {s.target: ep.graph.find_nodes(op="placeholder", target=s.arg.name)[0].meta["shard_layout"]
               for s in ep.graph_signature.input_specs}
    assert layouts["up.weight"].placements == (Shard(0),) and layouts["down.bias"].placements == (Replicate(),)
    assert layouts[None] is None  # the plain input: the hooks make it a DTensor inside
    with pytest.raises(pf.UnsupportedError) as err:
        pf.export(model, (x,))
    assert err.value.kind is pf.Refusal.DTENSOR_BOUNDARY_IN_FORWARD and "export_local" in str(err.value)
