"""``with refused(Refusal.X, r"pattern"):``: the block must raise UnsupportedError of kind X.

Tests match the refusal's kind (data), and the pattern only for what the
message must name (the op, the user's line), never for which limit it is;
``at_line`` writes the user's-line part.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator

import pytest

import predispatch_func as pf


@contextlib.contextmanager
def refused(kind: pf.Refusal, pattern: str = "") -> Iterator[None]:
    with pytest.raises(pf.UnsupportedError, match=pattern) as caught:
        yield
    assert caught.value.kind is kind, f"refused as {caught.value.kind}, expected {kind}"


def at_line(test_file: str, code: str) -> str:
    """Regex for where a message points into a test's model: ``<test_file>:<line> in forward``
    and then the source line ``code`` (a regex). Pass ``__file__``, so a moved test still matches."""
    return re.escape(os.path.basename(test_file)) + r":\d+ in forward\n\s+" + code
