"""Recording a ``pf_autograd_function`` call in the trace in progress, first trace or re-trace.

The first trace of a custom Function (``function_trace.py``) and the re-trace
of a program that already holds the call (the HOP's ``__call__``,
``autograd_function.py``) end the same way: :func:`record_call`. Both read
which trace of ours is running from the stack kept here. The HOP is passed in
as a value, so this module imports neither of those two.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ... import _torch_compat as tc
from ...mode_capabilities import TraceBody, observer_of_opaque_calls
from .fakes import fresh_like, output_values


@dataclasses.dataclass(frozen=True)
class FunctionTracing:
    """How the running trace of ours traces a Function's bodies, and whether it runs before autograd."""

    trace_body: TraceBody
    pre_dispatch: bool


_active: list[FunctionTracing] = []


@contextlib.contextmanager
def tracing(settings: FunctionTracing) -> Iterator[bool]:
    """``settings`` hold while the block runs; yields whether this is the outermost trace."""
    _active.append(settings)
    try:
        yield len(_active) == 1
    finally:
        _active.pop()


def current() -> FunctionTracing | None:
    """The settings of the innermost trace of ours, if one runs."""
    return _active[-1] if _active else None


def backward_inputs(values: tuple, n_outputs: int, n_results: int) -> list[Any]:
    """The backward subgraph's inputs: the saved tensors, then a (contiguous, as autograd
    makes it) gradient per differentiable-group output."""
    return [fresh_like(v) for v in values[n_results:]] + [fresh_like(v, contiguous=True) for v in values[:n_outputs]]


def record_call(hop: Any, constants: tuple, fwd_gm: torch.fx.GraphModule, bwd_gm: torch.fx.GraphModule,
                values: tuple, operands: list[Any], inner: list[Any], *, exposed: int) -> list[Any]:
    """Put one call of ``hop`` on ``operands`` (``inner``: what they wrap) in the caller's
    graph; its first ``exposed`` results as functional tensors, shown to the mode as an
    op's results and reads."""
    with tc.outside_trace():
        results = [fresh_like(v) for v in values]
    tc.record_hop_call(hop, [("autograd_function_fwd", fwd_gm), ("autograd_function_bwd", bwd_gm)],
                       constants, inner, results)
    wrapped = [tc.to_functional(r) for r in results[:exposed]]
    mode = observer_of_opaque_calls(tc.active_functional_mode())
    if mode is not None:  # reads and results as an op's (a `.data` write must not slip past what it saved)
        mode.observe_opaque_call(f"autograd.Function {constants[0]}", operands, wrapped, keeps_inputs=True,
                                 non_differentiable=constants[3],
                                 saved_results=_results_it_saves(values, constants[2], exposed))
    return wrapped


def _results_it_saves(values: tuple, n_results: int, exposed: int) -> list[int]:
    """The results (among the first ``exposed``) whose storage a saved value shares: the Function
    saved its output, or kept it (or a view of it) on ``ctx``, so its backward reads it as eager
    leaves it then (a ``.data`` write after the call changes what eager's backward reads)."""
    saved = {tc.StorageWeakRef(v.untyped_storage()) for v in values[n_results:]
             if isinstance(v, torch.Tensor) and v.layout == torch.strided}
    return [i for i, v in enumerate(values[:exposed])
            if isinstance(v, torch.Tensor) and v.layout == torch.strided
            and tc.StorageWeakRef(v.untyped_storage()) in saved]


def read_operands(operands: list[Any]) -> list[Any]:
    """The values below functionalization of a call's operands, their stale views rebuilt
    first as the mode rebuilds an op's (in the grad mode eager made them in)."""
    mode = observer_of_opaque_calls(tc.active_functional_mode())
    if mode is not None:
        mode.before_opaque_call(operands)
    return [tc.inner_of_functional(t) for t in operands]


def retrace_call(hop: Any, fwd: Callable[..., Any], bwd: Callable[..., Any], constants: tuple,
                 operands: list[Any]) -> tuple | None:
    """A call of ``hop`` met while our trace runs (re-exporting a program that holds one):
    both bodies traced again by our pipeline, recorded as the same call. None when no
    trace of ours is running (torch's rules then apply)."""
    settings = current()
    if settings is None or tc.current_proxy_tracer() is None:
        return None
    _, n_outputs, n_results, _, _ = constants
    inner = read_operands(operands)
    fwd_gm = settings.trace_body(lambda wrapped, mode: list(fwd(*wrapped)), inner, grad_enabled=False)
    values = tuple(output_values(fwd_gm))
    bwd_gm = settings.trace_body(lambda wrapped, mode: list(bwd(*wrapped)),
                                 backward_inputs(values, n_outputs, n_results), grad_enabled=True)
    return tuple(record_call(hop, constants, fwd_gm, bwd_gm, values, operands, inner, exposed=len(values)))


__all__ = ["FunctionTracing", "backward_inputs", "current", "read_operands", "record_call", "retrace_call", "tracing"]
