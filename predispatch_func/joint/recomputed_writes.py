"""In-place writes inside a recomputed call, made functional.

A kept composite recomputed below autograd (:mod:`.saved_values`) is recorded as the
ATen its C++ decomposition calls, and C++ decompositions write their own temporaries
in place: ``rms_norm`` computes ``mean(x.pow(2)).add_(eps)`` (transformers' diffllama
met it). Such a write touches nothing but a value the same recomputation made, so it
is its functional twin (``add``) with the later readers of the temporary reading the
twin's result. A write that could reach anything else (a value from before the
recomputation, or a temporary a view was taken of) is left for the contract check,
which refuses the program.
"""

from __future__ import annotations

import torch

from .. import _torch_compat as tc
from ..op_schema import Match, functional_twin


def functional_writes(graph: torch.fx.Graph, first_new: torch.fx.Node | None) -> None:
    """Rewrite in place, from ``first_new`` (the recomputation's first node) on, each in-place
    op on a temporary of the recomputation that nothing aliases."""
    if first_new is None:
        return
    segment: list[torch.fx.Node] = []
    node: torch.fx.Node = first_new
    while node.op != "root":
        segment.append(node)
        node = node.next
    made_here = set(segment)
    for node in segment:
        twin = _writes_a_temporary(node, made_here)
        if twin is None:
            continue
        temporary = node.args[0]
        node.target = twin
        for reader in list(temporary.users):  # readers after the write read the written value
            if reader is not node and _after(reader, node):
                reader.replace_input_with(temporary, node)


def _writes_a_temporary(node: torch.fx.Node, made_here: set[torch.fx.Node]) -> tc.OpOverload | None:
    """The functional twin of ``node``'s op when it writes only its first argument, a value
    ``made_here`` by a non-view op and not viewed by anything."""
    if node.op != "call_function" or not isinstance(node.target, tc.OpOverload):
        return None
    written = tc.written_arguments(node.target)
    if [i for i, _ in written] != [0] or not node.args or not isinstance(node.args[0], torch.fx.Node):
        return None
    temporary = node.args[0]
    if temporary not in made_here or _is_view(temporary) or any(_is_view(u) for u in temporary.users):
        return None
    return functional_twin(node.target, Match.IN_ORDER)


def _is_view(node: torch.fx.Node) -> bool:
    target = node.target
    return isinstance(target, tc.OpOverload) and any(
        r.alias_info is not None for r in tc.schema_of(target).returns) and not tc.schema_of(target).is_mutable


def _after(a: torch.fx.Node, b: torch.fx.Node) -> bool:
    node = b.next
    while node.op != "root":
        if node is a:
            return True
        node = node.next
    return False


__all__ = ["functional_writes"]
