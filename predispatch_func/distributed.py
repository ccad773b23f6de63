"""Programs for torch.distributed's runtime: we export, torch.distributed runs.

We build no distributed runtime of our own. What exports today (docs/distributed.md):

* Pipeline stages: :func:`pipeline` is ``torch.distributed.pipelining.pipeline``
  with our exporter in place of ``torch.export.export``. torch splits our
  program at its ``pipe_split()`` markers (or the ``split_spec``), and
  ``pipe.build_stage(rank, device)`` hands each stage to torch's schedules
  (``ScheduleGPipe``, ``Schedule1F1B``, ...), as with torch's own trace::

      pipe = pf.distributed.pipeline(model, (x.chunk(n_microbatches)[0],))
      stage = pipe.build_stage(rank, torch.device("cpu"))
      ScheduleGPipe(stage, n_microbatches, loss_fn=loss_fn).step(...)

  A stage whose ``forward`` counts micro-batches in a Python attribute (the shape
  of pytorch#188727, where torch's stage replays the first micro-batch's offset for
  every split) is refused here (``PYTHON_STATE_CHANGED``); a counter kept in a
  buffer is carried as a buffer write and each micro-batch sees its own offset.
* DTensor programs: ``pf.export`` of a model whose parameters and inputs are
  DTensors (placed with ``distribute_tensor``) is a program over DTensors: its
  placeholders are DTensors, the lifted parameters in ``ep.state_dict`` keep their
  mesh and placements, and DTensor's dispatch issues the collectives when
  ``ep.module()`` runs on every rank.
* One rank's program over local shards: :func:`export_local` traces the same model
  below DTensor's dispatch, so the program takes plain tensors (each rank's shards)
  and its collectives are ``_c10d_functional`` nodes plus ``wait_tensor``; each
  placeholder's and output's :class:`ShardLayout` is in the node's metadata.
* FSDP2 programs: :func:`export_local` of a ``fully_shard``'ed model takes each rank's local
  shards as its parameters and all-gathers them in the graph (``fully_sharded.py``); the
  gather's backward reduce-scatters, so ``ep.module()``'s gradients are FSDP2's, and
  :func:`export_local_joint` gives the training step with the reduce-scatters as nodes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.export.graph_signature import InputKind, OutputKind

from . import _torch_compat as tc
from . import fully_sharded
from .errors import Refusal, UnsupportedError
from .export import export
from .graphs import all_graph_modules
from .inputs.input_check import InputError
from .interop import inline_regions
from .joint import export_joint
from .regions.ops import pf_grad_region
from .trace.extensions.function_trace import dtensor_steps_inline

SHARD_LAYOUT = "shard_layout"  # node.meta key: a placeholder's ShardLayout (None: not a shard)
SHARD_LAYOUTS = "shard_layouts"  # the output node's meta key: one ShardLayout or None per user output


@dataclasses.dataclass(frozen=True)
class ShardLayout:
    """Where the local tensor a program of :func:`export_local` takes or returns sits in its
    DTensor: ``DTensor.from_local(local, mesh, placements, shape=global_shape)`` rebuilds it."""

    mesh: Any  # torch.distributed.device_mesh.DeviceMesh
    placements: tuple  # one torch.distributed.tensor Placement per mesh dimension
    global_shape: tuple[int, ...]

    @classmethod
    def of(cls, t: Any) -> ShardLayout:
        return cls(t.device_mesh, tuple(t.placements), tuple(t.shape))


def is_dtensor(t: Any) -> bool:
    dtensor = getattr(sys.modules.get("torch.distributed.tensor"), "DTensor", None)  # imported where one exists
    return dtensor is not None and isinstance(t, dtensor)


def export_local(model: torch.nn.Module, args: tuple, kwargs: dict[str, Any] | None = None) -> Any:
    """This rank's program of ``model`` (DTensor parameters, buffers and inputs, or a
    ``fully_shard``'ed model) over local shards.

    The trace runs below autograd (``pre_dispatch=False``: plain ATen, as ``export``'s lower
    level) and below DTensor's dispatch, so what DTensor does on each op is in the graph: the
    local op, and every redistribution as ``_c10d_functional`` collectives plus ``wait_tensor``.
    Parameters and buffers keep their names and hold this rank's shards; inputs are the local
    shards of ``args`` (plain tensors stay plain: a ``parallelize_module``'d model takes them and
    its hooks' ``from_local``/``to_local``/``redistribute`` are traced through, their
    collectives included); DTensor outputs are returned as local shards. Each placeholder's
    ``node.meta["shard_layout"]`` and the output node's ``meta["shard_layouts"]`` say how to
    rebuild the DTensors. Run ``ep.module()`` on every rank of the mesh together.

    It is an inference program: its parameters do not require grad, because autograd of the
    local ops is not DTensor's backward (where DTensor's backward of a redistribution is itself
    a collective, each rank would get only its part). Train through :func:`~predispatch_func.export`
    or :func:`~predispatch_func.export_joint`, whose programs stay over DTensors.

    A ``fully_shard``'ed (FSDP2) model gives a pre-dispatch program instead (``fully_sharded.py``):
    its parameters are the local shards, each unit's all-gathered as its forward starts, and the
    gather's backward reduce-scatters, so gradients through ``ep.module()`` are eager FSDP2's
    ``.grad`` shards; :func:`export_local_joint` gives its training step.
    """
    kwargs = kwargs or {}
    if fully_sharded.is_fully_sharded(model):
        shards = _fully_sharded_view(model, args, kwargs)
        ep = export(shards, args, kwargs)
        _record_shard_layouts(ep, shards)
        return ep
    output_layouts: list[ShardLayout | None] = []
    view = _LocalView(model, args, kwargs, output_layouts.extend)
    local_args, local_kwargs = tc.pytree.tree_map_only(torch.Tensor, _local, (args, kwargs))
    with dtensor_steps_inline():  # parallelize_module's hooks: from_local, to_local, redistribute
        ep = export(view, local_args, local_kwargs, pre_dispatch=False)
    last_call = output_layouts[len(output_layouts) - len(ep.graph_signature.user_outputs):]
    _record_layouts(ep, model, (args, kwargs), last_call)
    return ep


def export_local_joint(model: torch.nn.Module, args: tuple, kwargs: dict[str, Any] | None = None, *,
                       loss_fn: Callable[..., Any] | None = None) -> Any:
    """One training step of a ``fully_shard``'ed model on this rank, over its local shards:
    :func:`~predispatch_func.export_joint` of :func:`export_local`'s program. Each gathered weight's
    gradient is reduce-scattered (``avg``, as FSDP2) to this rank's shard in the graph, so the
    ``GRADIENT_TO_PARAMETER`` outputs (and ``.grad`` after ``ep.module()``) are eager FSDP2's."""
    kwargs = kwargs or {}
    if not fully_sharded.is_fully_sharded(model):
        raise InputError(f"export_local_joint takes a model sharded by FSDP2's fully_shard; {type(model).__name__} "
                         "has no fully_shard'ed module: train a model over DTensors with pf.export_joint, whose "
                         "program stays over DTensors (docs/distributed.md)")
    view = _fully_sharded_view(model, args, kwargs)
    jep = export_joint(view, args, kwargs, loss_fn=loss_fn)
    _record_shard_layouts(jep, view)
    return jep


