"""The distributed cases: each runs on every rank of a gloo group (harness.py) and returns
what its test judges. Every case compares a program with the eager distributed model on the
same rank (outputs, gradients); a refusal is returned as the error the harness records.

The models are tiny and the same on every rank (the seed is set before building them), as
torch.distributed expects of replicated initialisation.
"""

from __future__ import annotations

import copy
import operator
from typing import Any

import torch
from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe, SplitPoint, pipe_split
from torch.distributed.pipelining import pipeline as torch_pipeline

import predispatch_func as pf

# --- pipeline stages -----------------------------------------------------------------------------

N_MICROBATCHES = 4


class FourLayers(torch.nn.Module):
    """Four tanh layers; with ``marked`` a ``pipe_split()`` before the third splits it in two."""

    def __init__(self, marked: bool):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(6, 6) for _ in range(4))
        self.marked = marked

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            if i == 2 and self.marked:
                pipe_split()
            x = torch.tanh(layer(x))
        return x


class CountsRowsInAnAttribute(torch.nn.Module):
    """pytorch#188727's shape: the second stage adds each row's position in the whole batch,
    counting the rows of the micro-batches it has seen in a Python attribute."""

    def __init__(self):
        super().__init__()
        self.first = torch.nn.Linear(6, 6)
        self.second = torch.nn.Linear(6, 6)
        self.rows_seen = 0

    def forward(self, x):
        x = self.first(x)
        pipe_split()
        positions = torch.arange(self.rows_seen, self.rows_seen + x.shape[0], dtype=x.dtype)
        self.rows_seen += x.shape[0]
        return self.second(x) + positions[:, None]


