"""FSDP2 programs: what a ``fully_shard``'ed model computes on one rank, from what the rank holds.

FSDP2 keeps each parameter as this rank's shard (a DTensor, ``Shard(0)`` on a 1-D mesh). Before
a unit's forward its hooks all-gather the shards into storages they resize and swap in as the
module's parameters; after the backward they reduce-scatter the gradients, averaged over the
ranks, into each shard's ``.grad``. A trace cannot follow those hooks (they read data pointers
and resize storages), so the program here does not trace them. It computes the same thing in
the form SimpleFSDP and torchtitan's graph-based FSDP use:

* its parameters are the local shards, plain tensors under the model's parameter names;
* each unit's shards are all-gathered as the unit's forward starts, where FSDP2's pre-hook
  unshards (``all_gather_into_tensor`` plus ``wait_tensor``, the padding FSDP2 adds to uneven
  shards cut off), and the plain modules' ``forward`` runs on the gathered weights, FSDP2's
  hooks suspended for the trace;
* the gather is an autograd Function whose backward reduce-scatters the gradient (``avg``,
  as FSDP2's default), so the program keeps it as its own backward: gradients through
  ``ep.module()`` are eager FSDP2's ``.grad`` shards, and a joint program has the
  reduce-scatter as a node.

What changes the computation and is not modelled here is refused by kind
(``FULLY_SHARDED_MODULE``): mixed precision policies, CPU offload, shards placed other than
``Shard(0)`` on a 1-D mesh (HSDP, ``shard_placement_fn``), and settings that change the gradients
(``set_requires_gradient_sync(False)``, ``set_gradient_divide_factor``, ``set_all_reduce_hook``).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator
from typing import Any

import torch

from . import _torch_compat as tc
from .errors import Refusal, UnsupportedError


class _GatheredShards(torch.autograd.Function):
    """The whole weight from every rank's shard along dim 0 (padded to equal blocks for the
    collective, then cut to ``rows``); backward: the gradient's block of this rank, averaged
    over the ranks by a reduce-scatter."""

    @staticmethod
    def forward(ctx: Any, local: torch.Tensor, rows: int, world_size: int, group_name: str) -> torch.Tensor:
        block = -(-rows // world_size)
        ctx.rows, ctx.local_rows, ctx.world_size, ctx.group_name = rows, local.shape[0], world_size, group_name
        gathered = tc.functional_all_gather(_padded(local, block), world_size, group_name)
        return gathered if block * world_size == rows else gathered.narrow(0, 0, rows)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        block = -(-ctx.rows // ctx.world_size)
        local_grad = tc.functional_reduce_scatter(_padded(grad, block * ctx.world_size), "avg", ctx.world_size,
                                                  ctx.group_name)
        return (local_grad if ctx.local_rows == block else local_grad.narrow(0, 0, ctx.local_rows)), None, None, None


def _padded(t: torch.Tensor, rows: int) -> torch.Tensor:
    """``t`` with zero rows appended up to ``rows`` (FSDP2 pads uneven shards the same way)."""
    missing = rows - t.shape[0]
    if missing == 0:
        return t
    return torch.cat([t, t.new_zeros((missing, *t.shape[1:]))])


def is_fully_sharded(model: torch.nn.Module) -> bool:
    return bool(tc.fsdp_units(model))


def sharded_parameters(model: torch.nn.Module) -> dict[tuple[int, str], Any]:
    """The DTensor shard FSDP2 keeps for each parameter it manages, by ``(id(owning module), name)``
    (what is registered there between forwards; after ``unshard()`` or a forward that keeps the
    unsharded weights, the shard still holds the parameter's value). Refuses a policy or layout
    the program would not compute as eager does."""
    sharded: dict[tuple[int, str], Any] = {}
    for unit in tc.fsdp_units(model):
        name = _name_of(model, unit.module)
        policy = unit.mixed_precision
        if any(getattr(policy, f, None) is not None for f in ("param_dtype", "reduce_dtype", "output_dtype")):
            _refuse(f"{name} is fully_shard'ed with a mixed precision policy ({policy}): the program computes in "
                    "the parameters' own dtype; export it with the default MixedPrecisionPolicy()")
        if unit.offloads_to_cpu:
            _refuse(f"{name} is fully_shard'ed with CPUOffloadPolicy: the program does not move shards between "
                    "devices; export it with the default OffloadPolicy()")
        if unit.gradient_settings:
            _refuse(f"{name} has {', '.join(unit.gradient_settings)} in effect: the program's gradients are the "
                    "local shards' reduce-scattered average over the ranks, FSDP2's default; export it with the "
                    "defaults")
        for owner, leaf, param in unit.sharded:
            placements = tuple(param.placements)
            if param.device_mesh.ndim != 1 or len(placements) != 1 or not placements[0].is_shard(0):
                _refuse(f"{name}'s parameter {leaf} is sharded as {placements} on a {param.device_mesh.ndim}-D mesh: "
                        "the program all-gathers Shard(0) on a 1-D mesh only (no HSDP, no shard_placement_fn)")
            sharded[(id(owner), leaf)] = param
    return sharded


def _name_of(model: torch.nn.Module, module: torch.nn.Module) -> str:
    return next((f"module {n!r}" if n else "the model" for n, m in model.named_modules() if m is module), "a module")


def _refuse(message: str) -> None:
    raise UnsupportedError(message, kind=Refusal.FULLY_SHARDED_MODULE)


class ShardsView(torch.nn.Module):
    """``model`` with its state as this rank's tensors under the same names: each FSDP2 shard's
    local tensor as a parameter (requiring grad as the shard does), the rest as they are.
    ``forward`` runs ``model`` with FSDP2's hooks off and each unit's shards gathered as it starts."""

    model: torch.nn.Module

    def __init__(self, model: torch.nn.Module, sharded: dict[tuple[int, str], Any]):
        super().__init__()
        self.layouts: dict[str, Any] = {}  # name -> the DTensor parameter it is this rank's shard of
        for name, t in itertools.chain(model.named_parameters(), model.named_buffers()):
            *path, leaf = name.split(".")
            module = model.get_submodule(".".join(path))
            owner: torch.nn.Module = self
            for part in path:
                if part not in dict(owner.named_children()):
                    owner.add_module(part, torch.nn.Module())
                owner = owner.get_submodule(part)
            shard = sharded.get((id(module), leaf))
            if shard is not None:
                self.layouts[name] = shard
                owner.register_parameter(leaf, torch.nn.Parameter(tc.dtensor_local_shard(shard).detach(),
                                                                  requires_grad=shard.requires_grad))
            elif isinstance(t, torch.nn.Parameter):
                owner.register_parameter(leaf, t)
            else:
                persistent = leaf not in tc.non_persistent_buffer_names(module)
                owner.register_buffer(leaf, t, persistent=persistent)
        object.__setattr__(self, "model", model)  # not a submodule: its DTensors are no state of ours

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        # FSDP2's own shards stay in place until their unit runs, as in eager: a read outside the unit's
        # forward meets the DTensor shard and fails as eager's does, never a silently different weight
        state = {name: self.layouts.get(name, value) for name, value in self._state()}
        with tc.fsdp_forward_hooks_suspended(self.model), self._gathered_as_each_unit_runs():
            return torch.func.functional_call(self.model, state, args, kwargs)

    def _state(self) -> list[tuple[str, Any]]:
        """Our tensors by name (while tracing, the lifted stand-ins)."""
        state = []
        for name, _ in itertools.chain(self.named_parameters(), self.named_buffers()):
            owner, _, leaf = name.rpartition(".")
            state.append((name, getattr(self.get_submodule(owner), leaf)))
        return state

    @contextlib.contextmanager
    def _gathered_as_each_unit_runs(self) -> Iterator[None]:
        """Before each ``fully_shard``'ed module's forward (where FSDP2's pre-hook unshards), its
        parameters become the whole weights gathered from our shards, as FSDP2 swaps them in; the
        call of ``functional_call`` gives the originals back after."""
        ours = dict(self._state())
        names = {(id(module), leaf): name for name, module, leaf in self._owners()}
        handles = []

        def gather(unit: tc.FsdpUnit) -> Callable[..., None]:
            def pre_hook(module: torch.nn.Module, args: Any) -> None:
                for owner, leaf, shard in unit.sharded:
                    if tc.module_parameters(owner).get(leaf) is not shard:
                        continue  # gathered already: a module called twice, or one of a group's modules
                    group = shard.device_mesh.get_group()
                    local = ours[names[(id(owner), leaf)]]
                    whole = _GatheredShards.apply(local, shard.shape[0], group.size(), group.group_name)
                    tc.module_parameters(owner)[leaf] = whole
            return pre_hook

        try:
            for unit in tc.fsdp_units(self.model):
                handles.append(unit.module.register_forward_pre_hook(gather(unit), prepend=True))
            yield
        finally:
            for handle in handles:
                handle.remove()

    def _owners(self) -> Iterator[tuple[str, torch.nn.Module, str]]:
        """``(our name, the model's module owning it, its local name)`` for each FSDP2 shard."""
        for name in self.layouts:
            owner, _, leaf = name.rpartition(".")
            yield name, self.model.get_submodule(owner), leaf
