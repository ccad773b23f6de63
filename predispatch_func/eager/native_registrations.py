"""The Python side of the session's C++ kernels (``native/``): registering each, counting
the calls it served into a session's stats, unregistering.

Two kinds, each in front of the op's Python kernel (``keyed_kernels``), which serves every
call the C++ one leaves:

* ``NativeTwin``: an in-place op through a twin taking the same arguments (``add_``), or an
  out= op through a twin taking the others (``mm.out``);
* ``NativeReplay``: a decomposed op, its cached per-signature kernels replayed in C++
  (programs read from them by ``graph_programs``);
* ``NativeKeyOff``: an op of the target whose inner calls are the backend's, run with the key off
  (no Python kernel behind it: it decides nothing);
* ``NativeMathAttention``: sdpa's math path on a device's Autograd key (``attention_path``), in
  place of its Python kernel.

None of them where the C++ kernels are not built here (``native_kernels``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .. import _torch_compat as tc
from . import cache, native_kernels
from .graph_programs import known_programs, program_of
from .keyed_kernels import in_place_with_same_arguments, out_with_same_arguments
from .mode import EagerMode, Kernels
from .plans import How
from .replay import TracedKernel


class NativeKernel:
    """One C++ kernel registered on a key: its op, and the module's index for it. The calls it
    serves are counted in C++; ``take_served`` drains the count into a session's stats (``_count``:
    what each kind counts, as its Python kernel would), ``unregister`` removes it."""

    __slots__ = ("op", "_native", "_index")

    def __init__(self, op: tc.OpOverload, native: Any, index: int):
        self.op, self._native, self._index = op, native, index

    def take_served(self, mode: EagerMode) -> None:
        served = self._native.take_served(self._index)
        if served:
            self._count(mode, served)

    def _count(self, mode: EagerMode, served: int) -> None:
        pass

    def unregister(self) -> None:
        self._native.unregister(self._index)


class NativeTwin(NativeKernel):
    """``op``'s C++ kernel on the key (``native/through_twin.cpp``): ``keyed_kernels._through_twin_in_place``'s
    fast path without a trip into Python, the Python kernel taking every other call; its calls
    count as the Python kernel counts its own."""

    __slots__ = ("twin", "twin_in_target")

    def __init__(self, op: tc.OpOverload, twin: tc.OpOverload, twin_in_target: bool, native: Any, index: int):
        super().__init__(op, native, index)
        self.twin, self.twin_in_target = twin, twin_in_target

    def _count(self, mode: EagerMode, served: int) -> None:
        mode.stats.decomposed.add(self.op, served)
        mode.stats.served_in_cpp.add(self.op, served)
        if self.twin_in_target:  # (another twin's kernel counts its own calls)
            mode.stats.reached.add(self.twin, served)
        mode.stats.reached.add(torch.ops.aten.copy_.default, served)


def native_through_twin(op: tc.OpOverload, how: How, kernels: Kernels, kernel: Callable[..., Any],
                        key: str) -> NativeTwin | None:
    """Registers ``op``'s C++ kernel on ``key`` where its plan is an in-place op through a twin
    taking the same arguments (``add_``, ``mul_``; ``masked_fill_`` and ``silu_``, whose twins are
    lowered by their own kernels on the key), or an out= op whose twin takes its arguments but
    ``out`` (``mm.out``), ``kernel`` (its Python kernel) serving what the C++ one leaves; None
    where it does not apply or the C++ kernels are not built here (``native_kernels``)."""
    if how is not How.THROUGH_TWIN:
        return None
    plan = kernels.plan(op)
    if plan is None or plan.twin is None or id(torch.ops.aten.copy_.default) not in kernels.direct_ids:
        return None
    out_variant = out_with_same_arguments(plan)
    if not (out_variant or in_place_with_same_arguments(plan)):
        return None
    native = native_kernels.module()
    if native is None:
        return None
    schema, twin_schema = tc.schema_of(op), tc.schema_of(plan.twin)
    twin_in_target = id(plan.twin) in kernels.direct_ids
    resizes = id(torch.ops.aten.resize_.default) in kernels.direct_ids  # (else an empty out= is Python's)
    index = native.register_through_twin(schema.name, schema.overload_name, twin_schema.name,
                                         twin_schema.overload_name, twin_in_target, out_variant, resizes, key,
                                         kernel)
    return NativeTwin(op, plan.twin, twin_in_target, native, index)


class NativeReplay(NativeKernel):
    """A decomposed op's C++ kernel on the key (``native/graph_replay.cpp``):
    ``keyed_kernels._replaying`` without a trip into Python, for each signature whose traced
    kernel it has learned. The calls it serves count as the Python replay counts its own (a
    cache hit of a decomposed op)."""

    __slots__ = ()

    def _count(self, mode: EagerMode, served: int) -> None:
        mode.stats.decomposed.add(self.op, served)
        mode.stats.cache_hits.add(self.op, served)
        mode.stats.served_in_cpp.add(self.op, served)


def native_replay(op: tc.OpOverload, how: How, kernels: Kernels, kernel: Callable[..., Any],
                  key: str) -> NativeReplay | None:
    """Registers ``op``'s C++ replay on ``key`` where its plan decomposes it, ``kernel`` (its
    Python kernel) serving the calls the C++ one has no program for, and answering the
    program of the signature it served (from the kernel traced or replayed for it)."""
    if how is not How.DECOMPOSE:
        return None
    native = native_kernels.module()
    if native is None:
        return None
    traced_by_signature = kernels.kernels_of(op)

    def in_python(args: tuple, kwargs: dict, native_key: tuple[int, ...] | None) -> tuple[Any, Any]:
        """The call, and where the C++ replay keyed it (``native_key``), the program it runs
        for that key from now on (recorded with the kernel, which keeps it on disk)."""
        result = kernel(*args, **kwargs)
        program = None
        if native_key is not None:
            traced = traced_by_signature.get(cache.signature(args, kwargs)[0])
            if isinstance(traced, TracedKernel):
                program = program_of(traced, op)
                if program is not None:
                    traced.native_keys.add(native_key)
        return result, program

    schema = tc.schema_of(op)
    native.set_replay_enabled(_replay_enabled[0])
    index = native.register_graph_replay(schema.name, schema.overload_name, key, in_python,
                                         known_programs(traced_by_signature))
    return NativeReplay(op, native, index)


class NativeKeyOff(NativeKernel):
    """An op of the target run with the key off (``native/key_off.cpp``): the C++ form of
    ``session_key._as_backend_kernel``. Its calls are the target's, not the session's lowering:
    no statistic counts them (as none counts the Python kernel's)."""

    __slots__ = ()


def native_with_key_off(op: tc.OpOverload, key: str) -> NativeKeyOff | None:
    """Registers ``op``'s kernel running it with ``key`` off; None where the C++ kernels are not
    built here (the Python kernel then does the same)."""
    native = native_kernels.module()
    if native is None:
        return None
    schema = tc.schema_of(op)
    return NativeKeyOff(op, native, native.register_with_key_off(schema.name, schema.overload_name, key))


class NativeMathAttention(NativeKernel):
    """sdpa's math path on one Autograd key (``native/math_attention.cpp``), registered for as
    long as a session holds it (``above_autograd.AutogradKernels``); ``release`` counts the calls
    it served through ``on_call`` (as the Python kernel counts each) and unregisters it."""

    __slots__ = ("_on_call",)

    def __init__(self, native: Any, index: int, on_call: Callable[..., None] | None):
        super().__init__(torch.ops.aten.scaled_dot_product_attention.default, native, index)
        self._on_call = on_call

    def release(self) -> None:
        served = self._native.take_served(self._index)
        if served and self._on_call is not None:
            self._on_call(self.op, served)
        self.unregister()


def native_math_attention(key: str, devices: frozenset[str],
                          on_call: Callable[..., None] | None) -> NativeMathAttention | None:
    """Registers sdpa's C++ math-path kernel on ``key`` for queries on ``devices``; None where the
    C++ kernels are not built here (the Python kernel then serves)."""
    native = native_kernels.module()
    if native is None:
        return None
    return NativeMathAttention(native, native.register_math_attention(key, sorted(devices)), on_call)


_replay_enabled = [True]


def set_replay_enabled(enabled: bool) -> None:
    """The C++ replays serve calls only for a session that caches (``use_cache``)."""
    _replay_enabled[0] = enabled
    native = native_kernels.module() if native_kernels.loaded() else None
    if native is not None:
        native.set_replay_enabled(enabled)


def native_first_meeting(key: str, with_kernel: list[str], meet: Callable[[str], None]) -> Any:
    """Installs the key's fallback in C++ (``native/first_meeting.cpp``): an op reaching the key
    unmet gets its fallthrough there, one named in ``with_kernel`` is met by ``meet(name)``, which
    registers its kernel. Returns the module (``meet_through``, ``met_through``,
    ``remove_first_meeting``); None where the C++ kernels are not built here."""
    native = native_kernels.module()
    if native is None:
        return None
    native.install_first_meeting(key, with_kernel, meet)
    return native
