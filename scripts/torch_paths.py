"""torch 2.13's own export paths, each as a runnable module that writes its
mutations back, so ``predispatch_func.replay_against_eager`` can judge them
exactly as it judges ours. Used by the comparison scripts; not a test.

* ``torch.export``: ``torch.export.export(m, args).module()`` (non-functional);
* ``run_decompositions``: ``torch.export.export(m, args).run_decompositions({}).module()``;
* ``aot_pre_dispatch``: ``torch._functorch.aot_autograd.aot_export_module(m, args,
  trace_joint=False, pre_dispatch=True)``; torch gives no runtime for it, so the
  graph is called on the module's own parameters and buffers and the mutations
  it reports are written back with ``copy_`` (under no_grad for a leaf that
  requires grad, as ours does).
"""

from __future__ import annotations

import copy
import types
from typing import Any, Callable

import torch
import torch.utils._pytree as pytree


def torch_export(model: torch.nn.Module, args: tuple, kwargs: dict | None = None) -> torch.nn.Module:
    return torch.export.export(model, args, kwargs).module()


def torch_run_decompositions(model: torch.nn.Module, args: tuple, kwargs: dict | None = None) -> torch.nn.Module:
    return torch.export.export(model, args, kwargs).run_decompositions({}).module()


class _TupleOutputs(torch.nn.Module):
    """torch's aot_export_module only takes modules returning a tuple."""

    def __init__(self, inner: torch.nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, *args, **kwargs):
        out = self.inner(*args, **kwargs)
        return out if isinstance(out, tuple) else (out,)


def _write_back(destination: torch.Tensor, value: torch.Tensor) -> None:
    if destination.is_leaf and destination.requires_grad:
        with torch.no_grad():
            destination.copy_(value)
    else:
        destination.copy_(value)


def torch_aot_pre_dispatch(model: torch.nn.Module, args: tuple, kwargs: dict | None = None) -> torch.nn.Module:
    from torch._functorch.aot_autograd import aot_export_module

    kwargs = dict(kwargs or {})
    program = copy.deepcopy(model)
    returns_tuple = isinstance(copy.deepcopy(model)(*copy.deepcopy(args), **copy.deepcopy(kwargs)), tuple)
    gm, sig = aot_export_module(_TupleOutputs(program), args, trace_joint=False, pre_dispatch=True,
                                kwargs=kwargs)
    strip = lambda fqn: fqn.removeprefix("inner.")  # noqa: E731
    output_names = [n.name for n in gm.graph.output_node().args[0]]

    def forward(self, *call_args, **call_kwargs):
        params = dict(self.named_parameters())
        buffers = dict(self.named_buffers())
        state = [params[strip(n)] for n in sig.parameters] + [buffers[strip(n)] for n in sig.buffers]
        flat_user = [a for a in pytree.tree_leaves((call_args, call_kwargs))]
        user_tensors = [a for a in flat_user if isinstance(a, torch.Tensor)]
        outs = gm(*state, *user_tensors)
        user_index = {name: i for i, name in enumerate(sig.user_inputs)}
        results = []
        for name, value in zip(output_names, outs):
            if name in sig.buffers_to_mutate:
                _write_back(buffers[strip(sig.buffers_to_mutate[name])], value)
            elif name in sig.parameters_to_mutate:
                _write_back(params[strip(sig.parameters_to_mutate[name])], value)
            elif name in sig.user_inputs_to_mutate:
                _write_back(user_tensors[user_index[sig.user_inputs_to_mutate[name]]], value)
            else:
                results.append(value)
        results = pytree.tree_unflatten(results, sig.out_spec) if sig.out_spec else tuple(results)
        return results if returns_tuple else results[0]

    program.forward = types.MethodType(forward, program)
    return program


PATHS: dict[str, Callable[..., torch.nn.Module]] = {
    "torch.export": torch_export,
    "run_decompositions": torch_run_decompositions,
    "aot_pre_dispatch": torch_aot_pre_dispatch,
}


def judge(build: Callable[..., torch.nn.Module], model: torch.nn.Module, args: tuple,
          kwargs: dict | None = None, **replay_options: Any) -> tuple[str, str]:
    """("ok" | "wrong" | "error", detail) for one path on one case."""
    import predispatch_func as pf

    try:
        program = build(copy.deepcopy(model), copy.deepcopy(args), copy.deepcopy(kwargs))
    except Exception as exc:  # noqa: BLE001 - any failure to export is this path's verdict
        return "error", f"{type(exc).__name__}: {str(exc).splitlines()[0][:90]}"
    report = pf.replay_against_eager(program, model, args, kwargs, **replay_options)
    return ("ok", "") if report.ok else ("wrong", report.problems[0][:110])
