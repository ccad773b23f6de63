"""``pf.eager.register(key, target)``: the same kernels on a real backend's dispatch key.

A backend that implements ``target`` plus the runtime floor on its dispatch
key (``"PrivateUse1"``) gets, for every other aten op with a path into the
target, a kernel on that key that runs the op's plan: the cached
decomposition, the functional twin plus the write, and so on. Its calls reach
the dispatcher again, so they land on the backend's own kernels or on other
registered ones, and no dispatch mode is needed: ops in the target never touch
Python. The ops that must be decomposed where autograd sees them get a kernel
on the backend's Autograd key instead.

Registration refuses, up front and by name, a backend without a kernel for a
floor op (``EAGER_BACKEND_LACKS_FLOOR``): without them no decomposition can
run there.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

from .. import _torch_compat as tc
from ..errors import Refusal, UnsupportedError
from ..opsets import OpSet
from .floor import RUNTIME_FLOOR
from .mode import EagerMode
from .plans import How


class BackendLacksFloorError(UnsupportedError):
    """The backend has no kernel for some ops of the runtime floor."""

    def __init__(self, key: str, missing: list[str]):
        self.missing = missing
        super().__init__(
            f"the backend on dispatch key {key!r} has no kernel for {len(missing)} op(s) of the runtime floor "
            f"(pf.eager.RUNTIME_FLOOR), which eager execution cannot do without: {', '.join(missing)}",
            kind=Refusal.EAGER_BACKEND_LACKS_FLOOR)


class Registration:
    """The kernels registered for one backend; ``remove()`` unregisters them all. ``unreachable``:
    the aten ops outside the target with no path into it, which the backend must implement itself
    if its models call them (nothing is registered for them)."""

    def __init__(self, key: str, target: OpSet, mode: EagerMode, libraries: list[Any], ops: list[Any],
                 unreachable: list[Any]):
        self.key, self.target, self.mode, self.ops, self.unreachable = key, target, mode, ops, unreachable
        self._libraries = libraries

    @property
    def stats(self) -> Any:
        return self.mode.stats

    def remove(self) -> None:
        for library in self._libraries:
            library._destroy()  # noqa: SLF001  (torch.library's only way to unregister)
        self._libraries = []


def register(key: str, target: OpSet, *, floor: OpSet = RUNTIME_FLOOR) -> Registration:
    """Register, on dispatch key ``key``, a kernel for every aten op outside ``target | floor``
    that has a path into the target (see the module docstring)."""
    missing = [str(op) for op in floor if not tc.backend_has_kernel(op, key)]
    if missing:
        raise BackendLacksFloorError(key, missing)
    mode = EagerMode(target, floor=floor)
    kernels = mode.kernels
    libraries: dict[str, torch.library.Library] = {}  # by namespace: aten, and a custom op's the user decomposes
    registered, unreachable = [], []
    with warnings.catch_warnings():  # overriding torch's composite kernels for this key is the point
        warnings.simplefilter("ignore", UserWarning)
        for op, plan in kernels.governed_outside():
            if plan.how is How.UNREACHABLE:
                unreachable.append(op)
            if plan.how in (How.UNREACHABLE, How.COMPOSITE_KERNEL):
                continue  # the backend runs torch's composite kernel itself, or fails by its own means
            if op.namespace not in libraries:
                libraries[op.namespace] = torch.library.Library(op.namespace, "IMPL")
            libraries[op.namespace].impl(op, _kernel(mode, op), key)
            registered.append(op)
        autograd_library = torch.library.Library("aten", "IMPL")
        for op, decomposition in kernels.lifted:
            autograd_library.impl(op, decomposition, f"Autograd{key}")
            registered.append(op)
    return Registration(key, target, mode, [*libraries.values(), autograd_library], registered, unreachable)


def _kernel(mode: EagerMode, op: Any) -> Callable:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        return mode.run(op, args, kwargs)
    return kernel
