"""Check what ``forward`` returned before it becomes the graph's outputs.

A program's outputs are a pytree of tensors and constants: an object of a type
pytree does not know (transformers' ``DynamicCache``) is one opaque leaf that no
graph can return, and fx would fail on it deep inside the trace
("argument of type: <class ...>"). Here it is named, with where it sits in the
output and how to make it a pytree node.
"""

from __future__ import annotations

import enum
import inspect
from typing import Any

import torch

from .. import _torch_compat as tc
from ..errors import Refusal, UnsupportedError
from ..inputs.input_check import CONSTANT_LEAVES

# what a graph can return besides tensors: the constants fx records as they are
_RETURNABLE = (*CONSTANT_LEAVES, enum.Enum, slice, range, type(...), torch.ScriptObject)

# a library's own way to make its output types pytree nodes, by the top-level package of the type
_LIBRARY_HELPERS = {
    "transformers": ("transformers.integrations.executorch.register_dynamic_cache_export_support() "
                     "registers DynamicCache; or call the model with use_cache=False (no cache returned)"),
}


def check_output_leaves(model: torch.nn.Module, out: Any) -> None:
    """Refuse (``OUTPUT_NOT_A_PYTREE``) the first output leaf no graph can return."""
    leaves = tc.pytree.tree_leaves(out)
    for i, leaf in enumerate(leaves):
        if isinstance(leaf, (torch.Tensor, *_RETURNABLE)) or hasattr(leaf, "__fx_create_arg__"):
            continue
        kind = type(leaf)
        name = f"{kind.__module__}.{kind.__qualname__}"
        helper = _LIBRARY_HELPERS.get(kind.__module__.partition(".")[0])
        raise UnsupportedError(
            f"{type(model).__name__}.forward returned a {name} at {_path_of(out, i)}, a type "
            "pytree does not know, so no program can return it (torch.export refuses it too). Register it "
            f"as a pytree node before exporting: torch.utils._pytree.register_pytree_node({kind.__name__}, "
            "flatten_fn, unflatten_fn) (torch.export.register_dataclass for a dataclass)"
            + (f"; or use the library's helper: {helper}" if helper else "")
            + "; or return only its tensors",
            kind=Refusal.OUTPUT_NOT_A_PYTREE, source=_forward_line(model))


def _path_of(out: Any, index: int) -> str:
    """``output['state'][1]``; a container registered without key names gives the leaf's position."""
    try:
        path, _ = tc.pytree.tree_flatten_with_path(out)[0][index]
    except ValueError:  # register_pytree_node without flatten_with_keys_fn
        return f"output leaf {index}"
    return f"output{tc.pytree.keystr(path)}"


def _forward_line(model: torch.nn.Module) -> str | None:
    """``file:line in Class.forward``: where the output was made (the trace has returned)."""
    forward = inspect.unwrap(type(model).forward)  # past a library's decorators (transformers' output wrappers)
    try:
        return f"{inspect.getsourcefile(forward)}:{inspect.getsourcelines(forward)[1]} in " \
               f"{type(model).__qualname__}.forward"
    except (OSError, TypeError):
        return None
