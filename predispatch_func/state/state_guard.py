"""Exporting never changes the caller's Python-level state, on success or failure.

Tracing runs the user's ``forward`` for real (over fake tensors), so it can
write Python attributes, register buffers, move the RNG, leave grad mode or
autocast changed, or raise halfway. :class:`StateGuard` snapshots all of that
before the trace and puts it back afterwards, whatever happened::

    with StateGuard(model, inputs) as guard:
        trace = ...                      # runs model.forward
        guard.refuse_uncarried_changes() # a Python change the program cannot hold

While the guard is active it also records, for every attribute the model's
code sets or registers, the user's source line, so a refusal can name it. A
program holds tensors only and replays the first call, so a change is judged
by eager over several calls (:mod:`.python_state`): a memo cache, a flag or
hook set up once, a value recomputed and stored each call are carried; a
counter or a stale cache (``self.counter += 1``, a buffer registered and then
accumulated) is refused (or, with ``python_state="warn"``, warned about). The
model is restored in every case: exporting never changes it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import linecache
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from .. import _torch_compat as tc
from ..errors import PACKAGE_DIR, Refusal, UnsupportedError, _is_user_frame

if TYPE_CHECKING:
    from .python_state import Written

# The judge (python_state, with its replicas and tripwires) and the memo reader
# (state_memos) load on first use: only a model that writes Python state meets them,
# and importing them was a tenth of the package's import in every fresh process.

# the Module methods through which model code changes what a module holds
_RECORDED = ("__setattr__", "__delattr__", "register_buffer", "register_parameter",
             "register_module", "add_module")
_CONTAINERS = (list, dict, set)
_CONTENTS_CHANGED = "changes the contents of attribute"
_MODULE_TABLES = {"_parameters": "parameter", "_buffers": "buffer", "_modules": "submodule"}  # what each holds
_TORCH_DIR = torch.__file__.rsplit("/", 1)[0] + "/"


@dataclasses.dataclass
class _ModuleSnapshot:
    module: torch.nn.Module
    attrs: dict[str, Any]  # a shallow copy of __dict__
    contents: dict[str, Any]  # a shallow copy of every non-empty list/dict/set attribute's contents
    empty: tuple[str, ...]  # the list/dict/set attributes that were empty (most hook tables)
    training: bool


@dataclasses.dataclass
class _TensorSnapshot:
    tensor: torch.Tensor
    requires_grad: bool
    grad: Any
    version: int | None


def _version(t: torch.Tensor) -> int | None:
    return None if t.is_inference() else tc.version_of(t)  # inference tensors keep no version


def _contents(value: Any) -> Any:
    return dict(value) if isinstance(value, dict) else type(value)(value)


def _same(a: Any, b: Any) -> bool:
    if a is b:
        return True
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return False
    try:
        return bool(type(a) is type(b) and a == b)
    except Exception:  # noqa: BLE001 (objects whose == raises or is ambiguous)
        return False


class StateGuard:
    """Snapshot on enter, restore on exit; :meth:`refuse_uncarried_changes` in between."""

    def __init__(self, mod: torch.nn.Module, inputs: Any, *, python_state: str = "error"):
        if python_state not in ("error", "warn"):
            raise ValueError(f"python_state must be 'error' or 'warn', not {python_state!r}")
        self.mod = mod
        self.inputs = inputs
        self.python_state = python_state
        # keyed by (id of the module's __dict__, name): a stand-in that reaches a module held under
        # two names (module_access.py) shares the module's __dict__, not its identity
        self.writes: dict[tuple[int, str], str | None] = {}  # -> the user's line
        self.by_torch: set[tuple[int, str]] = set()  # written by torch's module code only
        # (id(module), name) of a dict that gained entries -> their graph nodes (None: not a cache)
        self.memo_entries: dict[tuple[int, str], list[torch.fx.Node] | None] = {}

    # --- snapshot and restore ------------------------------------------------------

    def _take(self) -> None:
        self.rng = torch.get_rng_state()
        self.grad_enabled = torch.is_grad_enabled()
        self.autocast = _autocast_state()
        self.modules = []
        for m in dict.fromkeys(self.mod.modules()):
            attrs = dict(vars(m))
            containers = [(k, v) for k, v in attrs.items() if isinstance(v, _CONTAINERS)]
            contents = {k: _contents(v) for k, v in containers if v}
            self.modules.append(_ModuleSnapshot(m, attrs, contents, tuple(k for k, v in containers if not v),
                                                m.training))
        tensors = [*self.mod.parameters(), *self.mod.buffers(),
                   *(t for t in tc.pytree.tree_leaves(self.inputs) if isinstance(t, torch.Tensor))]
        self.tensors = [_TensorSnapshot(t, t.requires_grad, t.grad if t.is_leaf else None, _version(t))
                        for t in dict.fromkeys(tensors)]

    def _restore(self) -> None:
        torch.set_rng_state(self.rng)
        torch.set_grad_enabled(self.grad_enabled)
        _set_autocast_state(self.autocast)
        for snap in self.modules:
            attrs = vars(snap.module)
            attrs.clear()
            attrs.update(snap.attrs)
            for name, saved in snap.contents.items():
                container = snap.attrs[name]
                container.clear()
                container.update(saved) if not isinstance(container, list) else container.extend(saved)
            for name in snap.empty:
                if snap.attrs[name]:
                    snap.attrs[name].clear()
            snap.module.training = snap.training
        for t in (t for t in self.tensors if t.tensor.is_leaf):
            if t.tensor.requires_grad != t.requires_grad:
                t.tensor.requires_grad_(t.requires_grad)
            if t.tensor.grad is not t.grad:
                t.tensor.grad = t.grad

    def __enter__(self) -> StateGuard:
        self._take()
        self._recording: Any = _recording_attribute_writes(self.writes, self.by_torch,
                                                           [snap.module for snap in self.modules])
        self._recording.__enter__()
        return self

    def _stop_recording(self) -> None:
        if self._recording is not None:
            recording, self._recording = self._recording, None
            recording.__exit__(None, None, None)

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            self._stop_recording()
        finally:
            self._restore()
        written = [t for t in self.tensors if _version(t.tensor) != t.version]
        if written and exc_type is None:  # never: every real tensor was swapped for a fake
            raise RuntimeError(f"internal error: exporting wrote {len(written)} of the caller's tensors")

    # --- what changed ----------------------------------------------------------------

    def changes(self) -> list[Change]:
        """Each Python-level change of the model since the snapshot, with the user's line."""
        found = []
        names = {id(m): n for n, m in self.mod.named_modules()}
        for snap in self.modules:
            where = names.get(id(snap.module), "")
            now = vars(snap.module)
            for table, kind in _MODULE_TABLES.items():
                before, after = snap.contents.get(table, {}), now.get(table, {})
                for name in _added(before, after):
                    found.append(self._change(snap, where, name, f"registers {kind}"))
                for name in _added(after, before):
                    found.append(self._change(snap, where, name, f"removes {kind}"))
            for name in [*snap.attrs, *_added(snap.attrs, now)]:
                key = (id(vars(snap.module)), name)
                if name in _MODULE_TABLES or name == "training" or (
                        key in self.by_torch and key not in self.writes):
                    continue
                if name not in snap.attrs:
                    found.append(self._change(snap, where, name, "sets a new attribute"))
                elif name not in now:
                    found.append(self._change(snap, where, name, "deletes attribute"))
                elif not _same(now[name], snap.attrs[name]):
                    found.append(self._change(snap, where, name, "changes attribute"))
                elif key in self.writes and _is_tensor_constant(snap.attrs[name]):
                    # the trace lifts a tensor attribute to a program constant and puts the
                    # original back after the call, over the tensor forward assigned
                    found.append(self._change(snap, where, name, "assigns tensor attribute"))
                elif (not _same(_contents(now[name]), snap.contents[name]) if name in snap.contents
                      else name in snap.empty and len(now[name]) > 0):
                    found.append(self._change(snap, where, name, _CONTENTS_CHANGED))
            if snap.module.training != snap.training:
                found.append(self._change(snap, where, "training", "switches train/eval mode of"))
        return found

    def _caches_unwritten_state(self, change: Change, readable_state: frozenset[torch.fx.Node]) -> bool:
        if change.what != _CONTENTS_CHANGED:
            return False
        try:
            module = self.mod.get_submodule(change.written.module)
        except AttributeError:
            return False
        nodes = self.memo_entries.get((id(module), change.written.name))
        if nodes is None:
            return False
        from .state_memos import computed_from_unwritten_state

        return computed_from_unwritten_state(nodes, readable_state)

    def _change(self, snap: _ModuleSnapshot, where: str, name: str, what: str) -> Change:
        from .python_state import Written

        return Change(Written(where, name), what, self.writes.get((id(vars(snap.module)), name)))

    def note_memo_entries(self) -> None:
        """Inside the trace, once ``forward`` has returned: the entries each dict attribute
        gained, as graph nodes (:mod:`.state_memos`)."""
        for snap in self.modules:
            now = vars(snap.module)
            for name in (*snap.contents, *snap.empty):
                if name in _MODULE_TABLES:
                    continue
                value = now.get(name)
                if isinstance(value, dict) and value is snap.attrs[name] \
                        and len(value) != len(snap.contents.get(name, ())):
                    from .state_memos import new_entries

                    self.memo_entries[(id(snap.module), name)] = new_entries(snap.contents.get(name, {}), value)

    def refuse_uncarried_changes(self, readable_state: frozenset[torch.fx.Node] = frozenset()) -> None:
        """Raise (or warn) for every change a program cannot carry; call before exit.

        Changes are judged by eager over several calls (:mod:`.python_state`), on copies,
        after the model is restored; what is carried leaves the caller's model as it was
        (exporting never changes it, and eager's first call starts from there too). When
        every change is a cache of state the trace proves carried (:mod:`.state_memos`,
        given ``readable_state``: the placeholders of state the program never writes),
        eager is not run.
        """
        found = self.changes()
        if not found or all(self._caches_unwritten_state(c, readable_state) for c in found):
            return
        self._stop_recording()
        self._restore()
        from .python_state import judge_over_calls

        judged = judge_over_calls(self.mod, self.inputs, [c.written for c in found])
        refused = [f"{c}\n  eager: the attribute {judged[c.written]}" for c in found
                   if not judged[c.written].carried]
        if not refused:
            return
        why = ("an exported program holds tensors only: each call replays what the first "
               "call saw, and eager would not")
        if self.python_state == "warn":
            warnings.warn("; ".join(refused) + f"; {why}; the program keeps the values seen while "
                          "tracing and the model is left as it was", stacklevel=3)
            return
        raise UnsupportedError(
            kind=Refusal.PYTHON_STATE_CHANGED, message="\n".join(refused) + f"\n{why}. Register state the model "
            "updates as a buffer in __init__ and update it in place (self.buf.add_(1)), or export with "
            "python_state='warn' to keep the values seen while tracing")


