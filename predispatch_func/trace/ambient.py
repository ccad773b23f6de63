"""The caller's grad mode, inference mode and autocast, as the program's outer regions.

``with torch.no_grad(): ep = export(model, args)`` must give what the model
does under ``no_grad``: its Python code may branch on the mode (fast paths,
``if torch.is_grad_enabled()``), and every op runs under it. So the trace runs
the model under the caller's modes, entered *inside* the traced function, where
they are recorded like the model's own ``torch.no_grad()`` / ``torch.autocast``:
the program's whole forward is a grad region (``inference_mode`` becomes
``no_grad``: a program has no inference tensors) and an autocast region. The
program then computes the same values whether it is later called inside or
outside that mode, as the model did under it.

Outside the traced function the tracer runs with grad on, inference mode and
autocast off (the state the region pass starts from).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

import torch

from .. import _torch_compat as tc

# the meta key of the grad markers the trace records for the caller's own modes
# (outer regions); the region stage (regions/frames.py) reads it
AMBIENT = "pf_ambient_grad"

_DEVICES = ("cpu", "cuda")


@dataclasses.dataclass(frozen=True)
class AmbientModes:
    grad_enabled: bool
    inference: bool
    autocast: tuple[tuple[str, Any], ...]  # (device, dtype) of every device with autocast on
    autocast_cache: bool

    @classmethod
    def of_caller(cls) -> AmbientModes:
        return cls(torch.is_grad_enabled(), torch.is_inference_mode_enabled(),
                   tuple((d, torch.get_autocast_dtype(d)) for d in _DEVICES if torch.is_autocast_enabled(d)),
                   torch.is_autocast_cache_enabled())

    @contextlib.contextmanager
    def neutral(self) -> Iterator[None]:
        """Grad on, inference mode and autocast off: where the tracer itself runs."""
        with contextlib.ExitStack() as stack:
            if self.inference:
                stack.enter_context(torch.inference_mode(False))
            stack.enter_context(torch.enable_grad())
            for device, dtype in self.autocast:
                stack.enter_context(torch.autocast(device, dtype=dtype, enabled=False))
            yield

    @contextlib.contextmanager
    def entered(self) -> Iterator[None]:
        """The caller's modes again, inside the traced function, so they are recorded."""
        with contextlib.ExitStack() as stack:
            if not self.grad_enabled or self.inference:
                stack.enter_context(_marked_no_grad("inference" if self.inference else "no_grad"))
            for device, dtype in self.autocast:
                stack.enter_context(torch.autocast(device, dtype=dtype, cache_enabled=self.autocast_cache))
            yield


    @contextlib.contextmanager
    def for_reference(self) -> Iterator[None]:
        """The modes the program holds as its outer regions, for running the model
        eagerly beside it (``pf.verify``)."""
        with contextlib.ExitStack() as stack:
            if self.inference:
                stack.enter_context(torch.inference_mode())
            elif not self.grad_enabled:
                stack.enter_context(torch.no_grad())
            for device, dtype in self.autocast:
                stack.enter_context(torch.autocast(device, dtype=dtype, cache_enabled=self.autocast_cache))
            yield


@contextlib.contextmanager
def _marked_no_grad(kind: str) -> Iterator[None]:
    """``torch.no_grad()`` whose two markers say they are the caller's, so the region
    pass nests the model's own toggles inside it (see regions/frames.py)."""
    with torch.no_grad():
        _tag_last_marker(False, kind)
        yield
    _tag_last_marker(True, kind)


def _tag_last_marker(enabled: bool, kind: str) -> None:
    node = tc.last_recorded_node()
    if node is not None and node.target is tc.SET_GRAD_ENABLED and node.args[0] is enabled:
        node.meta[AMBIENT] = kind
