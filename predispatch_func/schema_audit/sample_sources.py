"""Every sample the audit runs an op on, from every source: hand-written recipes (inputs a
schema cannot guess), the schema profiles of :mod:`.samples` (aimed at identity fast paths),
OpInfo's, and each of those again in the other layouts (:mod:`.layouts`).

The assembler lives apart from :mod:`.samples` because the sources build on its ``Sample``:
kept there, it made the four modules one import cycle."""

from __future__ import annotations

from .. import _torch_compat as tc
from .layouts import layout_samples
from .recipes import recipe_samples
from .samples import Sample, schema_samples


def samples_for(op: tc.OpOverload, *, use_opinfo: bool = True) -> tuple[list[Sample], list[str]]:
    """All samples for ``op``: recipes first, then the schema profiles, then OpInfo's, then
    those in the other layouts; with the reasons a schema could not be filled."""
    samples, reasons = schema_samples(op)
    samples = recipe_samples(op) + samples
    if use_opinfo and op.namespace == "aten":
        from .opinfo import opinfo_samples  # imports torch's OpInfo database: only when asked

        samples += opinfo_samples(op)
    samples += layout_samples(op, samples)
    return samples, reasons
