"""``with refused(Refusal.X, r"pattern"):``: the block must raise UnsupportedError of kind X.

Tests match the refusal's kind (data), and the pattern only for what the
message must name (the op, the user's line), never for which limit it is.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

import predispatch_func as pf


@contextlib.contextmanager
def refused(kind: pf.Refusal, pattern: str = "") -> Iterator[None]:
    with pytest.raises(pf.UnsupportedError, match=pattern) as caught:
        yield
    assert caught.value.kind is kind, f"refused as {caught.value.kind}, expected {kind}"
