"""``tensor.data`` while tracing: what eager does, in terms the functional trace sees.

In eager, ``w.data`` is an alias of ``w`` that autograd does not see, and
``w.data = v`` gives ``w`` the value of ``v`` while ``w`` stays the same leaf
(weight clipping, EMA updates, resets). On a functional tensor both happen
below the dispatcher, so a trace sees nothing: a write through ``.data``
would be recorded as differentiable, and ``w.data = v`` would be lost.

:class:`TensorDataMode` makes them visible: a read is ``w.detach()`` (writes
through it are then writes with grad off that keep ``w``'s identity, as for
any detached alias), and ``w.data = v`` is ``w.copy_(v)`` under ``no_grad``
(a parameter or buffer mutation whose new value does not carry ``v``'s
autograd history). Eager lets ``w.data = v`` change the shape or dtype of
``w``; a program's state has fixed metadata, so that is refused, as is a
change of device.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from ..errors import Refusal, UnsupportedError, user_source_line


def _is_data(func: Any, accessor: str) -> bool:
    return getattr(func, "__name__", None) == accessor and getattr(func, "__self__", None) is torch.Tensor.data


class TensorDataMode(TorchFunctionMode):
    """Turns ``.data`` reads into ``detach()`` and ``.data = v`` into a no_grad ``copy_``."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
        if _is_data(func, "__get__"):
            return args[0].detach()
        if _is_data(func, "__set__"):
            target, value = args
            if not isinstance(value, torch.Tensor) or (target.shape, target.dtype, target.device) != (
                    value.shape, value.dtype, value.device):
                raise UnsupportedError(
                    f"`tensor.data = value` changes the tensor from {target.dtype}{list(target.shape)} to "
                    f"{getattr(value, 'dtype', type(value).__name__)}{list(getattr(value, 'shape', []))}: "
                    "a program's state keeps its shape and dtype; assign a value of the same shape and "
                    "dtype (or register a buffer of the new shape in __init__)",
                    kind=Refusal.DATA_ASSIGN_NEW_METADATA, op="Tensor.data.__set__", source=user_source_line())
            with torch.no_grad():
                target.copy_(value)
            return None
        return func(*args, **(kwargs or {}))
