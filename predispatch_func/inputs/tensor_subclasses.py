"""A tensor subclass's own Python API in ``forward``: a clear refusal instead of torch's error.

The trace runs ``forward`` on functional tensors (``FunctionalTensor`` over a
fake), whatever the class of the input, parameter or result they stand for:
ops on a subclass value are traced through its ``__torch_dispatch__``, but a
method or attribute the subclass adds (``TwoTensor.get_elem_a``) is not there,
and a subclass built in ``forward`` cannot wrap them. Both fail deep in the
trace (``'FunctionalTensor' object has no attribute ...``, torch's
``flat_apply`` of the constructor); this names the subclass and what to do.
Only a failed trace is examined: nothing runs on the way of a good one.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import _torch_compat as tc
from ..errors import ExportError, Refusal, UnsupportedError


def refusal_for(err: ExportError) -> UnsupportedError | None:
    """Our refusal when ``err`` (a failed trace) came from a tensor subclass's own API."""
    cause = err.__cause__
    if cause is None:
        return None
    what = _subclass_api_read(cause) or _subclass_built(cause)
    if what is None:
        return None
    return UnsupportedError(f"{what}: the trace runs forward on functional tensors, which carry only torch.Tensor's "
                            "API (ops on subclass values are traced); call the subclass API outside the model, or "
                            "build the subclass outside and pass it in", kind=Refusal.TENSOR_SUBCLASS_IN_FORWARD,
                            op=err.op, source=err.source)


def _subclass_api_read(cause: BaseException) -> str | None:
    """``t.get_elem_a()`` on the tracing tensor of a subclass value that has it."""
    if not isinstance(cause, AttributeError) or not isinstance(getattr(cause, "obj", None), tc.FunctionalTensor):
        return None
    inner: Any = tc.value_behind_functional(cause.obj)
    cls = type(inner)
    name = getattr(cause, "name", None)
    if isinstance(inner, tc.FakeTensor) or cls is torch.Tensor or not name or not hasattr(inner, name):
        return None
    return f"forward uses {name!r} of tensor subclass {cls.__qualname__}"


def _subclass_built(cause: BaseException) -> str | None:
    cls = tc.subclass_built_in(cause.__traceback__)
    return f"forward builds tensor subclass {cls.__qualname__}" if cls is not None else None
