"""A tensor subclass's own Python API in ``forward`` that the trace cannot carry: a clear refusal.

The trace runs ``forward`` on functional tensors (``FunctionalTensor`` over a fake),
whatever the class of the input, parameter or result they stand for. For a traceable
wrapper subclass (``__tensor_flatten__``/``__tensor_unflatten__``: TwoTensor, torchao's
quantized weights) the subclass's attributes and methods are read through the traced
value and a subclass built in forward is recorded (trace/extensions/tensor_subclasses.py).
A subclass without that protocol has no inner tensors the program could name: an
attribute of its own read on the traced value fails deep in the trace (``'FunctionalTensor'
object has no attribute ...``); this names the subclass and what to do. Only a failed
trace is examined: nothing runs on the way of a good one.
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
    if _read_through_the_traced_wrapper(cause):
        return UnsupportedError(
            f"forward reads {cause.name!r} of the traced tensor's own wrapper: FunctionalTensor.elem hides a "  # type: ignore[attr-defined]
            "tensor subclass's inner tensor named 'elem'; rename the inner tensor (in __tensor_flatten__ and "
            "the attribute)", kind=Refusal.TENSOR_SUBCLASS_IN_FORWARD, op=err.op, source=err.source)
    what = _subclass_api_read(cause)
    if what is None:
        return None
    return UnsupportedError(f"{what}: the trace runs forward on functional tensors, which carry only torch.Tensor's "
                            "API and, for a subclass with __tensor_flatten__/__tensor_unflatten__, the "
                            "subclass's own; give the subclass that protocol, or call its API outside the model",
                            kind=Refusal.TENSOR_SUBCLASS_IN_FORWARD, op=err.op, source=err.source)


def _read_through_the_traced_wrapper(cause: BaseException) -> bool:
    """``t.elem.elem``: the first read returned the FunctionalTensor's own C++ wrapper (not the
    subclass's inner tensor ``elem``), which has no attribute of the subclass."""
    return isinstance(cause, AttributeError) and tc.is_bare_functional_wrapper(getattr(cause, "obj", None))


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
