"""Check the call before tracing: the model, ``args``, ``kwargs`` and every input leaf.

A wrong call caught here gets a message about the call ("forward() of Two
takes (x, y), missing 'y'") instead of a tracing failure deep inside torch;
nothing has run yet, so nothing of the caller's can have changed.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

import torch

from .. import _torch_compat as tc
from ..errors import ExportError, Refusal, UnsupportedError

# leaves a program can take: tensors, and constants it specialises on (as torch.export)
CONSTANT_LEAVES = (bool, int, float, complex, str, type(None), torch.dtype, torch.device,
                    torch.memory_format, torch.layout, torch.SymInt, torch.SymFloat, torch.SymBool)


class InputError(ExportError, TypeError):
    """The call itself is wrong (not a module, args not a tuple, arguments that do not
    match ``forward``, an input leaf a program cannot take)."""

    @property
    def hint(self) -> str:
        return "the model and inputs given to export do not fit: change the call as the message says"


class NotAnEagerModule(InputError, ValueError):
    """A TorchScript module: torch.export raises ValueError for it, so a caller's except still fires."""


class ArgsNotATuple(InputError, tc.TorchUserError):
    """``args`` that is not a tuple (a bare tensor, a list): torch.export raises its ``UserError``."""

    def __init__(self, message: str):
        super().__init__(message)
        self.error_type = tc.TorchUserErrorType.INVALID_INPUT  # what torch's UserError carries
        self.message = self.msg = str(self)


def checked_call(model: Any, args: Any, kwargs: Any) -> tuple[tuple, dict]:
    """``(args, kwargs)`` normalised, or an :class:`InputError` saying what is wrong.

    ``args`` must be a tuple, as torch.export requires: a single tensor or a list is refused
    (a list could mean either one list argument or several arguments).
    """
    if not isinstance(model, torch.nn.Module):
        raise InputError(f"export expects an nn.Module, got {type(model).__name__} {model!r:.60}; "
                         "wrap a function in a Module whose forward calls it")
    if isinstance(model, torch.jit.ScriptModule):
        raise NotAnEagerModule(f"Exporting a ScriptModule is not supported: export takes an eager nn.Module, got "
                               f"the TorchScript module {type(model).__name__}, whose Python forward TorchScript has "
                               "already replaced; export the module it was scripted from")
    if not isinstance(args, tuple):
        raise ArgsNotATuple(f"args must be a tuple of positional arguments (Expecting `args` to be a tuple of "
                            f"example positional inputs), got {type(args).__name__}; to pass one "
                            f"{type(args).__name__} as the only argument write (value,)")
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise InputError(f"kwargs must be a dict from argument name to value, got {type(kwargs).__name__}")
    refuse_fully_sharded(model)
    refuse_module_backward_hooks(model)
    _check_binds(model, args, kwargs)
    _check_leaves(args, kwargs)
    return args, dict(kwargs)


def refuse_fully_sharded(model: torch.nn.Module) -> None:
    """FSDP2's ``fully_shard`` all-gathers and reduce-scatters in module hooks that resize
    storages and read data pointers: refused before a trace fails somewhere inside them.
    ``pf.distributed.export_local`` exports such a model without tracing the hooks."""
    fsdp = sys.modules.get("torch.distributed.fsdp")  # only a model built with it has it imported
    kind = getattr(fsdp, "FSDPModule", None)
    sharded = next((name or "the model" for name, m in model.named_modules() if kind and isinstance(m, kind)), None)
    if sharded is not None:
        raise UnsupportedError(
            f"{sharded} is sharded by FSDP2's fully_shard: its all-gather and reduce-scatter run in module hooks "
            "that resize parameter storages and read data pointers, which no trace can record (torch.export fails "
            "on it too); export each rank's program with pf.distributed.export_local (forward) or "
            "pf.distributed.export_local_joint (training step), which take the local shards and all-gather them "
            "in the graph (docs/distributed.md)", kind=Refusal.FULLY_SHARDED_MODULE)


def refuse_module_backward_hooks(model: torch.nn.Module) -> None:
    """A module backward hook (``register_full_backward_hook``, its ``_pre_hook``, the deprecated
    ``register_backward_hook``, or a global one) is run by torch from autograd nodes around the
    module call: a program has no place for it, so its gradients would silently differ from eager's
    (the deprecated kind exported "fine" and trained without the hook). Refused, naming the module."""
    hooked = tc.module_backward_hooks(model)
    if hooked:
        where, how = hooked[0]
        raise UnsupportedError(
            f"{where} has a backward hook ({how}): torch calls it from the autograd nodes around the module's "
            "inputs and outputs, which a program has no place for, so the program's gradients would differ "
            "from eager's (torch.export drops the hook). Remove it before exporting (handle.remove()), or "
            "register a tensor hook in forward (out.register_hook(fn)), which the program carries",
            kind=Refusal.MODULE_BACKWARD_HOOK)


def _check_binds(model: torch.nn.Module, args: tuple, kwargs: dict) -> None:
    try:
        signature = inspect.signature(model.forward)
    except (TypeError, ValueError):  # a forward without a Python signature: let the call decide
        return
    try:
        signature.bind(*args, **kwargs)
    except TypeError as exc:
        raise InputError(f"the arguments do not match {type(model).__name__}.forward{signature}: {exc} "
                         f"(given {len(args)} positional, keywords {sorted(kwargs)})") from None


def _check_leaves(args: tuple, kwargs: dict) -> None:
    leaves, _ = tc.pytree.tree_flatten_with_path((args, kwargs))
    for path, leaf in leaves:
        where = _describe(path)
        if isinstance(leaf, torch.Tensor):
            continue
        if not isinstance(leaf, CONSTANT_LEAVES):
            raise InputError(
                f"input {where} is a {type(leaf).__module__}.{type(leaf).__qualname__}, which a program "
                "cannot take: inputs are tensors, or numbers, bools, strings and None (baked into the "
                "program as constants), in tuples, lists and dicts"
                + ("; convert it with torch.from_numpy" if type(leaf).__module__ == "numpy" else ""))


def _describe(path: tuple) -> str:
    """``args[1]['mask']`` for a pytree path into ``(args, kwargs)``."""
    top, rest = path[0], path[1:]
    if getattr(top, "idx", None) == 0:
        text = "args"
    else:
        text, rest = (f"kwargs[{rest[0].key!r}]", rest[1:]) if rest else ("kwargs", rest)
    for entry in rest:
        if hasattr(entry, "idx"):
            text += f"[{entry.idx}]"
        elif hasattr(entry, "key"):
            text += f"[{entry.key!r}]"
        else:
            text += f".{getattr(entry, 'name', '?')}"
    return text
