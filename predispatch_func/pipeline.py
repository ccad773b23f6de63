"""The trace stage, one straight line for every graph an export makes.

The program's graph and each body of a custom ``torch.autograd.Function`` or
tensor hook (its forward, its backward) go through the same stages::

    trace (trace/)  ->  the caller's step on the flat graph  ->  regions outlined (regions/)  ->  dead code dropped

:func:`trace_subgraph` runs them; ``aot.aot_export_module`` calls it for the
program. The Function tracer in ``hop/`` cannot import this module (``hop/``
sits below the stages), so it is handed :meth:`TraceSettings.trace_body` as a
value, through the trace it runs in: a pass added here reaches every body too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch

from . import _torch_compat as tc
from .artifacts import Named, Subgraph, Trace
from .graphs import all_graph_modules
from .passes.grad_free_inputs import refuse_in_body
from .passes.graph_cleanup import eliminate_dead_code
from .program.signature import grad_sources
from .regions import outline_regions
from .regions.frames import drop_entry_and_exit_markers
from .trace import CompositePolicy, environment, trace_functional
from .trace.extensions.fakes import fresh_like
from .trace.stack import Body


@dataclasses.dataclass(frozen=True)
class TraceSettings:
    """What every trace of one export shares: the composite policy and the decompositions."""

    policy: CompositePolicy
    decompositions: dict | None = None

    def trace_body(self, body: Body, inputs: list[Any], *, grad_enabled: bool) -> torch.fx.GraphModule:
        """A functional subgraph of ``body`` over fresh fakes like ``inputs``, traced outside
        the trace in progress and under ``grad_enabled`` (off for a Function's forward, as
        eager runs it); the caller's autocast applies inside without being recorded (the
        caller's graph records it)."""
        ambient = tc.autocast_state()

        def under_caller_autocast(wrapped: list[Any], mode: Any) -> list[Any]:
            with environment.around_a_traced_body(ambient):
                return body(wrapped, mode)

        off = {device: (False, dtype) for device, (_, dtype) in ambient.items()}
        with environment.outside_the_trace_in_progress(off):
            fresh = [fresh_like(t) for t in inputs]
            traced = trace_subgraph(under_caller_autocast, fresh, grad_enabled=grad_enabled, settings=self,
                                    prepare=_body_markers_dropped)
            refuse_in_body(traced.trace.grad_free_writes)
            gm = traced.graph_module
            for _, sub in all_graph_modules(gm):
                sub.recompile()
        return gm


def trace_subgraph(fn: Body, inputs: Sequence[Any], *, grad_enabled: bool, settings: TraceSettings,
                   prepare: Callable[[Trace], Named], pre_dispatch: bool = True, fake_mode: Any = None
                   ) -> Subgraph[Named]:
    """Trace ``fn`` over ``inputs`` (fakes) into a functional graph with its regions outlined.

    ``grad_enabled`` is the grad mode the graph runs under. ``prepare`` runs on the
    flat traced graph before the regions are outlined; the placeholders it names say
    which may require grad (the outliner refuses an identity it cannot carry).
    """
    trace = trace_functional(fn, inputs, policy=settings.policy, pre_dispatch=pre_dispatch,
                             decompositions=settings.decompositions, fake_mode=fake_mode,
                             trace_body=settings.trace_body)
    named = prepare(trace)
    gm = trace.graph_module
    _checks_as_runtime_asserts(gm, fake_mode or tc.fake_mode_of([t for t in inputs if isinstance(t, torch.Tensor)]))
    outline_regions(gm, trace.identity_edges, grad_enabled=grad_enabled,
                    grad_sources=grad_sources(named) if named is not None else None)
    eliminate_dead_code(gm)
    return Subgraph(trace, named)


def _checks_as_runtime_asserts(gm: torch.fx.GraphModule, fake_mode: Any) -> None:
    """The user's ``torch._check`` (or ``assert``) on unbacked values (``.item()``, nonzero sizes)
    and the ranges the trace learned for them, as runtime asserts of this graph, as
    torch.export keeps them: inserted in the graph that reads the value (a Function's body
    too), before the regions are outlined (an assert on a value read inside ``no_grad`` goes
    into the region with it) and before dead code is dropped (which took the unread
    ``.item()``, and so the check, with it)."""
    shape_env = tc.shape_env_of(fake_mode)
    if shape_env is None:
        return
    tc.insert_deferred_runtime_asserts(gm, shape_env, "exported program", export=True)
    tc.recompute_unbacked_bindings(gm, shape_env)


def _body_markers_dropped(trace: Trace) -> None:
    """A body runs under the grad mode its caller gives it, not the one its trace entered."""
    drop_entry_and_exit_markers(trace.graph_module.graph)


__all__ = ["TraceSettings", "trace_subgraph"]