class CountsRowsInABuffer(torch.nn.Module):
    """The same positions, counted in a buffer the second stage updates in place."""

    def __init__(self):
        super().__init__()
        self.first = torch.nn.Linear(6, 6)
        self.second = torch.nn.Linear(6, 6)
        self.register_buffer("rows_seen", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        x = self.first(x)
        pipe_split()
        positions = torch.arange(x.shape[0]) + self.rows_seen
        self.rows_seen += x.shape[0]
        return self.second(x) + positions[:, None]


class ScaledUnderNoGrad(torch.nn.Module):
    """The second stage divides by a scale computed under ``no_grad`` (a grad region of ours)."""

    def __init__(self, autocast: bool = False):
        super().__init__()
        self.first = torch.nn.Linear(6, 6)
        self.second = torch.nn.Linear(6, 6)
        self.autocast = autocast

    def forward(self, x):
        x = torch.tanh(self.first(x))
        pipe_split()
        with torch.no_grad():
            scale = x.abs().mean() + 1
        if self.autocast:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                x = self.second(x).float()
        else:
            x = self.second(x)
        return x / scale


def _split(model: torch.nn.Module, exporter: str, microbatch: tuple, split_spec: dict | None = None) -> Any:
    if exporter == "ours":
        return pf.distributed.pipeline(model, microbatch, split_spec=split_spec)
    return torch_pipeline(model, microbatch, split_spec=split_spec)


def _trained_by_schedule(rank: int, world_size: int, exporter: str, schedule: type, *,
                         marked: bool = True, split_spec: dict | None = None) -> dict:
    """One training step of FourLayers split in two stages, run by ``schedule``, against the
    unsplit eager model: the last stage's output and loss, and each stage's gradients."""
    torch.manual_seed(0)
    model = FourLayers(marked)
    eager = copy.deepcopy(model)
    x, target = torch.randn(8, 6), torch.randn(8, 6)
    loss_fn = torch.nn.MSELoss(reduction="sum")  # summed over micro-batches = the batch's loss
    stage = _split(model, exporter, (x.chunk(N_MICROBATCHES)[0],), split_spec).build_stage(rank, torch.device("cpu"))
    run = schedule(stage, N_MICROBATCHES, loss_fn=loss_fn, scale_grads=False)  # the batch's gradient, unscaled
    losses: list[torch.Tensor] = []
    out = run.step(x) if rank == 0 else run.step(target=target, losses=losses)
    expected = eager(x)
    expected_loss = loss_fn(expected, target)
    expected_loss.backward()
    result: dict[str, Any] = {"grads": {}}
    for name, p in stage.submod.named_parameters():
        torch.testing.assert_close(p.grad, eager.get_parameter(name).grad)
        result["grads"][name] = (p.grad - eager.get_parameter(name).grad).abs().max().item()
    if rank == world_size - 1:
        torch.testing.assert_close(out, expected)
        torch.testing.assert_close(torch.stack(losses).sum(), expected_loss)
        result["output_error"] = (out - expected).abs().max().item()
    if split_spec:
        result["model_left_as_it_was"] = all("forward" not in model.get_submodule(n).__dict__ for n in split_spec)
    return result


def pipeline_gpipe_ours(rank: int, world_size: int) -> dict:
    result = _trained_by_schedule(rank, world_size, "ours", ScheduleGPipe)
    result["contract_problems"] = pf.check_contract(pf.export(FourLayers(True), (torch.randn(2, 6),))).problems
    return result


def _region_stage_trained(rank: int, world_size: int, exporter: str, autocast: bool = False) -> dict:
    """One GPipe training step of ScaledUnderNoGrad against eager run per micro-batch (the scale is
    a micro-batch's mean): last stage's output, every stage's gradients."""
    torch.manual_seed(0)
    model = ScaledUnderNoGrad(autocast)
    eager = copy.deepcopy(model)
    x, target = torch.randn(8, 6), torch.randn(8, 6)
    loss_fn = torch.nn.MSELoss(reduction="sum")
    stage = _split(model, exporter, (x.chunk(N_MICROBATCHES)[0],)).build_stage(rank, torch.device("cpu"))
    run = ScheduleGPipe(stage, N_MICROBATCHES, loss_fn=loss_fn, scale_grads=False)
    out = run.step(x) if rank == 0 else run.step(target=target, losses=[])
    outs = [eager(chunk) for chunk in x.chunk(N_MICROBATCHES)]
    sum(loss_fn(o, t) for o, t in zip(outs, target.chunk(N_MICROBATCHES), strict=True)).backward()
    result: dict[str, Any] = {"grads": {}}
    for name, p in stage.submod.named_parameters():
        torch.testing.assert_close(p.grad, eager.get_parameter(name).grad)
        result["grads"][name] = (p.grad - eager.get_parameter(name).grad).abs().max().item()
    if rank == world_size - 1:
        torch.testing.assert_close(out, torch.cat(outs))
        result["output_error"] = (out - torch.cat(outs)).abs().max().item()
    return result


def pipeline_grad_region_ours(rank: int, world_size: int) -> dict:
    return _region_stage_trained(rank, world_size, "ours")


def pipeline_grad_region_torch_export(rank: int, world_size: int) -> dict:
    return _region_stage_trained(rank, world_size, "torch")


def pipeline_autocast_region_ours(rank: int, world_size: int) -> dict:
    return _region_stage_trained(rank, world_size, "ours", autocast=True)


def pipeline_1f1b_ours_split_spec(rank: int, world_size: int) -> dict:
    return _trained_by_schedule(rank, world_size, "ours", Schedule1F1B, marked=False,
                                split_spec={"layers.2": SplitPoint.BEGINNING})


def pipeline_gpipe_torch_export(rank: int, world_size: int) -> dict:
    return _trained_by_schedule(rank, world_size, "torch", ScheduleGPipe)


def _positions_by_stage(rank: int, world_size: int, model_class: type, exporter: str) -> dict:
    """Forward only, GPipe over 4 micro-batches of 2 rows: per row of the last stage's output,
    how far it is from the unsplit eager model's."""
    torch.manual_seed(0)
    model = model_class()
    eager = copy.deepcopy(model)
    x = torch.randn(8, 6)
    pipe = _split(model, exporter, (x.chunk(N_MICROBATCHES)[0],))
    run = ScheduleGPipe(pipe.build_stage(rank, torch.device("cpu")), N_MICROBATCHES)
    with torch.no_grad():
        out = run.step(x) if rank == 0 else run.step()
        expected = eager(x)
    if rank != world_size - 1:
        return {}
    return {"row_errors": (out - expected).abs().amax(dim=1).tolist()}


def counter_in_an_attribute_ours(rank: int, world_size: int) -> dict:
    return _positions_by_stage(rank, world_size, CountsRowsInAnAttribute, "ours")


def counter_in_an_attribute_torch_export(rank: int, world_size: int) -> dict:
    return _positions_by_stage(rank, world_size, CountsRowsInAnAttribute, "torch")


def counter_in_a_buffer_ours(rank: int, world_size: int) -> dict:
    return _positions_by_stage(rank, world_size, CountsRowsInABuffer, "ours")


def counter_in_a_buffer_torch_export(rank: int, world_size: int) -> dict:
    return _positions_by_stage(rank, world_size, CountsRowsInABuffer, "torch")


PIPELINE_CASES = [name for name in list(globals()) if name.startswith(("pipeline_", "counter_"))]

# --- DTensor and FSDP2 ---------------------------------------------------------------------------


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(8, 16)
        self.down = torch.nn.Linear(16, 8)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


class NormMLP(MLP):
    """Layer norm first: with the rows (a sequence) sharded, DTensor redistributes before ``up``."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(8)

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class MLPThenTanh(MLP):
    """tanh of a row-wise layer's partial sums needs the whole sums: DTensor all-reduces first."""

    def forward(self, x):
        return torch.tanh(super().forward(x))


def _mesh(world_size: int) -> Any:
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (world_size,))


