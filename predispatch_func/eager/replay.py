"""A traced kernel compiled once into a plain function: what a cache hit runs.

fx's generated ``forward`` calls each op through ``OpOverload.__call__``, one
Python frame around the op's C++ entry point, and clears each dead value with
an assignment: on a decomposition of some fifty small ops (CPU attention and
its backward) that is a quarter of the replay. The same graph written out
with each op bound to its entry point (``tc.entry_point``) runs the same
dispatcher calls with the same arguments, in the same order::

    def kernel(v0, v1):
        v2 = c0(v0, c1)          # c0: aten.mul.Tensor's entry point, c1: the traced scalar
        return v2

Every argument that is not a value of the graph is a constant of the compiled
function's namespace, bound once, so its repr never matters (``inf``,
devices, dtypes).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from .. import _torch_compat as tc


class TracedKernel:
    """One traced decomposition: its graph (for reading: ``code``, ``graph``) and the compiled replay."""

    __slots__ = ("graph_module", "run")

    def __init__(self, graph_module: torch.fx.GraphModule):
        self.graph_module = graph_module
        self.run = compile_graph(graph_module)

    @property
    def graph(self) -> torch.fx.Graph:
        return self.graph_module.graph

    @property
    def code(self) -> str:
        return self.graph_module.code

    def __call__(self, *tensors: torch.Tensor) -> Any:
        return self.run(*tensors)


def compile_graph(graph_module: torch.fx.GraphModule) -> Callable[..., Any]:
    """``graph_module``'s graph as a function of its placeholders, each op called at its entry point."""
    namespace: dict[str, Any] = {}
    names: dict[torch.fx.Node, str] = {}
    parameters: list[str] = []
    lines: list[str] = []

    def constant(value: Any) -> str:
        name = f"c{len(namespace)}"
        namespace[name] = value
        return name

    def render(value: Any) -> str:
        if isinstance(value, torch.fx.Node):
            return names[value]
        if isinstance(value, list):  # fx's immutable_list too
            return "[" + ", ".join(render(item) for item in value) + "]"
        if isinstance(value, tuple):  # torch.Size too
            return "(" + "".join(render(item) + ", " for item in value) + ")"
        if value is None or type(value) in (int, bool):
            return repr(value)
        return constant(value)

    for node in graph_module.graph.nodes:
        name = names[node] = f"v{len(names)}"
        if node.op == "placeholder":
            parameters.append(name)
        elif node.op == "get_attr":
            names[node] = constant(functools.reduce(getattr, node.target.split("."), graph_module))
        elif node.op == "call_function":
            target = tc.entry_point(node.target) if isinstance(node.target, tc.OpOverload) else node.target
            arguments = [render(a) for a in node.args] + [f"{k}={render(v)}" for k, v in node.kwargs.items()]
            lines.append(f"    {name} = {constant(target)}({', '.join(arguments)})")
        elif node.op == "output":
            lines.append(f"    return {render(node.args[0])}")
        else:
            raise ValueError(f"a traced kernel holds only ops, not {node.op} ({node.format_node()})")
    source = f"def kernel({', '.join(parameters)}):\n" + "\n".join(lines) + "\n"
    exec(compile(source, "<pf.eager traced kernel>", "exec"), namespace)  # noqa: S102  (our own codegen)
    return namespace["kernel"]
