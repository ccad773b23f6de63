"""The torch files whose frames fx's tracer drops from a node's ``stack_trace``.

torch computes the set by importing every module it names (torch.export's tracer,
aot_autograd, dynamo and networkx among them: a third of a second of a first
export in a fresh process, which needs them for nothing else); the compat layer
names the same files by path instead, importing nothing. Kept for the process.
"""

from __future__ import annotations

from .. import _torch_compat as tc

_dropped: frozenset[str] | None = None


def dropped_files() -> frozenset[str]:
    """torch's uninteresting files, computed once per process."""
    global _dropped
    if _dropped is None:
        _dropped = frozenset(tc.uninteresting_stack_files())
    return _dropped