def _added(before: dict, after: dict) -> list[str]:
    """The names ``after`` has and ``before`` has not, in ``after``'s order: the changes are
    reported in the order the model has them, the same on every run (a set's order follows
    string hashing, which changes per process)."""
    return [name for name in after if name not in before]


@dataclasses.dataclass(frozen=True)
class Change:
    """One Python-level change a trace made to the model, and the user's line that made it."""

    written: Written
    what: str  # "changes attribute", "registers buffer", ...
    line: str | None

    def __str__(self) -> str:
        fqn = f"{self.written.module}.{self.written.name}" if self.written.module else self.written.name
        return f"the model {self.what} {fqn!r}" + (f" at {self.line}" if self.line else "")


def _user_line_of_caller() -> str | None:
    """The user's line that called into torch, or None when our own code did (lifting)."""
    frame = inspect.currentframe()
    frame = frame.f_back.f_back if frame is not None and frame.f_back is not None else None
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename.startswith(PACKAGE_DIR):
            return None
        if _is_user_frame(filename):
            line = linecache.getline(filename, frame.f_lineno).strip()
            return f"{filename}:{frame.f_lineno} in {frame.f_code.co_name}" + (f"\n    {line}" if line else "")
        frame = frame.f_back
    return None


@contextlib.contextmanager
def _recording_attribute_writes(writes: dict[tuple[int, str], str | None],
                                by_torch: set[tuple[int, str]], modules: list[torch.nn.Module]) -> Iterator[None]:
    """Wrap ``nn.Module``'s attribute-writing methods for ``modules`` (the model's) for the
    duration of the trace.

    Besides recording lines, ``self.weight *= s`` is made to work on a lifted
    parameter: the in-place op returns the very tensor the module already holds
    (the functional stand-in of the parameter), and assigning it back is a no-op,
    as it is in eager.
    """
    def wrap(method_name: str, original: Any) -> Any:
        def recorded(self: Any, name: Any, *rest: Any, **kw: Any) -> Any:
            if isinstance(name, str):
                caller = inspect.currentframe()
                caller = caller.f_back if caller is not None else None
                if caller is not None and caller.f_code.co_filename.startswith(_TORCH_DIR):
                    by_torch.add((id(vars(self)), name))  # torch's own bookkeeping (LSTM's flat weights)
                elif (id(vars(self)), name) not in writes:
                    writes[(id(vars(self)), name)] = _user_line_of_caller()
                if method_name == "__setattr__" and rest and _holds_already(self, name, rest[0]):
                    return None
            return original(self, name, *rest, **kw)
        return recorded

    with tc.module_methods_wrapped(wrap, _RECORDED, modules):
        yield


def _is_tensor_constant(value: Any) -> bool:
    """A plain tensor attribute (not a parameter; buffers live in ``_buffers``)."""
    return isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter)


def _holds_already(module: Any, name: str, value: Any) -> bool:
    params = vars(module).get("_parameters", {})
    return name in params and params[name] is value and isinstance(value, torch.Tensor)


_AUTOCAST_DEVICES = ("cpu", "cuda")


def _autocast_state() -> tuple[Any, ...]:
    return (torch.is_autocast_cache_enabled(),
            *((torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in _AUTOCAST_DEVICES))


def _set_autocast_state(state: tuple[Any, ...]) -> None:
    torch.set_autocast_cache_enabled(state[0])
    for device, (enabled, dtype) in zip(_AUTOCAST_DEVICES, state[1:]):
        torch.set_autocast_enabled(device, enabled)
        torch.set_autocast_dtype(device, dtype)