def _placed(model: torch.nn.Module, mesh: Any) -> torch.nn.Module:
    """Tensor parallel by hand: ``up`` column-wise, ``down`` row-wise, the rest replicated
    (what ColwiseParallel/RowwiseParallel place, without their input and output hooks)."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    layout = {"up.weight": Shard(0), "up.bias": Shard(0), "down.weight": Shard(1)}
    for name, p in list(model.named_parameters()):
        owner, leaf = name.rsplit(".", 1)
        placed = distribute_tensor(p.detach(), mesh, [layout.get(name, Replicate())])
        setattr(model.get_submodule(owner), leaf, torch.nn.Parameter(placed))
    return model


def _dtensor_program(rank: int, world_size: int, model_class: type, input_placement: str, exporter: str) -> dict:
    """The program of a model with DTensor parameters, run on a DTensor input on every rank,
    against the eager model: output (placements, local shard, whole tensor), and the gradients
    of a loss on the whole output with respect to every parameter and the input."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = _mesh(world_size)
    torch.manual_seed(0)
    model = _placed(model_class(), mesh)
    eager = copy.deepcopy(model)
    placement = Shard(0) if input_placement == "rows" else Replicate()
    x = distribute_tensor(torch.randn(4, 8), mesh, [placement]).requires_grad_()
    ep = pf.export(model, (x,)) if exporter == "ours" else torch.export.export(model, (x,))
    program = ep.module()
    out, expected = program(x), eager(x)
    assert out.placements == expected.placements, (out.placements, expected.placements)
    torch.testing.assert_close(out.to_local(), expected.to_local())
    torch.testing.assert_close(out.full_tensor(), expected.full_tensor())
    grads = torch.autograd.grad((out.full_tensor() ** 2).sum(), [x, *program.parameters()])
    expected_grads = torch.autograd.grad((expected.full_tensor() ** 2).sum(), [x, *eager.parameters()])
    errors = {}
    names = ["input", *(n for n, _ in program.named_parameters())]
    assert names[1:] == [n for n, _ in eager.named_parameters()]
    for name, got, want in zip(names, grads, expected_grads, strict=True):
        assert got.placements == want.placements, (name, got.placements, want.placements)
        torch.testing.assert_close(got.full_tensor(), want.full_tensor())
        errors[name] = (got.full_tensor() - want.full_tensor()).abs().max().item()
    targets = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    return {"grad_errors": errors, "output_error": (out.full_tensor() - expected.full_tensor()).abs().max().item(),
            "contract_problems": pf.check_contract(ep).problems if exporter == "ours" else None,
            "dtensor_placeholders": sum(type(n.meta.get("val")).__name__ == "DTensor"
                                        for n in ep.graph.nodes if n.op == "placeholder"),
            "collective_nodes": sorted(t for t in targets if "c10d" in t)}


