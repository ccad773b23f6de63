"""``preserve_module_call_signature``, as torch.export does it.

Each call of a listed submodule is bracketed by torch's ``_export_tracepoint``
(its inputs and outputs, flattened), traced like any op. After the signature
is built, torch's ``CollectTracepointsPass`` turns the brackets into a
``ModuleCallSignature`` (which graph values are the call's inputs and outputs)
and removes them, so ``torch.export.unflatten`` keeps the submodule's calling
convention and a user can swap it. Our one addition: the output bracket is
made after our module-call observer popped the submodule off the stack
(global hooks run first), so it takes the stack of its input bracket.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.export.exported_program import ModuleCallSignature

from .. import _torch_compat as tc
from ..graphs import all_graph_modules
from ..passes.node_meta import NN_MODULE_STACK


class PreservedCalls:
    """The specs of each preserved submodule's calls, filled while tracing."""

    def __init__(self, mod: torch.nn.Module, paths: tuple[str, ...] | list[str]):
        self.mod = mod
        self.paths = tuple(paths)
        self.specs: dict[str, dict[str, Any]] = {}

    @contextlib.contextmanager
    def bracketing(self) -> Iterator[None]:
        if not self.paths:
            yield
            return
        with tc.wrap_submodules_with_tracepoints(self.mod, self.paths, self.specs):
            yield

    def collect(self, gm: torch.fx.GraphModule, graph_signature: Any) -> dict[str, ModuleCallSignature]:
        """Signatures by fqn (``fqn@n`` for repeat calls); the brackets leave the graph."""
        if not self.paths:
            return {}
        _outputs_take_input_stacks(gm)
        signatures = {fqn: ModuleCallSignature(inputs=[], outputs=[], in_spec=spec["in_spec"],
                                               out_spec=spec["out_spec"], forward_arg_names=None)
                      for fqn, spec in self.specs.items()}
        tc.collect_tracepoints(gm, signatures, graph_signature)
        return signatures


def _outputs_take_input_stacks(gm: torch.fx.GraphModule) -> None:
    for _, sub in all_graph_modules(gm):
        open_calls: dict[str, list[dict]] = {}
        for node in sub.graph.nodes:
            if node.op != "call_function" or not tc.is_export_tracepoint(node.target):
                continue
            path = node.kwargs["path"]
            if node.kwargs["kind"] == "module_call_inputs":
                open_calls.setdefault(path, []).append(node.meta[NN_MODULE_STACK])
            elif open_calls.get(path):
                node.meta[NN_MODULE_STACK] = dict(open_calls[path].pop())
