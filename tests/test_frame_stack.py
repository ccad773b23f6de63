"""The entry points run on one large frame-stack chunk (predispatch_func/frame_stack.py).

Pins CPython's behaviour the module works around (a recursion crossing frame-stack chunk
boundaries maps and faults pages in on every pass) and that the large frame removes it.
"""

import inspect
import resource
import sys

import pytest
import torch

import predispatch_func as pf
from predispatch_func import frame_stack
from predispatch_func.frame_stack import on_a_reserved_frame_stack

pytestmark = pytest.mark.skipif(sys.implementation.name != "cpython" or sys.version_info < (3, 11),
                                reason="CPython's frame stack in chunks is 3.11 on")

_DEPTH = 600  # frames of _down: several 16 KiB chunks, whatever the depth the test starts at
_PASSES = 200


def _down(n: int) -> int:
    return 0 if n == 0 else _down(n - 1) + 1


def _faults_over_passes() -> int:
    _down(_DEPTH)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(_PASSES):
        _down(_DEPTH)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def test_cpython_maps_a_chunk_each_time_the_recursion_crosses_into_it() -> None:
    """The assumption: without the large frame, every pass faults fresh pages in (the chunks
    it crossed into were unmapped on the way back). If CPython stops doing so, the large frame
    is no longer needed."""
    assert _faults_over_passes() >= _PASSES


def test_under_the_large_frame_the_recursion_stays_in_one_chunk() -> None:
    faults = on_a_reserved_frame_stack(_faults_over_passes)()
    assert faults < _PASSES // 4


def test_nested_entry_points_take_one_large_frame() -> None:
    seen = []

    @on_a_reserved_frame_stack
    def inner() -> None:
        seen.append(sys._getframe(1).f_code.co_name)  # noqa: SLF001 (who called inner's body)

    @on_a_reserved_frame_stack
    def outer() -> None:
        assert frame_stack._RESERVED.get()  # noqa: SLF001
        inner()

    outer()
    assert seen == ["entry"]  # inner's wrapper called it directly: no second large frame
    assert not frame_stack._RESERVED.get()  # noqa: SLF001


def test_export_runs_on_the_large_frame_and_keeps_its_signature() -> None:
    reached = []

    class M(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            frame = sys._getframe()  # noqa: SLF001
            while frame is not None and frame.f_code.co_name != "_through_a_large_frame":
                frame = frame.f_back
            reached.append(frame is not None and frame.f_code.co_stacksize >= 60_000)
            return x.sin()

    x = torch.randn(3)
    ep = pf.export(M(), (x,))
    assert reached and all(reached)
    torch.testing.assert_close(ep.module()(x), x.sin())
    assert list(inspect.signature(pf.export).parameters)[:3] == ["model", "args", "kwargs"]
    assert pf.export.__name__ == "export" and pf.verify.__name__ == "verify"
