"""The inputs a program must not be called with requiring grad.

A value computed under grad mode from a float input may carry a gradient when
the program runs, and writing it through a ``detach()``-ed alias gives eager's
alias its own autograd history, which a functional program cannot hold
(``GRAD_VALUE_THROUGH_DETACH``). Where nothing it was computed from requires
grad in the export, there is no gradient to change: the write is exported
without autograd (``trace/observers.py`` notes it as a ``GradFreeWrite``), and
the program holds exactly while those inputs still do not require grad::

    v = x.detach(); v[:2].copy_(x * 2)    # x exported without grad: exported
    ep.module()(x.requires_grad_())       # refused when called, naming x and the line

This module names those inputs for ``ep.module()``'s check (``export.py``) and
``verify``'s replay; a write whose value comes from a body's operands (a custom
Function's or hook's body, a torch HOP's) has no program input to check, so it
is refused as before.
"""

from __future__ import annotations

from ..artifacts import GradFreeWrite, Placeholders, SlotKind
from ..trace.observers import grad_value_through_detach


def inputs_without_grad(writes: tuple[GradFreeWrite, ...], placeholders: Placeholders) -> dict[str, str]:
    """User input (its placeholder's name) or parameter/buffer (its fqn) -> the user's line of
    the first write that needs it without grad; refuses a write from anything else."""
    slot_of = {node: slot for node, slot in placeholders.pairs()}
    found: dict[str, str] = {}
    for write in writes:
        if any(source not in slot_of for source in write.sources):
            raise grad_value_through_detach(write.op, write.line, " inside a body the program cannot check",
                                            value="a value that may require grad")
        for source in write.sources:
            slot = slot_of[source]
            if slot.kind is SlotKind.CONSTANT:  # a program constant never requires grad
                continue
            found.setdefault(source.name if slot.kind is SlotKind.USER else slot.target, write.line or "")
    return found


def refuse_in_body(writes: tuple[GradFreeWrite, ...]) -> None:
    """A body (a custom Function's, a hook's) has no program input to check: refuse its writes."""
    if writes:
        raise grad_value_through_detach(writes[0].op, writes[0].line, " inside a body the program cannot check",
                                        value="a value that may require grad")
