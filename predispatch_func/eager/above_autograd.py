"""Ops decomposed above autograd, so autograd differentiates their decomposition.

A dispatch mode (or the session's key) runs below autograd: by the time it
sees a forward op, autograd has recorded that op's own backward formula,
which will later call the fused backward op with the forward's outputs. That
is right when the decomposition returns every output the kernel does and the
fused backward has a decomposition too. Where the fused backward has none
(``_weight_norm_interface_backward``), only autograd of the forward's
decomposition stays inside the target. Such ops get a kernel on the Autograd
key for the length of the session, running the decomposition (traced once per
signature and replayed), so autograd records the decomposition's ops instead
and the fused backward is never called.

CPU flash attention was here until its fused backward got a decomposition
(``extra_decompositions``): decomposed below autograd it costs two calls into
Python a layer instead of some fifty ops recorded by autograd.

The table is data, found by experiment (the op_db coverage run with
gradients) and checked by a test that torch still lacks the decomposition.
"""

from __future__ import annotations

import functools
import threading
import warnings
from collections.abc import Callable
from typing import Any

import torch

from .. import _torch_compat as tc
from ..opsets import Lowering
from . import cache, extra_decompositions

WHY: dict[str, str] = {
    "aten._weight_norm_interface.default":
        "its fused backward (_weight_norm_interface_backward) has no decomposition into ATen; autograd "
        "differentiating the decomposition needs none",
}

_lock = threading.Lock()
_active: dict[tuple[str, str], list[Any]] = {}  # (op, key) -> [library, users]


def ops_to_lift(lowering: Lowering) -> list[tuple[tc.OpOverload, Callable]]:
    """The table's ops outside the target that have a decomposition, with it."""
    found = []
    for name in WHY:
        op = tc.resolve_overload("aten", name.removeprefix("aten."))
        decomposition = (extra_decompositions.for_op(op) or lowering.decomposition(op)) if op is not None else None
        if op is not None and decomposition is not None:
            found.append((op, decomposition))
    return found


def lazily(op: tc.OpOverload, lowering: Lowering) -> Callable:
    """``op``'s decomposition, looked up on its first call (a table of a second's imports that a
    process whose list of lifted ops came from disk may never need)."""
    found: list[Callable] = []

    def decomposition(*args: Any, **kwargs: Any) -> Any:
        if not found:
            found.append(extra_decompositions.for_op(op) or lowering.decomposition(op))  # type: ignore[arg-type]
        return found[0](*args, **kwargs)
    return decomposition


class AutogradKernels:
    """Registers the kernels on ``key`` ("Autograd" for every device) while entered;
    shared by nested and concurrent sessions (registration is process-wide)."""

    def __init__(self, ops: list[tuple[tc.OpOverload, Callable]], key: str = "Autograd",
                 on_call: Callable[[tc.OpOverload], None] | None = None,
                 traces_of: Callable[[tc.OpOverload], dict[tuple, Any]] | None = None,
                 kernels: list[tuple[tc.OpOverload, str, Callable[[], Any]]] = ()):  # type: ignore[assignment]
        self._ops, self._key, self._on_call = ops, key, on_call
        # where each op's traces are kept (``Kernels.lifted_kernels_of``: on disk between processes)
        self._traces_of = traces_of or (lambda op: {})
        # kernels registered on the key given, not traced (``attention_path``): each built when
        # registered, a Python kernel or a C++ one its builder registered (which has ``release``)
        self._kernels = list(kernels)

    def __enter__(self) -> AutogradKernels:
        with _lock:
            for op, key, kernel in self._all():
                slot = _active.setdefault((str(op), key), [None, 0])
                if slot[1] == 0:
                    built = kernel()
                    if hasattr(built, "release"):  # a C++ kernel, registered by its builder
                        slot[0] = built.release
                    else:
                        library = torch.library.Library("aten", "IMPL")
                        with warnings.catch_warnings():  # "overriding a previously registered kernel": we mean to
                            warnings.simplefilter("ignore", UserWarning)
                            library.impl(op, built, key)
                        slot[0] = library._destroy  # noqa: SLF001  (torch.library's only way to unregister)
                slot[1] += 1
        return self

    def _all(self) -> list[tuple[tc.OpOverload, str, Callable[[], Any]]]:
        """Each op with its key and what builds its kernel (built only where this entry registers it)."""
        traced: list[tuple[tc.OpOverload, str, Callable[[], Any]]] = [
            (op, self._key, functools.partial(self._traced_kernel, op, d)) for op, d in self._ops]
        return traced + self._kernels

    def _traced_kernel(self, op: tc.OpOverload, decomposition: Callable) -> Callable:
        return _kernel(op, decomposition, self._on_call, self._traces_of(op))

    def __exit__(self, *exc: object) -> None:
        with _lock:
            for op, key, _ in self._all():
                slot = _active[(str(op), key)]
                slot[1] -= 1
                if slot[1] == 0:
                    slot[0]()  # unregisters
                    del _active[(str(op), key)]


def _kernel(op: tc.OpOverload, decomposition: Callable, on_call: Callable[[tc.OpOverload], None] | None,
            graphs: dict[tuple, Any]) -> Callable:
    """The decomposition, traced once per signature (``cache``) into ``graphs`` and replayed:
    its ops are dispatched from here, so autograd records them and the session lowers them."""

    def run(*args: Any, **kwargs: Any) -> Any:
        if on_call is not None:
            on_call(op)
        key, tensors = cache.signature(args, kwargs)
        graph = graphs.get(key)
        if graph is None:
            with tc.outside_trace(), tc.excluding_spare_key():  # nothing of the session sees the trace
                graph = graphs[key] = cache.trace(lambda a, k: decomposition(*a, **k), args, kwargs)
        if graph is cache.UNCACHEABLE:
            return decomposition(*args, **kwargs)
        return graph.run(*tensors)
    return run