def dtensor_mlp_ours(rank: int, world_size: int) -> dict:
    return _dtensor_program(rank, world_size, MLP, "replicated", "ours")


def dtensor_norm_mlp_sharded_rows_ours(rank: int, world_size: int) -> dict:
    return _dtensor_program(rank, world_size, NormMLP, "rows", "ours")


def dtensor_mlp_torch_export(rank: int, world_size: int) -> dict:
    return _dtensor_program(rank, world_size, MLP, "replicated", "torch")


def dtensor_norm_mlp_sharded_rows_torch_export(rank: int, world_size: int) -> dict:
    return _dtensor_program(rank, world_size, NormMLP, "rows", "torch")


def dtensor_mlp_joint_ours(rank: int, world_size: int) -> dict:
    """One training step (forward, loss, backward) of the DTensor MLP as one program
    (pf.export_joint), run on every rank, against eager's loss and gradients (placements too)."""
    from torch.distributed.tensor import Replicate, distribute_tensor

    mesh = _mesh(world_size)
    torch.manual_seed(0)
    model = _placed(MLP(), mesh)
    eager = copy.deepcopy(model)
    x = distribute_tensor(torch.randn(4, 8), mesh, [Replicate()])

    def loss_fn(out):
        return (out * out).sum()

    jep = pf.export_joint(model, (x,), loss_fn=loss_fn)
    program = jep.module()
    loss = program(x)[0]
    expected = loss_fn(eager(x))
    expected.backward()
    assert loss.placements == expected.placements
    torch.testing.assert_close(loss.full_tensor(), expected.full_tensor().detach())
    errors = {}
    for (name, p), (eager_name, q) in zip(program.named_parameters(), eager.named_parameters(), strict=True):
        assert name == eager_name and p.grad.placements == q.grad.placements, (name, p.grad.placements)
        torch.testing.assert_close(p.grad.full_tensor(), q.grad.full_tensor())
        errors[name] = (p.grad.full_tensor() - q.grad.full_tensor()).abs().max().item()
    return {"grad_errors": errors, "contract_problems": pf.check_contract(jep).problems}


