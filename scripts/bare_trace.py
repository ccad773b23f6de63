"""The floor of an export's time: one bare pre-dispatch ``make_fx`` trace over fake state.

Any exporter of this design fakes the model's state and inputs and runs one
``make_fx(pre_dispatch=True)`` trace of ``forward``; everything else (functionalization, region
outlining, the state judge, the signature, the ExportedProgram) is overhead on top. This
times exactly that, with nothing of ours: a fake mode with a shape environment (static
shapes, as an export without ``dynamic_shapes``), every parameter, buffer and tensor input
faked, and ``torch.func.functional_call`` traced with torch's "exporting" flag set (as
torch.export sets it: transformers takes its traceable mask paths only then). The graph is
not functional and keeps no region: it is a lower bound, not an exporter.

Benchmarks report ours / floor beside ours / torch.export (scripts/bench_export.py,
scripts/bench_zoo.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from predispatch_func import _torch_compat as tc
from predispatch_func._torch_compat import exporting_state, pytree


def bare_trace(model: torch.nn.Module, args: tuple, kwargs: dict | None = None, *,
               metadata: bool = False) -> torch.fx.GraphModule:
    """Trace ``model(*args, **kwargs)`` once, pre-dispatch, over fakes; the model is not changed.
    ``metadata``: also record each node's stack trace and module stack, which every program of
    ours carries (and torch.export's): the floor for an IR with them, a few percent to a third
    above the bare one."""
    kwargs = kwargs or {}
    mode = tc.FakeTensorMode(shape_env=tc.ShapeEnv(), allow_non_fake_inputs=False)
    state = {**dict(model.named_parameters(remove_duplicate=False)),
             **dict(model.named_buffers(remove_duplicate=False))}
    fake_state = {name: mode.from_tensor(t, static_shapes=True) for name, t in state.items()}
    leaves, spec = pytree.tree_flatten((args, kwargs))
    tensor_at = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
    fake_inputs = [mode.from_tensor(leaves[i], static_shapes=True) for i in tensor_at]

    def forward(fake_state: dict[str, Any], *tensors: torch.Tensor) -> list[Any]:
        flat = list(leaves)
        for i, t in zip(tensor_at, tensors):
            flat[i] = t
        call_args, call_kwargs = pytree.tree_unflatten(flat, spec)
        out = torch.func.functional_call(model, fake_state, call_args, call_kwargs, tie_weights=False)
        return [leaf for leaf in pytree.tree_leaves(out) if isinstance(leaf, torch.Tensor)]

    with mode, exporting_state(), _module_attributes_restored(model):
        return tc.make_fx(forward, pre_dispatch=True, tracing_mode="real", record_stack_traces=metadata,
                          record_module_stack=metadata)(fake_state, *fake_inputs)


@contextlib.contextmanager
def _module_attributes_restored(model: torch.nn.Module) -> Iterator[None]:
    """Each module's attributes as they were, dicts and lists among them in place: a model that
    caches in ``forward`` (transformers' LeViT keeps attention biases in a dict) kept fake
    tensors, which the next export of the same model in a benchmark read as its state. Ours and
    torch.export leave the model as it was; so must the floor (a few microseconds a module)."""
    saved = []
    for module in model.modules():
        attributes = dict(vars(module))
        contents = {name: (list(v) if type(v) is list else dict(v)) for name, v in attributes.items()
                    if type(v) in (dict, list) and not name.startswith("_")}
        saved.append((module, attributes, contents))
    try:
        yield
    finally:
        for module, attributes, contents in saved:
            now = vars(module)
            for name in [n for n in now if n not in attributes]:
                del now[name]
            now.update(attributes)
            for name, items in contents.items():
                container = attributes[name]
                container.clear()
                if type(container) is list:
                    container.extend(items)
                else:
                    container.update(items)
