"""A traced kernel written out once as a plain function: what a cache hit runs.

fx's generated ``forward`` calls each op through ``OpOverload.__call__``, one
Python frame around the op's C++ entry point, and clears each dead value with
an assignment: on a decomposition of some fifty small ops (CPU attention and
its backward) that is a tenth to a quarter of the replay. The same graph
written out with each op bound to its entry point (``tc.entry_point``) runs
the same dispatcher calls with the same arguments, in the same order::

    def kernel(v0, v1):
        v2 = c0(v0, c1)          # c0: aten.mul.Tensor's entry point, c1: the traced scalar
        return v2

Every argument that is not a value of the graph is a constant (``c<i>``),
bound when the source is compiled, so its repr never matters (``inf``,
devices, dtypes). Source and constants are all a kernel is: a later process
restores it from disk (``persisted_kernels``) and compiles it on its first call.
"""

from __future__ import annotations

import functools
import marshal
from collections.abc import Callable
from typing import Any

import torch

from .. import _torch_compat as tc


class TracedKernel:
    """One traced decomposition: ``code`` (its source), ``ops`` (what it calls) and ``run``.

    One restored from disk (``restored``) keeps its constants as written (ops by name) and
    its compiled code as bytes until its first call: a file holds the kernels of every model
    a target has run, most of which a process never calls."""

    __slots__ = ("code", "_constants", "run", "_code_object", "saved", "native", "native_keys")

    def __init__(self, code: str, constants: list[Any] | None, code_object: Any = None):
        self.code, self._constants = code, constants
        self._code_object = code_object  # ``code`` compiled
        self.saved: tuple[list, bytes] | None = None  # (constants as written, compiled code) until first needed
        self.run: Callable[..., Any] = self._compile_then_run  # replaced by the compiled function on first call
        self.native: Any = None  # its program for the C++ replay, once asked (graph_programs.program_of)
        # the C++ replay's keys of the calls it ran the program for: kept on disk with the program,
        # so the next process's replay starts with it (no first call through Python)
        self.native_keys: set[tuple[int, ...]] = set()

    @classmethod
    def restored(cls, code: str, constants: list[tuple[str, Any]], compiled: bytes, program: Any = None,
                 native_keys: tuple[tuple[int, ...], ...] = ()) -> TracedKernel:
        """A kernel as ``persisted_kernels`` wrote it: ``constants`` as ``("op", name)`` or
        ``("value", value)``, ``compiled`` its code object marshalled, and its C++ program with the
        keys the replay ran it for (None and none where it never was)."""
        kernel = cls(code, None)
        kernel.saved = (constants, compiled)
        if program is not None and native_keys:
            kernel.native, kernel.native_keys = program, set(native_keys)
        return kernel

    @property
    def constants(self) -> list[Any]:
        if self._constants is None:
            assert self.saved is not None
            self._constants = [_op_named(value) if kind == "op" else value for kind, value in self.saved[0]]
        return self._constants

    @classmethod
    def of_graph(cls, graph_module: torch.fx.GraphModule) -> TracedKernel:
        return cls(*write_out(graph_module))

    @property
    def ops(self) -> list[tc.OpOverload]:
        return [value for value in self.constants if isinstance(value, tc.OpOverload)]

    def __call__(self, *tensors: torch.Tensor) -> Any:
        return self.run(*tensors)

    def compiled(self) -> Any:
        """``code`` compiled (a module's code object defining ``kernel``)."""
        if self._code_object is None and self.saved is not None:
            try:
                self._code_object = marshal.loads(self.saved[1])
            except (ValueError, EOFError, TypeError):  # not this Python's: compiled again
                pass
        if self._code_object is None:
            self._code_object = compile(self.code, "<pf.eager traced kernel>", "exec")
        return self._code_object

    def _compile_then_run(self, *tensors: torch.Tensor) -> Any:
        namespace = {f"c{i}": tc.entry_point(value) if isinstance(value, tc.OpOverload) else value
                     for i, value in enumerate(self.constants)}
        exec(self.compiled(), namespace)  # noqa: S102  (our own codegen)
        self.run = namespace["kernel"]
        return self.run(*tensors)


def _op_named(name: str) -> tc.OpOverload:
    op = tc.resolve_overload(*name.split("::", 1))
    if op is None:  # the file is this torch build's: its ops exist (a custom op's library not loaded?)
        raise RuntimeError(f"pf.eager: a kernel on disk calls {name}, which this process does not have; "
                           "delete the eager-kernels-*.pkl file under the cache directory")
    return op


def write_out(graph_module: torch.fx.GraphModule) -> tuple[str, list[Any]]:
    """``graph_module``'s graph as the source of ``kernel(<placeholders>)`` and its constants."""
    constants: list[Any] = []
    names: dict[torch.fx.Node, str] = {}
    parameters: list[str] = []
    lines: list[str] = []

    def constant(value: Any) -> str:
        constants.append(value)
        return f"c{len(constants) - 1}"

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
            arguments = [render(a) for a in node.args] + [f"{k}={render(v)}" for k, v in node.kwargs.items()]
            lines.append(f"    {name} = {constant(node.target)}({', '.join(arguments)})")
        elif node.op == "output":
            lines.append(f"    return {render(node.args[0])}")
        else:
            raise ValueError(f"a traced kernel holds only ops, not {node.op} ({node.format_node()})")
    return f"def kernel({', '.join(parameters)}):\n" + "\n".join(lines) + "\n", constants
