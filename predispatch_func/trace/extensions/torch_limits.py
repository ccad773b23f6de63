"""Where torch itself cannot trace a higher-order op, a clear refusal instead of its assert.

Each entry: torch's error (``_torch_compat/error_texts.py``: the exception type
and the text in its message), our kind, and our explanation with what to write
instead. torch's own functional pre-dispatch path
(``aot_export_module(pre_dispatch=True)``) fails on the same programs;
``torch.export.export``, which does not functionalize, traces them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ... import _torch_compat as tc
from ...errors import Refusal, UnsupportedError, user_source_line

_LIMITS = (
    (tc.error_texts.HOP_BODY_INPUT_MUTATION, Refusal.HOP_BODY_WRITES_OPERANDS,
     "torch cannot capture this higher-order op: {first}. torch refuses a HOP body that writes "
     "its operands or a closed-over tensor (cond, while_loop, map, scan): return the new value "
     "instead and write it outside the call"),
    (tc.error_texts.FUNCTIONAL_TENSOR_ON_ITS_OWN, Refusal.FUNC_TRANSFORM_IN_HOP_BODY,
     "torch's functionalization cannot trace torch.vmap (or another torch.func transform) "
     "inside the body of a higher-order op (cond, map, scan, while_loop): torch captures the "
     "body with the transform's level calls in it. Call the transform outside the HOP and "
     "pass its result in (in forward itself it is exported)"),
    (tc.error_texts.TENSOR_DTYPE_MISMATCH, Refusal.AUTOCAST_IN_HOP_BODY,
     "torch's functionalization of a HOP body re-runs it without the autocast region inside "
     "it, so dtypes disagree ({first}); put the autocast region around the HOP call instead of "
     "inside its body"),
)


@contextlib.contextmanager
def torch_hop_limits_refused() -> Iterator[None]:
    try:
        yield
    except UnsupportedError:
        raise
    except Exception as exc:
        ours = _our_refusal_inside(exc)
        if ours is not None:  # raised inside dynamo's capture of a HOP body, which wraps it
            raise ours from exc
        for torch_error, kind, explanation in _LIMITS:
            if torch_error.matches(exc):
                first = next((line.strip() for line in str(exc).splitlines()
                              if line.strip() and "doesn't work unless" not in line), "")
                raise UnsupportedError(explanation.format(first=first), kind=kind,
                                       source=user_source_line(exc.__traceback__)) from exc
        raise


def _our_refusal_inside(exc: BaseException) -> UnsupportedError | None:
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, UnsupportedError):
            return cause
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return None
