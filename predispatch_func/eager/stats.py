"""What one eager session did: the counts a backend writer reads (and the CLI prints)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any


class OpCounter:
    """Calls by op, keyed by the op's ``id``: ``OpOverload.__hash__`` is Python code, and the
    mode counts on every call."""

    __slots__ = ("by_id",)

    def __init__(self) -> None:
        self.by_id: dict[int, list[Any]] = {}

    def add(self, op: Any, n: int = 1) -> None:
        entry = self.by_id.get(id(op))
        if entry is None:
            self.by_id[id(op)] = [op, n]
        else:
            entry[1] += n

    def __getitem__(self, op: Any) -> int:
        entry = self.by_id.get(id(op))
        return entry[1] if entry is not None else 0

    def __contains__(self, op: object) -> bool:
        return id(op) in self.by_id

    def __iter__(self) -> Iterator[Any]:
        return (entry[0] for entry in list(self.by_id.values()))

    def __len__(self) -> int:
        return len(self.by_id)

    def items(self) -> list[tuple[Any, int]]:
        return [(entry[0], entry[1]) for entry in self.by_id.values()]

    def __repr__(self) -> str:
        return f"OpCounter({dict((str(op), n) for op, n in self.items())})"


@dataclasses.dataclass
class EagerStats:
    """Calls by op, kept as the op objects on the hot path and named on read.

    ``reached``: calls that ran on the backend as they were (inside the target or
    the floor); ops run inside a replayed kernel are counted once, when traced.
    ``decomposed``: calls of ops outside the target, run as their decomposition.
    ``cache_hits`` / ``cache_misses``: replays of a traced kernel / traces made.
    ``uncached``: decompositions run as Python each call (data-dependent, or a
    trace the fake tensors could not make). ``served_in_cpp``: the decomposed calls the
    session's C++ kernels served (``native_registrations``: in-place ops through their twins,
    cached kernels replayed), no trip into Python; counted in ``decomposed`` (and a replay in
    ``cache_hits``) too. ``unreachable``: ops with no path
    into the target, with the user's lines that called them (only filled when
    the session runs them anyway, ``on_unreachable="run"``).
    """

    reached: OpCounter = dataclasses.field(default_factory=OpCounter)
    decomposed: OpCounter = dataclasses.field(default_factory=OpCounter)
    cache_hits: OpCounter = dataclasses.field(default_factory=OpCounter)
    cache_misses: OpCounter = dataclasses.field(default_factory=OpCounter)
    uncached: OpCounter = dataclasses.field(default_factory=OpCounter)
    above_autograd: OpCounter = dataclasses.field(default_factory=OpCounter)
    served_in_cpp: OpCounter = dataclasses.field(default_factory=OpCounter)
    unreachable: dict[Any, list[str]] = dataclasses.field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        def named(counter: OpCounter) -> dict[str, int]:
            return {str(op): n for op, n in sorted(counter.items(), key=lambda kv: str(kv[0]))}
        return {
            "reached": named(self.reached),
            "decomposed": named(self.decomposed),
            "cache_hits": named(self.cache_hits),
            "cache_misses": named(self.cache_misses),
            "uncached": named(self.uncached),
            "above_autograd": named(self.above_autograd),
            "served_in_cpp": named(self.served_in_cpp),
            "unreachable": {str(op): lines for op, lines in sorted(self.unreachable.items(), key=lambda kv: str(kv[0]))},
        }

    def distinct_reached(self) -> set[str]:
        return {str(op) for op in self.reached}
