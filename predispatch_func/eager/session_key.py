"""The fast path of ``pf.eager.on``: kernels on a dispatch key the session owns, no Python mode.

A Python dispatch mode sees every op, so each op costs a trip into Python
before anything is decided: 1.7-2.8x plain eager on small transformers whose
ops take microseconds, most of them ops in the target that only pass through.
Instead, every aten op outside ``target | floor`` gets a Python kernel (the
op's plan, as the mode runs it) on torch's spare functionality key (see
``_torch_compat.SPARE_KEY``: below autograd and the Python key, above every
backend), every other op falls through that key, and a session adds the key
to its thread's dispatch::

    autograd -> [spare key: op in target? fall through : plan] -> CPU kernel

An op in the target goes from autograd to the backend's kernel without
touching Python; an op outside it runs its plan, whose ops dispatch again and
meet the key again, so lowering repeats as under the mode. Ops that torch's
CompositeExplicitAutograd kernel serves on any backend (the plan's composite
kernels, and views such as ``t``, ``transpose``, ``detach``) fall through
too: that kernel runs in C++ and its ops come back through the key. The
other way round, an op of the target whose CPU kernel is torch's composite
one (``sort``, ``convolution``) gets a kernel that runs it with the key off:
its inner calls are the backend's business, as under the mode (unless they
are all ops of the target, ``COMPOSITE_KERNEL_CALLS``: it falls through). That kernel is
C++ where this machine built the session's kernels (``native/key_off.cpp``).

Each op's kernel (or fallthrough) is registered the first time the op reaches
the key, by the key's fallback (``_Registered``): in C++ where this machine built
the session's kernels (``native/first_meeting.cpp``: an op without a kernel of
ours gets its fallthrough there, no trip into Python), else in Python. The kernels are
registered process-wide for one ``(target, floor)`` at a time and stay
registered between sessions (the key is off elsewhere, so they
cost nothing there); the key itself is thread-local, and autograd carries it
to the threads running a backward. A session whose target differs from the
registered one while a session of that one is active runs as the Python mode
instead (same plans, slower); ``release()`` unregisters.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from typing import Any

import torch

from .. import _torch_compat as tc
from .keyed_kernels import kernel_for, numbers_as_tensors, tensor_positions
from .mode import EagerMode, Kernels
from .native_registrations import (
    NativeKernel,
    native_first_meeting,
    native_replay,
    native_through_twin,
    native_with_key_off,
    set_replay_enabled,
)
from .plans import How, Plan


class _Registered:
    """The kernels of one target on the spare key, and the keyed modes of its active sessions.

    Nothing is registered per op up front: the key's fallback (C++, or ``_first_meeting``) meets each
    op the first time it reaches the key and registers what the op gets from then on, our
    kernel or a fallthrough, so later calls never see the fallback. A session's first step
    registers the hundred-odd ops its model calls instead of the two thousand outside the
    target (about 10 us each: most of a fresh process's first step on a small model). On
    torch 2.11 and 2.12 a Python fallback cannot serve calls made under a dispatch mode
    (``tc.PYTHON_FALLBACK_ON_SPARE_KEY``): there every op outside the target is registered
    up front, as before, its kernel built on its first call."""

    def __init__(self, kernels: Kernels):
        self.kernels = kernels
        self.modes: list[EagerMode] = []  # innermost session last; its stats count the calls
        self.idle = EagerMode(kernels.target, floor=kernels.floor, keyed=True)  # a call with no session active
        self._how = dict(_registrations(kernels))  # op name -> how, for the ops given a kernel of ours
        # op name -> (what it was given: a ``how`` or ``THROUGH``, its kernel or None for a fallthrough)
        self._met: dict[str, tuple[str, Callable | None]] = {}
        self._libraries: dict[str, torch.library.Library] = {"_": torch.library.Library("_", "IMPL")}
        self._registering = threading.RLock()  # a kernel built on first meeting may run ops itself
        self.native: list[NativeKernel] = []  # the C++ kernels registered (native_registrations)
        # the C++ module whose fallback meets ops (``native/first_meeting.cpp``): it gives every op
        # without a kernel of ours its fallthrough itself, and asks ``_meet_named`` for the others
        self._meeting_in_cpp: Any = None
        if tc.PYTHON_FALLBACK_ON_SPARE_KEY:
            self._meeting_in_cpp = native_first_meeting(tc.SPARE_KEY, list(self._how), self._meet_named)
            if self._meeting_in_cpp is None:
                self._libraries["_"].fallback(self._first_meeting, tc.SPARE_KEY, with_keyset=True)
            for name in MET_FROM_CPP_WRAPPERS:
                op = tc.resolve_overload(*name.split("::", 1))
                if op is not None:
                    self.meet(op)
        else:  # torch 2.11, 2.12: every kernel up front (each built on its first call), the rest falls through
            self._libraries["_"].fallback(torch.library.fallthrough_kernel, tc.SPARE_KEY)
            for name in self._how:
                self._register_up_front(name)

    def _register_up_front(self, name: str) -> None:
        built: list[Callable] = []

        def kernel(*args: Any, **kwargs: Any) -> Any:
            if not built:
                op = tc.resolve_overload(*name.split("::", 1))
                found = self.meet(op) if op is not None else None
                assert found is not None, name  # an op of ``_how`` has a kernel
                built.append(found)
            return built[0](*args, **kwargs)

        namespace, _, op_name = name.partition("::")  # aten, or a custom op the user decomposes
        library = self._libraries.get(namespace)
        if library is None:
            library = self._libraries[namespace] = torch.library.Library(namespace, "IMPL")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            library.impl(op_name, kernel, tc.SPARE_KEY)

    def _first_meeting(self, keyset: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
        """An op reaching the key with nothing registered for it: register its kernel (or a
        fallthrough, for an op of the target and for what is not ours to lower) and run it."""
        kernel = self.meet(op)
        if kernel is None:  # a wrapped number (``x.div(0.8)`` from C++) reached Python as a number
            return tc.fall_through_spare_key(op, keyset, numbers_as_tensors(args, tensor_positions(op)), kwargs)
        return kernel(*args, **kwargs)

    def _meet_named(self, name: str) -> None:
        """The C++ fallback's call for an op with a kernel of ours (it then dispatches to it)."""
        op = tc.resolve_overload(*name.split("::", 1))
        assert op is not None, name
        self.meet(op)

    def meet(self, op: Any) -> Callable | None:
        """``op``'s kernel on the key, registered now if it is not yet; None for a fallthrough."""
        name = op.name()
        with self._registering:
            if name in self._met:  # met before (by another thread, or by ``kind_of_op``)
                return self._met[name][1]
            how = self._how.get(name)
            if how is None and self._meeting_in_cpp is not None:  # its fallthrough is the C++ fallback's to give
                schema = tc.schema_of(op)
                self._meeting_in_cpp.meet_through(schema.name, schema.overload_name)
                self._met[name] = (THROUGH, None)
                return None
            kernel = None if how is None else (_as_backend_kernel(op) if how == _BACKEND
                                               else kernel_for(op, How[how], self.kernels, self.modes, self.idle))
            native: NativeKernel | None = None
            if tc.PYTHON_FALLBACK_ON_SPARE_KEY and kernel is not None and how == _BACKEND:
                native = native_with_key_off(op, tc.SPARE_KEY)
            elif tc.PYTHON_FALLBACK_ON_SPARE_KEY and kernel is not None and how is not None:
                native = (native_through_twin(op, How[how], self.kernels, kernel, tc.SPARE_KEY)
                          or native_replay(op, How[how], self.kernels, kernel, tc.SPARE_KEY))
            if native is not None:  # its C++ kernel is registered (in front of the Python one, but key-off)
                self.native.append(native)
            # (torch 2.11, 2.12: an op with a kernel of ours is registered up front, and this is its first call)
            elif tc.PYTHON_FALLBACK_ON_SPARE_KEY or how is None:
                library = self._libraries.get(op.namespace)
                if library is None:
                    library = self._libraries[op.namespace] = torch.library.Library(op.namespace, "IMPL")
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", UserWarning)
                    library.impl(name.split("::", 1)[1], kernel or torch.library.fallthrough_kernel, tc.SPARE_KEY)
            self._met[name] = (how or THROUGH, kernel)
            return kernel

    def kind_of(self, name: str) -> str | None:
        """What op ``name`` got on the key when first met: a plan's ``How`` by name, ``BACKEND``,
        ``THROUGH``; None while it has not reached the key."""
        met = self._met.get(name)
        if met is None and self._meeting_in_cpp is not None and self._meeting_in_cpp.met_through(name):
            return THROUGH  # met by the C++ fallback alone
        return None if met is None else met[0]

    def remove(self) -> None:
        if self._meeting_in_cpp is not None:
            self._meeting_in_cpp.remove_first_meeting()
            self._meeting_in_cpp = None
        for library in self._libraries.values():
            library._destroy()  # noqa: SLF001  (torch.library's only way to unregister)
        self._libraries = {}
        for native in self.native:
            native.take_served(self.idle)
            native.unregister()
        self.native = []

    def count_native_calls(self, mode: EagerMode) -> None:
        """Adds the calls the C++ kernels served since the last count to ``mode``'s stats."""
        for native in list(self.native):
            native.take_served(mode)


# Ops that torch's C++ calls and then wraps the result in a new Python object, which fails if the
# result has one already: ``nn.Parameter(t)`` / ``Tensor._make_subclass`` detach ``t`` in C++,
# ``t.as_subclass(cls)`` aliases it. Met
# through the Python fallback, the op runs from Python and its result gets a Python object
# ("the raw Tensor object is already associated to a python object"), so they are met (given
# their fallthrough) when the kernels are registered, never first on such a call.
MET_FROM_CPP_WRAPPERS = ("aten::detach", "aten::alias")


_BACKEND = "BACKEND"  # an op of the target run with the key off (composite kernel, or NATIVE_KERNEL_CALLS)
THROUGH = "THROUGH"  # an op given a fallthrough on the key: the target's, views, what is not ours to lower


def _registrations(kernels: Kernels) -> list[tuple[str, str]]:
    """(op name, how) of each kernel on the key: a plan's ``How`` by name, or ``_BACKEND``;
    decided once per target and torch build (``persisted_kernels`` keeps it)."""
    if kernels.persisted.registrations is None:
        found = [(op.name(), plan.how.name) for op, plan in kernels.governed_outside()
                 if not _composite_serves(op, plan)]
        found += [(op.name(), _BACKEND) for op in kernels.direct
                  if (_composite_inside_target(op) and not _composite_calls_only_direct(op, kernels))
                  or _native_kernel_calls_outside(op, kernels)]
        kernels.persisted.registrations = found
    return kernels.persisted.registrations


def _composite_serves(op: tc.OpOverload, plan: Plan) -> bool:
    """Ops left to torch's CompositeExplicitAutograd kernel, which every backend runs without
    registering it (its ops come back through the key): those the plan runs that way anyway,
    and views, whose composite kernel makes the view in metadata. Falling through costs no
    Python, and a view made in C++ has no Python object yet, as ``nn.Parameter`` (which detaches
    its data in C++ and wraps the result) requires."""
    return plan.how is How.COMPOSITE_KERNEL or (
        (op.is_view or op.name() in VIEWS_BY_ANOTHER_NAME) and tc.has_composite_explicit_kernel(op))


# not views by their schemas, made as views by their CompositeExplicitAutograd kernels (in
# metadata, no op dispatched): matmul's result reshaped, some twenty calls a transformer step
VIEWS_BY_ANOTHER_NAME = frozenset({"aten::_unsafe_view"})


def _composite_inside_target(op: tc.OpOverload) -> bool:
    """An op of the target whose CPU kernel is torch's composite one, calling other ops through
    the dispatcher (``sort`` calls ``sort.stable``, ``convolution`` its implementations). A
    backend implements the op itself, so those calls are not the session's: it runs with the
    key off, as under the mode. (Views aside: theirs only make the view.)"""
    return (not op.is_view and not tc.backend_has_kernel(op, "CPU")
            and (tc.backend_has_kernel(op, "CompositeExplicitAutograd")
                 or tc.backend_has_kernel(op, "CompositeExplicitAutogradNonFunctional")))


# Ops of Core ATen whose CPU kernel calls ops outside Core ATen through the dispatcher on every
# call (found with torch's profiler over the corpus's and the light zoo's train steps; pinned by
# tests/eager/test_eager_assumptions.py). Under the key each inner call was a trip into a Python
# kernel of ours (sum's fill_: 14 a bert step, mean's sum.IntList_out and div_: 90 us a call); they
# are the backend's business, so where one of them is outside the target the op runs with the key
# off, one cheaper trip, as under the observed mode.
NATIVE_KERNEL_CALLS: dict[str, tuple[str, ...]] = {
    "aten::sum.dim_IntList": ("aten::fill_.Scalar",),
    "aten::mean.dim": ("aten::sum.IntList_out", "aten::div_.Scalar"),
    "aten::amax": ("aten::fill_.Scalar",),
    "aten::amin": ("aten::fill_.Scalar",),
    "aten::native_layer_norm_backward": ("aten::zero_",),
    "aten::embedding_dense_backward": ("aten::zeros",),
    "aten::max_pool2d_with_indices_backward": ("aten::zero_",),
    "aten::avg_pool2d_backward": ("aten::zero_",),
    "aten::relu": ("aten::clamp_min",),
    # a backend's own histc (torch lowers it nowhere; mixtral's router counts with it): the CPU
    # kernel's bin edges by linspace.out, its range by aminmax
    "aten::histc": ("aten::linspace.out", "aten::aminmax"),
}


# Ops of Core ATen whose CPU kernel is torch's composite one but calls only these ops (besides
# CompositeImplicitAutograd ones that decompose into them, ``to``, and views made in metadata),
# found with torch's profiler and pinned by tests/eager/test_eager_assumptions.py. Where all of
# them are in the target they fall through with the key on: their inner calls pass the key in
# C++, and a trip into Python is saved per call (bert: some 30 a step, copies and scalar arithmetic).
COMPOSITE_KERNEL_CALLS: dict[str, tuple[str, ...]] = {
    "aten::copy_": (),
    "aten::clone": ("aten::empty_strided", "aten::copy_"),
    "aten::_to_copy": ("aten::empty_strided", "aten::copy_"),
    "aten::embedding": ("aten::index_select", "aten::empty.memory_format"),
    # the number becomes a tensor (``_to_copy`` of a wrapped scalar), then the Tensor overload
    **{f"aten::{name}.Scalar": (f"aten::{name}.Tensor", "aten::_to_copy", "aten::empty_strided", "aten::copy_")
       for name in ("add", "sub", "mul", "div")},
}


def _composite_calls_only_direct(op: tc.OpOverload, kernels: Kernels) -> bool:
    inner = COMPOSITE_KERNEL_CALLS.get(op.name())
    return inner is not None and _all_direct(inner, kernels)


def _native_kernel_calls_outside(op: tc.OpOverload, kernels: Kernels) -> bool:
    return not _all_direct(NATIVE_KERNEL_CALLS.get(op.name(), ()), kernels)


def _all_direct(names: tuple[str, ...], kernels: Kernels) -> bool:
    """Whether every op named is in ``target | floor``."""
    return not names or set(names) <= {direct.name() for direct in kernels.direct}


def _as_backend_kernel(op: tc.OpOverload) -> Callable:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        with tc.excluding_spare_key():
            return op(*args, **kwargs)
    return kernel


_lock = threading.Lock()
_registered: _Registered | None = None


class KeyedSession:
    """Context: ``mode`` (keyed) runs the ops outside its target while this thread's dispatch
    passes through the spare key. ``available(mode)`` says whether it can be entered now."""

    def __init__(self, mode: EagerMode):
        self.mode = mode
        self._guard: Any = None
        self._held: _Registered | None = None

    @staticmethod
    def available(mode: EagerMode) -> bool:
        """False while another target's kernels are registered and in use."""
        with _lock:
            return _registered is None or _registered.kernels is mode.kernels or not _registered.modes

    def __enter__(self) -> KeyedSession:
        global _registered
        with _lock:
            if _registered is None or _registered.kernels is not self.mode.kernels:
                if _registered is not None:
                    if _registered.modes:
                        raise RuntimeError("the spare dispatch key is in use by a session of another target")
                    _registered.remove()
                    _registered = None
                _registered = _Registered(self.mode.kernels)
            _registered.modes.append(self.mode)
            self._held = _registered
            set_replay_enabled(self.mode.use_cache)
        self._guard = tc.including_spare_key()
        self._guard.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._guard.__exit__(*exc)
        with _lock:
            assert self._held is not None
            self._held.count_native_calls(self.mode)
            self._held.modes.remove(self.mode)
            set_replay_enabled(self._held.modes[-1].use_cache if self._held.modes else self._held.idle.use_cache)
            self._held = None


def release() -> None:
    """Unregister the kernels (none may be in use)."""
    global _registered
    with _lock:
        if _registered is not None:
            if _registered.modes:
                raise RuntimeError("a session is active on the spare dispatch key")
            _registered.remove()
            _registered = None


def registered_ops() -> list[str]:
    """The ops registered on the spare key so far, kernels and fallthroughs (for tests and the bench)."""
    return tc.registrations_on_key(tc.SPARE_KEY)


def kind_of(name: str) -> str | None:
    """What op ``name`` (``aten::add.Tensor``) got on the key of the registered target when it
    first reached it (``_Registered.kind_of``); None if it has not, or nothing is registered."""
    with _lock:
        return None if _registered is None else _registered.kind_of(name)


def kind_of_op(op: Any) -> str | None:
    """What ``op`` gets on the key of the registered target, registered now if it had not
    reached the key yet (for a Python backend that passes the key on only where it leads
    somewhere: a fallthrough cannot be redispatched to); None if nothing is registered."""
    with _lock:
        registered = _registered
    if registered is None:
        return None
    registered.meet(op)
    return registered.kind_of(op.name())
