"""Small fx helpers shared by the region pass, the verifier and the renderer."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch

from . import _torch_compat as tc


def calls_view_op(node: torch.fx.Node) -> bool:
    """``node`` calls an ATen view op on a node (its result aliases ``node.args[0]``)."""
    return (node.op == "call_function" and isinstance(node.target, tc.OpOverload)
            and node.target.is_view and bool(node.args) and isinstance(node.args[0], torch.fx.Node))


def all_graph_modules(gm: torch.fx.GraphModule, prefix: str = "") -> Iterator[tuple[str, torch.fx.GraphModule]]:
    """The graph and, recursively, every subgraph module it holds (region bodies)."""
    yield prefix or "<top>", gm
    for name, child in gm.named_children():
        if isinstance(child, torch.fx.GraphModule):
            yield from all_graph_modules(child, f"{prefix}.{name}" if prefix else name)


# Set by the test suite (tests/conftest.py): every graph pass then ends in ``graph.lint()``.
LINT_ENV = "PREDISPATCH_FUNC_LINT"
_Pass = TypeVar("_Pass", bound=Callable[..., Any])


def graph_pass(fn: _Pass) -> _Pass:
    """Mark ``fn(gm, ...)`` as a pass over ``gm``; under the tests, lint every graph after it."""

    @functools.wraps(fn)
    def run(gm: torch.fx.GraphModule, *args: Any, **kwargs: Any) -> Any:
        result = fn(gm, *args, **kwargs)
        if os.environ.get(LINT_ENV):
            for _, sub in all_graph_modules(gm):
                sub.graph.lint()
        return result

    return run  # type: ignore[return-value]
