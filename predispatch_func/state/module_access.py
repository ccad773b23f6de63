"""The attribute path ``forward`` used to reach a submodule, where identity cannot say it.

A module held under two names (``self.p = self.n``, ``Sequential(ln, relu, ln)``)
has one identity and several paths; torch.export's non-strict trace names each
call by the path the code walked (``sub_net.2``, not the first path
``sub_net.0``), and a sliced container by its slice
(``mod_list_1.slice(2, 3, None).2``), so ``nn_module_stack`` and
``torch.export.unflatten`` follow the code. As torch does, only a model that
holds some module twice is traced this way: its submodules are reached through
stand-ins (:class:`Paths` makes them) that share the module's ``__dict__``, so
every read and write lands on the module itself, and that know their path.
A model without shared modules pays nothing.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from .. import _torch_compat as tc


def has_shared_modules(root: torch.nn.Module) -> bool:
    seen: set[int] = set()
    for _, m in root.named_modules(remove_duplicate=False):
        if id(m) in seen:
            return True
        seen.add(id(m))
    return False


class _Reached:
    """Mixin of a stand-in's class: attribute reads of submodules, ``_modules`` and slices of
    containers hand out stand-ins one path further."""

    _pf_paths: Paths

    def __getattr__(self, name: str) -> Any:
        value = super().__getattr__(name)  # type: ignore[misc]
        return self._pf_paths.reached(value, self, name)

    @property
    def _modules(self) -> dict[str, Any]:
        own = self.__dict__["_modules"]
        return {key: self._pf_paths.reached(m, self, str(key)) for key, m in own.items()}

    def __getitem__(self, idx: Any) -> Any:
        if isinstance(idx, slice) and isinstance(self, (torch.nn.Sequential, torch.nn.ModuleList)):
            own = self.__dict__["_modules"]
            sliced = (torch.nn.Sequential(collections.OrderedDict(list(own.items())[idx]))
                      if isinstance(self, torch.nn.Sequential) else torch.nn.ModuleList(list(own.values())[idx]))
            return self._pf_paths.stand_in(sliced, f"{self._pf_paths.path_of(self)}.{idx}")
        return super().__getitem__(idx)  # type: ignore[misc]


class Paths:
    """Stand-ins of the modules ``forward`` reaches from ``root``, each with its access path."""

    def __init__(self, root: torch.nn.Module) -> None:
        self.root = root
        self._paths: dict[int, str] = {}
        self._kept: list[torch.nn.Module] = []  # the stand-ins live as long as the trace, so ids stay theirs
        self._classes: dict[type, type] = {}

    def path_of(self, module: Any) -> str | None:
        """The access path of a stand-in (``""`` for the root), None for any other module."""
        return "" if module is self.root else self._paths.get(id(module))

    def reached(self, value: Any, parent: Any, name: str) -> Any:
        # a torch HOP's body (a cond branch) is traced by dynamo, which allows no new objects there:
        # its calls take the stack of the module that called the HOP (node_meta.py)
        if not isinstance(value, torch.nn.Module) or isinstance(value, torch.fx.GraphModule) \
                or torch.compiler.is_dynamo_compiling():
            return value
        base = self.path_of(parent)
        if base is None:
            return value
        return self.stand_in(value, f"{base}.{name}" if base else name)

    def stand_in(self, module: torch.nn.Module, path: str) -> torch.nn.Module:
        cls = type(module)
        if issubclass(cls, _Reached):  # a stand-in reached under another name: its dict is the module's
            cls = cls.__mro__[2]
        proxy_cls = self._classes.get(cls)
        if proxy_cls is None:
            proxy_cls = self._classes[cls] = type(cls.__name__, (_Reached, cls), {"_pf_paths": self})
            proxy_cls.__module__, proxy_cls.__qualname__ = cls.__module__, cls.__qualname__
        proxy: torch.nn.Module = object.__new__(proxy_cls)
        object.__setattr__(proxy, "__dict__", module.__dict__)
        self._kept.append(proxy)
        self._paths[id(proxy)] = path
        return proxy


@contextlib.contextmanager
def access_paths(root: torch.nn.Module) -> Iterator[Paths | None]:
    """For the model's call: :class:`Paths` with the root's submodule reads routed through it,
    or None (and nothing patched) when no module of ``root`` is held twice."""
    if not has_shared_modules(root):
        yield None
        return
    paths = Paths(root)

    def from_root(module: torch.nn.Module, name: str, value: Any) -> Any:
        return paths.reached(value, module, name) if module is root else value

    with tc.module_getattr_wrapped(from_root):
        yield paths
