"""Whether an eager call sets an attribute before anything reads it.

A call that sets an attribute before reading it cannot have seen the value an
earlier call left there (torchvision raft's ``self.corr_pyramid = [...]``,
recurrent_gemma's ``self.recurrent_states = None``): its later calls compute
what its first call did, which is what a program replays. That spares the
Python-state judge (:mod:`.python_state`) its replica calls::

    order = AccessOrder.of(live, [("corr_block", "corr_pyramid")])
    with order.recording():
        live(*args)
    order.read_before_written   # False: every written attribute was set first

Reads and writes are seen through the instance's class: for the length of the
call, each class of a watched module gets a ``__getattribute__``, ``__setattr__``
and ``__delattr__`` that note the watched names, then do what the class did.
Patching the class (not swapping the instance's) keeps ``type(self)`` as the
model's code expects. A read of ``__dict__`` from outside torch (``vars(self)``)
counts as reading every watched name, so a read no hook can see is never missed.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

import torch

_TORCH_DIR = torch.__file__.rsplit("/", 1)[0] + "/"
_ABSENT = object()
_HOOKED = ("__getattribute__", "__setattr__", "__delattr__")


class AccessOrder:
    """Records, over calls of one model, whether any watched attribute was read before it was set."""

    def __init__(self, modules: dict[int, tuple[torch.nn.Module, frozenset[str]]]):
        self._watched = modules  # id(module) -> (module, the names written there)
        self._set: set[tuple[int, str]] = set()  # what the current call has set
        self.read_before_written = False

    @classmethod
    def of(cls, model: torch.nn.Module, written: list[tuple[str, str]]) -> AccessOrder | None:
        """Watch ``(module qualified name, attribute)`` pairs of ``model``; None if one is not there."""
        names: dict[int, set[str]] = {}
        modules: dict[int, torch.nn.Module] = {}
        for where, name in written:
            try:
                module = model.get_submodule(where)
            except AttributeError:
                return None
            modules[id(module)] = module
            names.setdefault(id(module), set()).add(name)
        return cls({key: (modules[key], frozenset(names[key])) for key in modules})

    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        """Record one call: each watched attribute starts that call unset."""
        self._set = set()
        classes = list(dict.fromkeys(type(module) for module, _ in self._watched.values()))
        # what each class resolves now, taken before any is patched (a class may derive from another)
        resolved = [{hook: getattr(c, hook) for hook in _HOOKED} for c in classes]
        own = [{hook: c.__dict__.get(hook, _ABSENT) for hook in _HOOKED} for c in classes]
        try:
            for c, original in zip(classes, resolved):
                for hook, value in self._hooks(original).items():
                    setattr(c, hook, value)
            yield
        finally:
            for c, kept in zip(classes, own):
                for hook, value in kept.items():
                    if value is _ABSENT:
                        delattr(c, hook)
                    else:
                        setattr(c, hook, value)

    def _hooks(self, original: dict[str, object]) -> dict[str, object]:
        get, set_, delete = original["__getattribute__"], original["__setattr__"], original["__delattr__"]
        order = self

        def __getattribute__(obj, name):  # noqa: N807 (the hook's own name)
            order._note_read(obj, name)
            return get(obj, name)  # type: ignore[operator]

        def __setattr__(obj, name, value):  # noqa: N807
            order._note_set(obj, name)
            set_(obj, name, value)  # type: ignore[operator]

        def __delattr__(obj, name):  # noqa: N807
            order._note_set(obj, name)
            delete(obj, name)  # type: ignore[operator]

        return {"__getattribute__": __getattribute__, "__setattr__": __setattr__, "__delattr__": __delattr__}

    def _note_read(self, obj: object, name: str) -> None:
        watched = self._watched.get(id(obj))
        if watched is None or watched[0] is not obj:
            return
        names = watched[1]
        if name == "__dict__":
            if not sys._getframe(2).f_code.co_filename.startswith(_TORCH_DIR):  # noqa: SLF001 (the reader)
                self.read_before_written |= any((id(obj), n) not in self._set for n in names)
        elif name in names and (id(obj), name) not in self._set:
            self.read_before_written = True

    def _note_set(self, obj: object, name: str) -> None:
        watched = self._watched.get(id(obj))
        if watched is not None and watched[0] is obj and name in watched[1]:
            self._set.add((id(obj), name))