def _local_program(rank: int, world_size: int, model_class: type, input_placement: str) -> dict:
    """This rank's program over local shards (pf.distributed.export_local) against the eager
    DTensor model's local output; its collectives, and the layouts it records."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = _mesh(world_size)
    torch.manual_seed(0)
    model = _placed(model_class(), mesh)
    x = distribute_tensor(torch.randn(4, 8), mesh, [Shard(0) if input_placement == "rows" else Replicate()])
    ep = pf.distributed.export_local(model, (x,))
    program = ep.module()
    out, expected = program(x.to_local()), model(x)
    torch.testing.assert_close(out, expected.to_local())
    layouts = {n.name: n.meta["shard_layout"] for n in ep.graph.nodes if n.op == "placeholder"}
    for spec in ep.graph_signature.input_specs:
        like = x if spec.target is None else model.get_parameter(spec.target)
        assert layouts[spec.arg.name].placements == tuple(like.placements), spec
        assert layouts[spec.arg.name].global_shape == tuple(like.shape), spec
    (out_layout,) = ep.graph.output_node().meta["shard_layouts"]
    assert out_layout.placements == tuple(expected.placements)
    for name, p in program.named_parameters():
        assert torch.equal(p, model.get_parameter(name).to_local()), name
    targets = [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]
    # an inference program: autograd of the local ops is not DTensor's backward
    assert not any(p.requires_grad for p in program.parameters())
    return {"output_error": (out - expected.to_local()).abs().max().item(),
            "contract_problems": pf.check_contract(ep).problems,
            "collective_nodes": sorted(t for t in targets if "c10d" in t)}


def local_mlp_ours(rank: int, world_size: int) -> dict:
    return _local_program(rank, world_size, MLP, "replicated")


def local_mlp_then_tanh_ours(rank: int, world_size: int) -> dict:
    return _local_program(rank, world_size, MLPThenTanh, "replicated")


def local_norm_mlp_sharded_rows_ours(rank: int, world_size: int) -> dict:
    return _local_program(rank, world_size, NormMLP, "rows")


def dtensor_norm_mlp_torch_export_run_decompositions(rank: int, world_size: int) -> dict:
    """torch.export's way to a program below DTensor: ``run_decompositions()`` of its program over
    DTensors (which unwraps tensor subclasses)."""
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = _mesh(world_size)
    torch.manual_seed(0)
    model = _placed(NormMLP(), mesh)
    x = distribute_tensor(torch.randn(4, 8), mesh, [Shard(0)])
    ep = torch.export.export(model, (x,)).run_decompositions()
    expected = model(x).to_local()
    try:
        out = ep.module()(x).to_local()
        takes = "DTensor"
    except AssertionError:  # torch 2.11: the subclass is unwrapped, the program takes the local shard
        out = ep.module()(x.to_local())
        takes = "local shard"
    targets = [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]
    return {"takes": takes, "output_error": (out - expected).abs().max().item(),
            "collective_nodes": sorted(t for t in targets if "c10d" in t)}


def _parallelized(world_size: int, sequence_parallel: bool) -> torch.nn.Module:
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel, parallelize_module

    torch.manual_seed(0)
    if not sequence_parallel:
        return parallelize_module(MLP(), _mesh(world_size), {"up": ColwiseParallel(), "down": RowwiseParallel()})
    plan = {"norm": SequenceParallel(sequence_dim=0), "up": ColwiseParallel(input_layouts=Shard(0)),
            "down": RowwiseParallel(output_layouts=Shard(0))}
    return parallelize_module(NormMLP(), _mesh(world_size), plan)


def _hooked_program(build: Any, x: torch.Tensor, exporter: str) -> dict:
    """Export a model whose hooks turn plain tensors into DTensors and back; compare on a plain input
    with the same model built again (FSDP2 refuses deepcopy)."""
    model, eager = build(), build()
    ep = pf.export(model, (x,)) if exporter == "ours" else torch.export.export(model, (x,))
    out, expected = ep.module()(x), eager(x)
    torch.testing.assert_close(out, expected)
    return {"output_error": (out - expected).abs().max().item()}


def parallelize_module_tp_ours(rank: int, world_size: int) -> dict:
    return _hooked_program(lambda: _parallelized(world_size, False), torch.randn(4, 8), "ours")


def parallelize_module_tp_torch_export(rank: int, world_size: int) -> dict:
    return _hooked_program(lambda: _parallelized(world_size, False), torch.randn(4, 8), "torch")


def parallelize_module_sp_ours(rank: int, world_size: int) -> dict:
    return _hooked_program(lambda: _parallelized(world_size, True), torch.randn(2, 8), "ours")


def parallelize_module_sp_torch_export(rank: int, world_size: int) -> dict:
    return _hooked_program(lambda: _parallelized(world_size, True), torch.randn(2, 8), "torch")


def _local_parallelized(rank: int, world_size: int, sequence_parallel: bool) -> dict:
    """export_local of a parallelize_module'd model (its hooks step between tensors and DTensors)
    on a plain input, against the eager model."""
    model = _parallelized(world_size, sequence_parallel)
    x = torch.randn(2 if sequence_parallel else 4, 8)
    ep = pf.distributed.export_local(model, (x,))
    out, expected = ep.module()(x), model(x)
    torch.testing.assert_close(out, expected)
    targets = [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]
    return {"output_error": (out - expected).abs().max().item(), "contract_problems": pf.check_contract(ep).problems,
            "collective_nodes": sorted(t for t in targets if "c10d" in t)}


def local_parallelize_module_tp_ours(rank: int, world_size: int) -> dict:
    return _local_parallelized(rank, world_size, False)


def local_parallelize_module_sp_ours(rank: int, world_size: int) -> dict:
    return _local_parallelized(rank, world_size, True)


# --- FSDP2 ----------------------------------------------------------------------------------------


class Block(torch.nn.Module):
    """A pre-norm transformer block: causal attention then an MLP, each with a residual."""

    def __init__(self, dim: int = 6, hidden: int = 10):
        super().__init__()
        self.norm1, self.norm2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.qkv, self.proj = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)
        self.up, self.down = torch.nn.Linear(dim, hidden), torch.nn.Linear(hidden, dim)

    def forward(self, x):
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        x = x + self.proj(torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm2(x))))


class TwoBlocks(torch.nn.Module):
    """Two blocks, a final norm and a head of 3 rows (uneven shards on 2 ranks: 2 and 1)."""

    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block() for _ in range(2))
        self.norm = torch.nn.LayerNorm(6)
        self.head = torch.nn.Linear(6, 3)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


class FailsWhenAsked(MLP):
    """An MLP whose forward raises while ``fail`` is set: an export that fails mid-trace."""

    fail = False

    def forward(self, x):
        if self.fail:
            raise RuntimeError("asked to fail")
        return super().forward(x)


def _fully_sharded(model_class: type = MLP, **policies: Any) -> torch.nn.Module:
    """``model_class`` built the same on every rank, ``fully_shard``'ed per block (the MLP's ``up``)
    and at the root."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = model_class()
    for unit in (model.blocks if isinstance(model, TwoBlocks) else [model.up]):
        fully_shard(unit, **policies)
    fully_shard(model, **policies)
    return model


