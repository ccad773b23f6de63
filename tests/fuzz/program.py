"""A generated program as data: inputs, an optional buffer, statements, returns.

A :class:`Program` renders to the Python source of an ``nn.Module`` plus a
``make_args()`` function, and is *built by exec'ing that source*, so the
source a failing run prints is exactly what ran: paste it into a regression
test as is.

    prog = Program(inputs=(TensorInput("x0", (3, 4)),), buffer=None,
                   body=(Stmt("v0 = x0.t()", ("view",)), Stmt("v0.add_(1.0)", ("inplace:input_view",))),
                   returns=("x0",))
    model, args = prog.build()
"""

from __future__ import annotations

import dataclasses
import hashlib
import linecache
import sys
import types
from typing import Any

import torch

MODULE_NAME = "Fuzzed"


@dataclasses.dataclass(frozen=True)
class TensorInput:
    """A forward argument (or the buffer ``buf``), made from a seeded generator."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"
    requires_grad: bool = False

    def constructor(self, gen: str) -> str:
        shape = ", ".join(map(str, self.shape))
        if self.dtype == "bool":
            return f"torch.randint(0, 2, ({shape},), generator={gen}).bool()"
        if not self.dtype.startswith("float"):
            return f"torch.randint(-4, 5, ({shape},), generator={gen}, dtype=torch.{self.dtype})"
        dtype = "" if self.dtype == "float32" else f", dtype=torch.{self.dtype}"
        grad = ".requires_grad_()" if self.requires_grad else ""
        return f"torch.randn({shape}, generator={gen}{dtype}){grad}"


@dataclasses.dataclass(frozen=True)
class Stmt:
    """One line of ``forward``; ``opens`` marks a ``with`` header whose body follows, indented."""

    code: str
    tags: tuple[str, ...] = ()
    indent: int = 0


@dataclasses.dataclass(frozen=True)
class Program:
    inputs: tuple[TensorInput, ...]
    buffer: TensorInput | None
    body: tuple[Stmt, ...]
    returns: tuple[str, ...]
    seed: int = 0
    return_tags: tuple[str, ...] = ()  # what each return is (input, view, intermediate), for kinds()
    param: TensorInput | None = None  # the parameter ``w`` (requires grad, like any nn.Parameter)

    def kinds(self) -> set[str]:
        """Features of the program, for the per-kind counts of a fuzzing summary."""
        tags = {t for s in self.body for t in s.tags} | set(self.return_tags)
        if any(i.requires_grad for i in self.inputs):
            tags.add("grad_inputs")
        if self.buffer is not None:
            tags.add("buffer")
        if self.param is not None:
            tags.add("parameter")
        if any(not i.dtype.startswith("float") for i in self.inputs):
            tags.add("int_inputs")
        return tags

    def source(self) -> str:
        lines = ["import torch", "", "", f"class {MODULE_NAME}(torch.nn.Module):"]
        if self.buffer is not None or self.param is not None:
            lines += ["    def __init__(self):",
                      "        super().__init__()",
                      f"        g = torch.Generator().manual_seed({self.seed + 1})"]
            if self.buffer is not None:
                lines.append(f"        self.register_buffer(\"buf\", {self.buffer.constructor('g')})")
            if self.param is not None:
                lines.append(f"        self.w = torch.nn.Parameter({self.param.constructor('g')})")
            lines.append("")
        params = ", ".join(["self"] + [i.name for i in self.inputs])
        lines.append(f"    def forward({params}):")
        for stmt in self.body:
            lines.append("        " + "    " * stmt.indent + stmt.code)
        lines.append(f"        return ({', '.join(self.returns)},)")
        lines += ["", "", "def make_args():",
                  f"    g = torch.Generator().manual_seed({self.seed})",
                  f"    return ({''.join(i.constructor('g') + ', ' for i in self.inputs)})", ""]
        return "\n".join(lines)

    def build(self) -> tuple[torch.nn.Module, tuple]:
        """Exec the rendered source; the module's frames point at that source."""
        source = self.source()
        namespace = exec_source(source)
        return namespace[MODULE_NAME](), namespace["make_args"]()


def exec_source(source: str) -> dict[str, Any]:
    """Exec ``source`` under a file name that tracebacks and error messages can show."""
    filename = f"fuzz_program_{hashlib.sha1(source.encode()).hexdigest()[:12]}.py"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    module = types.ModuleType(filename[:-3])  # importable: dynamo (torch.cond) looks modules up
    sys.modules[module.__name__] = module
    exec(compile(source, filename, "exec"), module.__dict__)
    return module.__dict__
