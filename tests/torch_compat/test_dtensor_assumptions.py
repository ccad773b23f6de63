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


# --- FSDP2 (fully_sharded.py): what it reads of fully_shard's state ------------------------------


def _fully_sharded_two_layers(mesh, **policies):
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = TwoLayers()
    fully_shard(model.up, mesh=mesh, **policies)
    fully_shard(model, mesh=mesh, **policies)
    return model


def _forward_hook_dicts(model):
    names = ("_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_forward_hooks", "_forward_hooks_always_called")
    return [(name, list(getattr(m, name).items())) for m in model.modules() for name in names]


def test_fsdp_units_are_each_fully_shard_call_with_its_dtensor_shards(mesh):
    from torch.distributed.tensor import DTensor, Shard

    model = _fully_sharded_two_layers(mesh)
    units = tc.fsdp_units(model)
    assert [u.module for u in units] == [model, model.up]  # model.modules() order
    sharded = {(owner, leaf): p for u in units for owner, leaf, p in u.sharded}
    assert set(sharded) == {(model.up, "weight"), (model.up, "bias"), (model.down, "weight"), (model.down, "bias")}
    for (owner, leaf), p in sharded.items():
        assert owner._parameters[leaf] is p and isinstance(p, DTensor) and p.placements == (Shard(0),)
    assert all(not u.offloads_to_cpu and u.mixed_precision.param_dtype is None for u in units)


def test_fsdp_units_see_a_mixed_precision_policy(mesh):
    from torch.distributed.fsdp import MixedPrecisionPolicy

    model = _fully_sharded_two_layers(mesh, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16))
    assert all(u.mixed_precision.param_dtype is torch.bfloat16 for u in tc.fsdp_units(model))


def test_fsdp_units_see_the_settings_that_change_gradients(mesh):
    import predispatch_func as pf

    model = _fully_sharded_two_layers(mesh)
    assert all(u.gradient_settings == () for u in tc.fsdp_units(model))
    model.set_requires_gradient_sync(False)
    model.up.set_gradient_divide_factor(3.0)
    settings = {u.module: u.gradient_settings for u in tc.fsdp_units(model)}
    assert settings == {model: ("set_requires_gradient_sync(False)",),
                        model.up: ("set_requires_gradient_sync(False)", "set_gradient_divide_factor(3.0)")}
    with pytest.raises(pf.UnsupportedError) as err:
        pf.distributed.export_local(model, (torch.randn(2, 3),))
    assert err.value.kind is pf.Refusal.FULLY_SHARDED_MODULE and "set_requires_gradient_sync(False)" in str(err.value)


def test_fsdp_forward_hooks_suspended_skips_them_and_restores_them_in_order(mesh):
    """While suspended, a call runs the plain module on the weights given to it (FSDP2's pre-hook
    would all-gather and swap in its own); after, even when the body raised, every hook dict
    holds what it held, in the same order, and FSDP2's forward runs again."""
    model = _fully_sharded_two_layers(mesh)
    before = _forward_hook_dicts(model)
    assert tc.fsdp_forward_hook_handles(model.up) and tc.fsdp_forward_hook_handles(model)
    whole = {name: p.full_tensor() for name, p in model.named_parameters()}
    x = torch.randn(2, 3)
    with pytest.raises(RuntimeError, match="inside"), tc.fsdp_forward_hooks_suspended(model):
        assert all(h.id not in model._forward_pre_hooks for h in tc.fsdp_forward_hook_handles(model))
        out = torch.func.functional_call(model, whole, (x,))
        raise RuntimeError("inside")
    assert _forward_hook_dicts(model) == before
    torch.testing.assert_close(model(x), out)


def test_export_local_of_a_fully_sharded_model_on_one_rank(mesh):
    """The whole FSDP2 path on one rank (the cheap leg of every CI torch): shards as parameters,
    the gather in the graph, eager's output and gradients; pf.export refuses and names it."""
    import predispatch_func as pf

    model = _fully_sharded_two_layers(mesh)
    x = torch.randn(2, 3)
    ep = pf.distributed.export_local(model, (x,))
    assert pf.check_contract(ep).ok
    _equals_fully_sharded_model(ep, model, x)
    with pytest.raises(pf.UnsupportedError) as err:
        pf.export(model, (x,))
    assert err.value.kind is pf.Refusal.FULLY_SHARDED_MODULE and "export_local" in str(err.value)
    with pytest.raises(pf.InputError, match="fully_shard"):
        pf.distributed.export_local_joint(TwoLayers(), (x,))


def _equals_fully_sharded_model(ep, model, x):
    """The program's output and shard gradients equal the FSDP2 model's, on this rank."""
    program = ep.module()
    out, expected = program(x), model(x)
    torch.testing.assert_close(out, expected)
    out.sum().backward()
    expected.sum().backward()
    for name, p in program.named_parameters():
        torch.testing.assert_close(p.grad, model.get_parameter(name).grad.to_local())


class SquareTwice(torch.nn.Module):
    """``twice`` runs two times per forward (its unit is gathered once); ``a`` and ``b`` share
    one ``fully_shard`` call (FSDP2 registers grouped hooks, one handle for all)."""

    def __init__(self):
        super().__init__()
        self.twice, self.a, self.b = torch.nn.Linear(3, 3), torch.nn.Linear(3, 5), torch.nn.Linear(5, 3)

    def forward(self, x):
        return self.b(torch.tanh(self.a(self.twice(self.twice(x)))))


def test_export_local_of_grouped_and_reused_fully_sharded_modules(mesh):
    from torch.distributed.fsdp import fully_shard

    import predispatch_func as pf

    torch.manual_seed(0)
    model = SquareTwice()
    fully_shard(model.twice, mesh=mesh)
    fully_shard([model.a, model.b], mesh=mesh)
    fully_shard(model, mesh=mesh)
    before = _forward_hook_dicts(model)
    x = torch.randn(2, 3)
    ep = pf.distributed.export_local(model, (x,))
    assert _forward_hook_dicts(model) == before
    gathers = [n for n in ep.graph.nodes if n.op == "call_function" and "_GatheredShards" in n.args]
    assert len(gathers) == 6  # one per parameter, though twice runs twice
    _equals_fully_sharded_model(ep, model, x)