def _forward_hooks(model: torch.nn.Module) -> list:
    """Every module's forward hook dicts, in order: what exporting must leave as it was."""
    names = ("_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_forward_hooks",
             "_forward_hooks_with_kwargs", "_forward_hooks_always_called")
    return [(name, [(k, id(v)) for k, v in getattr(m, name).items()]) for m in model.modules() for name in names]


def _collectives(gm: torch.fx.GraphModule, *, nested: bool) -> dict[str, int]:
    from predispatch_func.graphs import all_graph_modules

    graphs = [g for _, g in all_graph_modules(gm)] if nested else [gm]
    counts: dict[str, int] = {}
    for g in graphs:
        for node in g.graph.nodes:
            if node.op == "call_function" and "c10d" in str(node.target):
                counts[str(node.target)] = counts.get(str(node.target), 0) + 1
    return counts


def _fully_sharded_program(rank: int, model_class: type, shape: tuple[int, ...], eager_first: bool) -> dict:
    """FSDP2 through export_local and export_local_joint on this rank's own batch, against the same
    eager FSDP2 model run after the exports (so its hooks must be back): output, the program's
    parameters (this rank's shards), the gradients of the local shards (eager's ``.grad`` is the
    reduce-scattered shard) through ``ep.module()`` with autograd and through the joint program.
    With ``eager_first`` the model runs a forward first: FSDP2 keeps the root's weights unsharded
    until the backward, and the export still reads the shards."""
    model = _fully_sharded(model_class)
    torch.manual_seed(1 + rank)  # data parallel: each rank its own batch
    x = torch.randn(*shape)
    hooks = _forward_hooks(model)
    shards = {name: p.to_local().clone() for name, p in model.named_parameters()}
    expected = model(x) if eager_first else None
    ep = pf.distributed.export_local(model, (x,))
    jep = pf.distributed.export_local_joint(model, (x,), loss_fn=lambda out: (out * out).sum())
    assert _forward_hooks(model) == hooks, "exporting changed the model's forward hooks"
    expected = model(x) if expected is None else expected
    program = ep.module()
    out = program(x)
    torch.testing.assert_close(out, expected)
    (out * out).sum().backward()
    (expected * expected).sum().backward()
    eager_grads = {name: p.grad.to_local() for name, p in model.named_parameters()}
    assert [n for n, _ in program.named_parameters()] == list(eager_grads)
    grad_errors = {}
    for name, p in program.named_parameters():
        assert p.shape == eager_grads[name].shape, (name, p.shape)  # a local shard, not the whole weight
        assert torch.equal(p, shards[name]), name
        torch.testing.assert_close(p.grad, eager_grads[name])
        grad_errors[name] = (p.grad - eager_grads[name]).abs().max().item()
    joint = jep.module()
    loss = joint(x)[0]
    torch.testing.assert_close(loss, (expected * expected).sum().detach())
    joint_grad_errors = {}
    for name, p in joint.named_parameters():
        torch.testing.assert_close(p.grad, eager_grads[name])
        joint_grad_errors[name] = (p.grad - eager_grads[name]).abs().max().item()
    for spec in ep.graph_signature.input_specs:
        layout = next(n for n in ep.graph.nodes if n.name == spec.arg.name).meta["shard_layout"]
        if spec.target is not None:
            assert layout.placements == tuple(model.get_parameter(spec.target).placements), spec
            assert layout.global_shape == tuple(model.get_parameter(spec.target).shape), spec
        else:
            assert layout is None
    return {"output_error": (out - expected).abs().max().item(), "grad_errors": grad_errors,
            "ops_before_gather": _ops_before_each_gather(ep),
            # what the signature takes: the shards and the batch, no whole weight lifted as a constant
            "input_kinds": sorted({s.kind.name for p in (ep, jep) for s in p.graph_signature.input_specs}),
            "state_shapes": {name: tuple(t.shape) for name, t in ep.state_dict.items()},
            "shard_shapes": {name: tuple(t.shape) for name, t in shards.items()},
            "joint_grad_errors": joint_grad_errors,
            "contract_problems": pf.check_contract(ep).problems + pf.check_contract(jep).problems,
            "n_parameters": len(grad_errors),
            "collectives": _collectives(ep.graph_module, nested=True),
            "joint_collectives": _collectives(jep.graph_module, nested=False)}


