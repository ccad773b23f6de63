"""What one eager session did: the counts a backend writer reads (and the CLI prints)."""

from __future__ import annotations

import collections
import dataclasses
from typing import Any


@dataclasses.dataclass
class EagerStats:
    """Calls by op, kept as the op objects on the hot path and named on read.

    ``reached``: calls that ran on the backend as they were (inside the target or
    the floor); ops run inside a replayed kernel are counted once, when traced.
    ``decomposed``: calls of ops outside the target, run as their decomposition.
    ``cache_hits`` / ``cache_misses``: replays of a traced kernel / traces made.
    ``uncached``: decompositions run as Python each call (data-dependent, or a
    trace the fake tensors could not make). ``unreachable``: ops with no path
    into the target, with the user's lines that called them (only filled when
    the session runs them anyway, ``on_unreachable="run"``).
    """

    reached: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    decomposed: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    cache_hits: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    cache_misses: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    uncached: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    above_autograd: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    unreachable: dict[Any, list[str]] = dataclasses.field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        def named(counter: collections.Counter) -> dict[str, int]:
            return {str(op): n for op, n in sorted(counter.items(), key=lambda kv: str(kv[0]))}
        return {
            "reached": named(self.reached),
            "decomposed": named(self.decomposed),
            "cache_hits": named(self.cache_hits),
            "cache_misses": named(self.cache_misses),
            "uncached": named(self.uncached),
            "above_autograd": named(self.above_autograd),
            "unreachable": {str(op): lines for op, lines in sorted(self.unreachable.items(), key=lambda kv: str(kv[0]))},
        }

    def distinct_reached(self) -> set[str]:
        return {str(op) for op in self.reached}
