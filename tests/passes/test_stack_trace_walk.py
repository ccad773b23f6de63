"""The ``stack_trace`` walk reuses what it found below a waiting caller; it must find what a fresh walk finds.

A caller that moved to another line, a loop calling from one line, and a
generator resumed from two different callers are the cases where a reused walk
could name the wrong frames.
"""

import sys

from predispatch_func.passes.node_meta import _UserStack

SEEN: list[tuple[str, str]] = []


def _record(stack: _UserStack) -> None:
    # called as the torch-function mode calls it: two frames above the code being traced
    def probe():
        SEEN.append((stack(), _UserStack(bottom=stack_bottom)()))
    probe()


def test_reused_walks_match_fresh_walks():
    global stack_bottom
    stack_bottom = sys._getframe(0)
    stack = _UserStack(bottom=stack_bottom)
    SEEN.clear()

    def forward(depth):  # recorded frames are named forward
        if depth:
            for _ in range(2):
                walk(depth - 1)  # one line, called in a loop
            return walk(depth - 1)  # another line of the same waiting frame
        _record(stack)
    walk = forward

    def gen():
        def forward():
            _record(stack)
        while True:
            forward()
            yield

    def forward(g):  # a resumer, recorded
        next(g)
    forward_a = forward

    def forward(g):  # noqa: F811  (another resumer, at other lines)
        next(g)
    forward_b = forward

    walk(3)
    g = gen()
    forward_a(g)
    forward_b(g)
    forward_a(g)
    assert len(SEEN) == 27 + 3
    for reused, fresh in SEEN:
        assert reused == fresh
    assert len({reused for reused, _ in SEEN}) > 3  # the walks did see different stacks
