"""Each other name of a tied parameter or buffer gets an input of its own, which the
graph does not read.

The graph reads a tensor registered under several names (``lm_head.weight`` tied to
``embed.weight``) through one placeholder, so a write to it is carried once. But
torch's ``module()``, and so a program loaded with plain ``torch.export.load``,
registers only the names the signature lists: the other name would be missing
from its ``state_dict`` and ``load_state_dict(model.state_dict())`` would fail.
torch.export lists every name too. In memory (and with ``pf.load``) the names are
one tensor object, so the module keeps them tied; plain ``torch.export.load``
gives each name its own tensor, and the graph reads the first.
"""

from __future__ import annotations

import torch
from torch.export.graph_signature import ExportGraphSignature, InputSpec, TensorArgument

from ..artifacts import InputSlot, Placeholders, SlotKind
from .lift import placeholder_name


def with_tied_names(gm: torch.fx.GraphModule, signature: ExportGraphSignature,
                    placeholders: Placeholders) -> ExportGraphSignature:
    """``signature`` with an input spec and an unread placeholder for each other name of a
    lifted parameter or buffer, placed right after the placeholder of the name it ties to."""
    aliases: dict[str, list[str]] = {}
    for alias, target in placeholders.inputs.aliases:
        aliases.setdefault(target, []).append(alias)
    if not aliases:
        return signature
    specs = []
    for spec, (node, slot) in zip(signature.input_specs, placeholders.pairs()):
        specs.append(spec)
        if slot.kind not in (SlotKind.PARAMETER, SlotKind.BUFFER) or slot.target not in aliases:
            continue
        after = node
        for alias in aliases[slot.target]:
            with gm.graph.inserting_after(after):
                after = gm.graph.placeholder(placeholder_name(InputSlot(slot.kind, alias, slot.value)))
            after.target = after.name
            after.meta["val"] = node.meta.get("val")
            specs.append(InputSpec(spec.kind, TensorArgument(after.name), target=alias, persistent=spec.persistent))
    return ExportGraphSignature(specs, signature.output_specs)
