"""From a verdict to a decision: keep the composite as one node, or decompose it.

Only an honest composite with a functional schema is kept; a lie, a
may-alias result, an alias/mutation annotation, torch's own
``maybe_aliasing_or_mutating`` tag, or the lack of any successful run all mean
decompose (decomposing is always correct, only less high-level). A user
override wins, and the entry remembers what the audit said underneath it.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from .. import _torch_compat as tc
from .verdicts import HONEST, LIES_ALIAS, LIES_MUTATION, MAYBE_ALIAS, UNTESTED

if TYPE_CHECKING:  # the checker is the auditing code; an export only reads entries
    from .checker import CheckResult

KEEP = "keep"
DECOMPOSE = "decompose"
LIES = (LIES_ALIAS, LIES_MUTATION)


@dataclasses.dataclass
class Entry:
    """One row of the audit: what we saw, what we decide, what torch does."""

    op: str
    verdict: str
    decision: str
    evidence: str
    composite: bool
    torch_tagged: bool  # torch's maybe_aliasing_or_mutating tag
    torch_keeps: bool  # torch.export (pre-dispatch) keeps it as one node
    schema: str
    runs: int = 0
    crashes: list[str] = dataclasses.field(default_factory=list)
    override: str | None = None  # the user's decision, when it differs from ours
    audit_decision: str | None = None  # what the audit said under an override
    # sparse layouts the op accepts but no sample ran on: a kept composite called with
    # one of them is decomposed (nothing vouches for it there)
    untested_layouts: list[str] = dataclasses.field(default_factory=list)
    # the layouts of the inputs on which it lied (``strided``, ``sparse_coo``, ...): a composite
    # that lies on sparse inputs only is decomposed all the same, and this says where it lies
    lies_on_layouts: list[str] = dataclasses.field(default_factory=list)

    @property
    def lies(self) -> bool:
        return self.verdict in LIES

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Entry:
        return cls(**data)


def decide(op: tc.OpOverload, verdict: str) -> tuple[str, str]:
    """(decision, why) for ``op`` given the audit's verdict."""
    if verdict in LIES:
        return DECOMPOSE, "its behaviour contradicts its schema"
    if verdict == MAYBE_ALIAS:
        return DECOMPOSE, "its result aliases its input on some inputs only"
    if verdict == UNTESTED:
        return DECOMPOSE, "no sample ran, so nothing vouches for it"
    schema = tc.schema_of(op)
    if schema.is_mutable or any(a.alias_info for a in schema.arguments):
        return DECOMPOSE, "its schema declares aliasing or mutation"
    if tc.torch_tags_unsafe(op):
        return DECOMPOSE, "torch tags it maybe_aliasing_or_mutating"
    assert verdict == HONEST
    return KEEP, "honest with a functional schema"


def tag(op: tc.OpOverload, result: CheckResult) -> Entry:
    decision, why = decide(op, result.verdict)
    evidence = result.evidence if decision == KEEP or result.verdict != HONEST else f"{why}; {result.evidence}"
    return Entry(
        op=str(op), verdict=result.verdict, decision=decision, evidence=evidence,
        composite=bool(tc.has_composite_implicit_kernel(op)),
        torch_tagged=tc.torch_tag_maybe_aliasing(op), torch_keeps=tc.torch_export_keeps(op),
        schema=str(tc.schema_of(op)), runs=result.runs, crashes=list(result.crashes),
        untested_layouts=list(result.untested_layouts), lies_on_layouts=list(result.lying_layouts),
    )


def apply_overrides(entries: list[Entry], overrides: dict[str, str] | None) -> list[Entry]:
    """Entries with the user's per-op decisions applied (and shown)."""
    out = []
    for e in entries:
        wanted = (overrides or {}).get(e.op)
        if wanted is None or wanted == e.decision:
            out.append(e)
            continue
        if wanted not in (KEEP, DECOMPOSE):
            raise ValueError(f"override for {e.op} must be 'keep' or 'decompose', got {wanted!r}")
        out.append(dataclasses.replace(e, decision=wanted, override=wanted, audit_decision=e.decision))
    return out