def _ops_before_each_gather(ep: Any) -> dict[str, int]:
    """Per parameter, how many ops (other than gathers) the forward program runs before gathering it."""
    placeholder_targets = {s.arg.name: s.target for s in ep.graph_signature.input_specs}
    ops, before = 0, {}
    for node in ep.graph.nodes:
        if node.op != "call_function" or node.target is operator.getitem:
            continue
        if "_GatheredShards" in node.args:
            before[placeholder_targets[node.args[-1].name]] = ops
        else:
            ops += 1
    return before


def fsdp2_mlp_local_ours(rank: int, world_size: int) -> dict:
    return _fully_sharded_program(rank, MLP, (4, 8), eager_first=True)


def fsdp2_two_blocks_local_ours(rank: int, world_size: int) -> dict:
    return _fully_sharded_program(rank, TwoBlocks, (2, 4, 6), eager_first=False)


def fsdp2_ours(rank: int, world_size: int) -> dict:
    return _hooked_program(_fully_sharded, torch.randn(4, 8), "ours")


def fsdp2_torch_export(rank: int, world_size: int) -> dict:
    return _hooked_program(_fully_sharded, torch.randn(4, 8), "torch")


def fsdp2_mixed_precision_local_ours(rank: int, world_size: int) -> dict:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    model = _fully_sharded(mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16))
    return pf.distributed.export_local(model, (torch.randn(4, 8),))


def fsdp2_failed_export_leaves_the_model(rank: int, world_size: int) -> dict:
    """An export that fails inside forward gives FSDP2's hooks back: the eager model still runs
    (its hooks all-gather the shards) and its hook dicts are as before."""
    model = _fully_sharded(FailsWhenAsked)
    hooks = _forward_hooks(model)
    model.fail = True
    try:
        pf.distributed.export_local(model, (torch.randn(4, 8),))
    except Exception as err:  # noqa: BLE001 -- the failure is the point
        failure = f"{type(err).__name__}: {err}"
    else:
        failure = None
    model.fail = False
    out = model(torch.randn(4, 8))
    return {"failure": failure, "hooks_as_before": _forward_hooks(model) == hooks, "eager_output_shape": tuple(out.shape)}


DTENSOR_CASES = [name for name in list(globals())
                 if name.startswith(("dtensor_", "local_", "parallelize_module_", "fsdp2_"))]
