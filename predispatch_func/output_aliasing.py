"""Which inputs, parameters and buffers each output of a call shares memory with.

Equal values after a call do not make two programs alike: eager's ``return self.b[1:]`` is
the buffer's memory, so the next call's write shows through the output a caller kept, and a
write into the output reaches the buffer. ``pf.verify`` compares this per output
(eager's against the program's), as it compares values.
"""

from __future__ import annotations

from typing import Any

import torch

from . import _torch_compat as tc


def memory_of(t: torch.Tensor) -> int | None:
    """An id of ``t``'s memory; None where there is none to compare (meta, fake, a wrapper
    subclass, sparse)."""
    if (type(t) not in (torch.Tensor, torch.nn.Parameter) or t.layout != torch.strided
            or t.device.type == "meta"):
        return None
    try:
        pointer = t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return None
    return pointer or None  # an empty storage shares nothing


def state_tensors(module: torch.nn.Module) -> frozenset[int]:
    """The ids of ``module``'s parameters and buffers, taken before a call: see ``shared_memory``."""
    return frozenset(id(t) for named in (module.parameters(), module.buffers()) for t in named)


def shared_memory(outputs: Any, inputs: Any, module: torch.nn.Module,
                  state_before: frozenset[int] | None = None) -> list[frozenset[str]]:
    """For each tensor among ``outputs`` (flattened, others skipped): the names of the inputs
    (``input[i]``, flattened) and of the module's parameters and buffers that share its memory.
    With ``state_before`` (``state_tensors`` before the call), a parameter or buffer the call
    replaced (``self.buf = torch.cat(...)``) is left out: eager's output is the new object,
    which the next call replaces again, while a program's module writes one buffer in place
    and must return a copy; neither can match eager both now and after the next call."""
    owners: dict[int, set[str]] = {}
    for i, t in enumerate(tc.pytree.tree_leaves(inputs)):
        if isinstance(t, torch.Tensor) and (memory := memory_of(t)) is not None:
            owners.setdefault(memory, set()).add(f"input[{i}]")
    for named in (module.named_parameters(remove_duplicate=False), module.named_buffers(remove_duplicate=False)):
        for name, t in named:
            if state_before is not None and id(t) not in state_before:
                continue
            if (memory := memory_of(t)) is not None:
                owners.setdefault(memory, set()).add(name)
    return [frozenset(owners.get(memory, ())) if (memory := memory_of(t)) is not None else frozenset()
            for t in tc.pytree.tree_leaves(outputs) if isinstance(t, torch.Tensor)]


def differences(e_shared: list[frozenset[str]], p_shared: list[frozenset[str]]) -> list[str]:
    """Each output whose memory eager shares with some input or state and the program does
    not (or the other way round), said in words. Only whether any name is shared and which
    ones are compared where both share: a program may hold tied names as one tensor or two."""
    found = []
    for i, (e, p) in enumerate(zip(e_shared, p_shared)):
        if bool(e) != bool(p) or (e and p and not e & p):
            found.append(f"output[{i}] shares memory with {_say(e)} in eager, with {_say(p)} in the program "
                         "(a later write to one shows through the other)")
    return found


def _say(names: frozenset[str]) -> str:
    return ", ".join(sorted(names)) if names else "nothing"