def _fully_sharded_view(model: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> fully_sharded.ShardsView:
    sharded = fully_sharded.sharded_parameters(model)
    shards = {id(t) for t in sharded.values()}
    stray = next((name for name, t in itertools.chain(model.named_parameters(), model.named_buffers())
                  if is_dtensor(t) and id(t) not in shards), None)
    if stray is None:
        stray = next(("an input" for t in tc.pytree.tree_leaves((args, kwargs)) if is_dtensor(t)), None)
    if stray is not None:
        raise UnsupportedError(
            f"{stray} is a DTensor FSDP2 does not shard, in a fully_shard'ed model: the program models FSDP2 "
            "alone (1-D data parallel over plain inputs), not FSDP2 mixed with tensor parallelism",
            kind=Refusal.FULLY_SHARDED_MODULE)
    return fully_sharded.ShardsView(model, sharded)


def _record_shard_layouts(ep: Any, view: fully_sharded.ShardsView) -> None:
    """Each placeholder's layout: the FSDP2 shards' (parameters by name), None for the rest; the
    outputs are plain tensors (FSDP2 runs the modules on whole weights)."""
    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    for spec in ep.graph_signature.input_specs:
        shard = view.layouts.get(spec.target) if spec.kind is InputKind.PARAMETER else None
        placeholders[spec.arg.name].meta[SHARD_LAYOUT] = ShardLayout.of(shard) if shard is not None else None
    n_outputs = sum(s.kind is OutputKind.USER_OUTPUT for s in ep.graph_signature.output_specs)
    ep.graph.output_node().meta[SHARD_LAYOUTS] = (None,) * n_outputs


def _local(t: torch.Tensor) -> torch.Tensor:
    return tc.dtensor_local_shard(t) if is_dtensor(t) else t


class _LocalView(torch.nn.Module):
    """``model`` with its state as local shards under the same names; ``forward`` wraps each
    shard (and each input shard) back into its DTensor and runs ``model`` on them."""

    model: torch.nn.Module
    seen_outputs: Callable[[list[ShardLayout | None]], None]

    def __init__(self, model: torch.nn.Module, args: tuple, kwargs: dict,
                 seen_outputs: Callable[[list[ShardLayout | None]], None]):
        super().__init__()
        self.originals = {name: t for name, t in itertools.chain(model.named_parameters(), model.named_buffers())}
        for name, t in self.originals.items():
            *path, leaf = name.split(".")
            owner: torch.nn.Module = self
            for part in path:
                if part not in dict(owner.named_children()):
                    owner.add_module(part, torch.nn.Module())
                owner = owner.get_submodule(part)
            local = _local(t)
            if isinstance(t, torch.nn.Parameter):
                # an inference program: autograd of its local ops is not DTensor's backward (a
                # replicated bias added to a partial sum gets each rank's part, where eager all-reduces),
                # so no gradient may come out of it silently different
                owner.register_parameter(leaf, torch.nn.Parameter(local, requires_grad=False))
            else:
                persistent = leaf not in tc.non_persistent_buffer_names(model.get_submodule(".".join(path)))
                owner.register_buffer(leaf, local, persistent=persistent)
        self.input_likes = tc.pytree.tree_leaves((args, kwargs))
        # not attributes of a module: the export gives a module's Python state back after the trace
        object.__setattr__(self, "model", model)  # not a submodule either: its DTensors are no state of ours
        object.__setattr__(self, "seen_outputs", seen_outputs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        state = {name: self._rewrap(self._shard(name), t) for name, t in self.originals.items()}
        leaves, spec = tc.pytree.tree_flatten((args, kwargs))
        args, kwargs = tc.pytree.tree_unflatten([self._rewrap(v, like) for v, like in zip(leaves, self.input_likes,
                                                                                            strict=True)], spec)
        out = torch.func.functional_call(self.model, state, args, kwargs)  # tied names follow their twin
        out_leaves, out_spec = tc.pytree.tree_flatten(out)
        self.seen_outputs([ShardLayout.of(v) if is_dtensor(v) else None for v in out_leaves])
        return tc.pytree.tree_unflatten([_local(v) for v in out_leaves], out_spec)

    def _shard(self, name: str) -> Any:
        """Our tensor ``name``, read as an attribute (while tracing, the lifted stand-in)."""
        owner, _, leaf = name.rpartition(".")
        return getattr(self.get_submodule(owner), leaf)

    @staticmethod
    def _rewrap(local: Any, like: Any) -> Any:
        return tc.dtensor_around(local, like) if is_dtensor(like) else local


def _record_layouts(ep: Any, model: torch.nn.Module, call: tuple, outputs: list[ShardLayout | None]) -> None:
    """Each placeholder's layout (parameters and buffers by name, user inputs by position) and
    the user outputs' layouts, in the nodes' metadata."""
    state = dict(itertools.chain(model.named_parameters(), model.named_buffers()))
    inputs = iter(tc.pytree.tree_leaves(call))
    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    for spec in ep.graph_signature.input_specs:
        value = next(inputs, None) if spec.kind is InputKind.USER_INPUT else state.get(spec.target)
        node = placeholders[spec.arg.name]
        node.meta[SHARD_LAYOUT] = ShardLayout.of(value) if is_dtensor(value) else None
    user_outputs = [s for s in ep.graph_signature.output_specs if s.kind is OutputKind.USER_OUTPUT]
    if len(user_outputs) == len(outputs):
        ep.graph.output_node().meta[SHARD_LAYOUTS] = tuple(outputs)


def pipeline(module: torch.nn.Module, mb_args: tuple, mb_kwargs: dict[str, Any] | None = None,
             split_spec: dict[str, Any] | None = None,
             split_policy: Callable[[torch.fx.GraphModule], torch.fx.GraphModule] | None = None) -> Any:
    """``torch.distributed.pipelining.pipeline`` (same arguments, returns its ``Pipe``) with the
    whole model traced by :func:`~predispatch_func.export` on the micro-batch example.

    torch annotates the ``split_spec`` points by replacing submodules' ``forward``; here the
    user's module gets them back afterwards, so exporting leaves it as it was.
    """
    from torch.distributed.pipelining import pipeline as torch_pipeline

    def traced(mod: torch.nn.Module, args: tuple, kwargs: dict | None) -> Any:
        return _splittable(export(mod, args, kwargs))

    with _forwards_restored(module, split_spec or {}), tc.pipeline_traced_by(traced):
        return torch_pipeline(module, mb_args, mb_kwargs, split_spec=split_spec, split_policy=split_policy)


def _splittable(ep: Any) -> Any:
    """``ep`` as torch's split can take it. The split rebuilds each stage from its graph alone
    (pipelining's ``_outline_submodules``) and loses the subgraphs a HOP call reads, so grad
    regions are inlined (:func:`~predispatch_func.interop.inline_regions`: values and gradients
    stay eager's); what inlining cannot keep is refused."""
    regions = []
    for _, gm in all_graph_modules(ep.graph_module):
        for node in gm.graph.nodes:
            body = next((a for a in node.args if isinstance(a, torch.fx.Node) and a.op == "get_attr"
                         and isinstance(getattr(gm, str(a.target), None), torch.fx.GraphModule)), None)
            if node.op != "call_function" or body is None:
                continue
            if node.target is not pf_grad_region or any(j >= 0 for j in node.args[1]):
                what = "a tensor updated in place under no_grad" if node.target is pf_grad_region else \
                    f"{getattr(node.target, '__name__', node.target)}"
                raise UnsupportedError(
                    f"{what} in a model split by torch.distributed.pipelining: torch's split rebuilds each stage "
                    "from its graph alone and loses the subgraph this call reads (torch.export's programs fail "
                    "the same way); grad regions without in-place updates are inlined, this cannot be; move it "
                    "out of the model, or split by hand and export each stage with pf.export",
                    kind=Refusal.SUBGRAPH_IN_PIPELINE_STAGE, op=what,
                    source=(node.meta.get("stack_trace") or "").strip() or None)
            regions.append(node)
    return inline_regions(ep) if regions else ep


@contextlib.contextmanager
def _forwards_restored(module: torch.nn.Module, split_spec: dict[str, Any]) -> Iterator[None]:
    """Give each split point's submodule back the instance attributes ``forward`` and
    ``_orig_forward`` it had (torch's ``annotate_split_points`` sets both)."""
    missing = object()
    saved = []
    for name in split_spec:
        try:
            sub = module.get_submodule(name)
        except AttributeError:
            continue  # torch's own error names it
        saved.append((sub, {k: sub.__dict__.get(k, missing) for k in ("forward", "_orig_forward")}))
    try:
        yield
    finally:
        for sub, attrs in saved:
            for key, value in attrs.items():
                if value is missing:
                    sub.__dict__.pop(key, None)
                else:
                    sub.__dict__[key] = value
