"""``OpSet``: the operator overloads a backend implements.

A backend answers "which ops must I register?" with a set of overloads. An
``OpSet`` is that set as a value: built from torch's Core ATen tag, from names
(``"aten.linear.default"`` for one overload, ``"aten.linear"`` for every
overload of the packet), or from a text file of such names, and combined with
``|`` and ``-``::

    target = pf.OpSet.core_aten() | pf.OpSet.from_names(["aten.linear", "aten.softmax.int"])
    ep = pf.export(model, args, target=target)

Names are resolved when the set is built, so a typo fails at once, not as a
silently larger program.

An op torch cannot decompose (a library's custom op, say) can be given a decomposition of
the user's own: ``target.with_decompositions({"mylib::op": fn})``. Both lowerings
(``export(..., target=)`` and ``pf.eager.on(target)``) then lower it with ``fn`` and bring
what ``fn`` calls back through the same rules; ``pf.verify`` checks the program it gives
against eager like any other.
"""

from __future__ import annotations

import functools
import importlib
import os
import types
from collections.abc import Callable, Iterable, Iterator, Mapping

import torch

from .. import _torch_compat as tc

OpOverload = tc.OpOverload


class OpSet:
    """An immutable, named set of ``OpOverload``s, with the user's decompositions of ops outside it."""

    __slots__ = ("_decompositions", "_ops", "name")

    def __init__(self, ops: Iterable[OpOverload] = (), name: str = "ops",
                 decompositions: Mapping[OpOverload, Callable] | None = None):
        self._ops: frozenset[OpOverload] = frozenset(ops)
        self.name = name
        self._decompositions: Mapping[OpOverload, Callable] = types.MappingProxyType(dict(decompositions or {}))

    # --- construction --------------------------------------------------------

    @classmethod
    def core_aten(cls) -> OpSet:
        """Every aten overload torch tags ``torch.Tag.core`` (the Core ATen IR).

        Plus the ``*_functional`` twin of each tagged op that writes its inputs
        (``_native_batch_norm_legit_functional``): functionalization emits the
        twin, and torch's own Core ATen programs hold it too.
        """
        return cls(_core_aten_ops(), name="core_aten")

    @classmethod
    def from_names(cls, names: Iterable[str], name: str = "ops") -> OpSet:
        """Resolve names: ``aten.add.Tensor`` (one overload) or ``aten.add`` (its packet).

        A leading ``torch.ops.`` and the ``aten::add.Tensor`` spelling are accepted.
        Unknown names raise ``ValueError`` listing all of them.
        """
        ops: set[OpOverload] = set()
        unknown = []
        for raw in names:
            found = resolve_name(raw)
            if not found:
                unknown.append(raw)
            ops.update(found)
        if unknown:
            raise ValueError(f"unknown operator name(s): {', '.join(repr(u) for u in unknown)}")
        return cls(ops, name=name)

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> OpSet:
        """One name a line; ``#`` starts a comment; blank lines are ignored.

        A line ``@core_aten`` includes the Core ATen set. A line ``mylib::op = package.module:function``
        gives ``op`` the user's decomposition (:meth:`with_decompositions`), imported from the module.
        """
        names, include_core = [], False
        table: dict[OpOverload | str, Callable] = {}
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                text = line.split("#", 1)[0].strip()
                if text == "@core_aten":
                    include_core = True
                elif "=" in text:
                    op, _, where = (part.strip() for part in text.partition("="))
                    table[op] = _imported(where, f"{path}:{number}")
                elif text:
                    names.append(text)
        found = cls.from_names(names, name=os.path.basename(str(path)))
        return (cls.core_aten() | found if include_core else found).with_decompositions(table)

    @classmethod
    def parse(cls, spec: str) -> OpSet:
        """``core_aten``, or a path to a file for :meth:`from_file` (the CLI's ``--target``)."""
        return cls.core_aten() if spec == "core_aten" else cls.from_file(spec)

    def with_decompositions(self, table: Mapping[OpOverload | str, Callable]) -> OpSet:
        """This set, lowering each op of ``table`` (an overload, or a name as :meth:`from_names`
        reads it: a packet means each of its overloads) with the given function wherever it
        meets the op outside the set. The function takes the op's arguments and returns its
        result, in ops of any kind (they are lowered in turn). For an op torch has no
        decomposition of, typically a custom op; one given for an op torch decomposes replaces
        torch's. An op already in the set is refused: its decomposition would never run."""
        added: dict[OpOverload, Callable] = {}
        for key, fn in table.items():
            ops = resolve_name(key) if isinstance(key, str) else [key] if isinstance(key, OpOverload) else None
            if not ops:
                raise ValueError(f"with_decompositions: {key!r} is not an operator overload nor the name of one")
            if not callable(fn):
                raise TypeError(f"with_decompositions: the decomposition of {key!r} is {fn!r}, not a function")
            inside = [str(op) for op in ops if op in self._ops]
            if inside:
                raise ValueError(f"with_decompositions: {', '.join(inside)} is in the op set {self.name!r}, so its "
                                 "decomposition would never run; take it out of the set first (``-``)")
            added.update(dict.fromkeys(ops, fn))
        return OpSet(self._ops, name=self.name, decompositions={**self._decompositions, **added})

    @property
    def decompositions(self) -> Mapping[OpOverload, Callable]:
        """The user's decompositions (:meth:`with_decompositions`), by overload."""
        return self._decompositions

    # --- set algebra ---------------------------------------------------------

    def __or__(self, other: OpSet) -> OpSet:
        return OpSet(self._ops | other._ops, name=f"{self.name}|{other.name}",
                     decompositions=_merged(self._decompositions, other._decompositions))

    def __sub__(self, other: OpSet) -> OpSet:
        return OpSet(self._ops - other._ops, name=f"{self.name}-{other.name}", decompositions=self._decompositions)

    def union(self, *names_or_sets: OpSet | str) -> OpSet:
        """``self | other``, where a string is resolved as in :meth:`from_names`."""
        out = self
        for item in names_or_sets:
            out = out | (item if isinstance(item, OpSet) else OpSet.from_names([item], name=item))
        return out

    def difference(self, *names_or_sets: OpSet | str) -> OpSet:
        out = self
        for item in names_or_sets:
            out = out - (item if isinstance(item, OpSet) else OpSet.from_names([item], name=item))
        return out

    # --- queries ---------------------------------------------------------------

    def __contains__(self, op: object) -> bool:
        if isinstance(op, str):
            found = resolve_name(op)
            return bool(found) and all(o in self._ops for o in found)
        return op in self._ops

    def __iter__(self) -> Iterator[OpOverload]:
        return iter(sorted(self._ops, key=str))

    def __len__(self) -> int:
        return len(self._ops)

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, OpSet) and self._ops == other._ops
                and dict(self._decompositions) == dict(other._decompositions))

    def __hash__(self) -> int:
        return hash((self._ops, frozenset(self._decompositions.items())))

    def names(self) -> list[str]:
        return sorted(str(op) for op in self._ops)

    def __repr__(self) -> str:
        extra = f", {len(self._decompositions)} decompositions" if self._decompositions else ""
        return f"OpSet({self.name!r}, {len(self)} ops{extra})"


def _imported(where: str, line: str) -> Callable:
    """``package.module:function`` of a target file's decomposition line."""
    module_name, _, attribute = where.partition(":")
    try:
        value: object = importlib.import_module(module_name)
        for part in attribute.split("."):
            value = getattr(value, part)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ValueError(f"{line}: cannot import the decomposition {where!r} (want package.module:function): "
                         f"{type(exc).__name__}: {exc}") from exc
    if not attribute or not callable(value):
        raise ValueError(f"{line}: {where!r} is not a function (want package.module:function)")
    return value  # type: ignore[return-value]


def _merged(mine: Mapping[OpOverload, Callable], theirs: Mapping[OpOverload, Callable]) -> dict[OpOverload, Callable]:
    clash = sorted(str(op) for op in mine.keys() & theirs.keys() if mine[op] is not theirs[op])
    if clash:
        raise ValueError(f"the two op sets decompose {', '.join(clash)} with different functions: keep one")
    return {**mine, **theirs}


def resolve_name(raw: str) -> list[OpOverload]:
    """The overloads a name means: one for ``ns.op.overload``, all of a packet for ``ns.op``."""
    name = raw.strip().removeprefix("torch.ops.").replace("::", ".")
    parts = name.split(".")
    if len(parts) == 3:
        op = tc.resolve_overload(parts[0], f"{parts[1]}.{parts[2]}")
        return [op] if op is not None else []
    if len(parts) == 2:
        return _packet_overloads(parts[0], parts[1])
    return []


def _packet_overloads(namespace: str, packet_name: str) -> list[OpOverload]:
    try:
        packet = getattr(getattr(torch.ops, namespace), packet_name)
    except (AttributeError, RuntimeError):
        return []
    ops = []
    for overload in packet.overloads():
        op = tc.resolve_overload(namespace, f"{packet_name}.{overload}")
        if op is not None:
            ops.append(op)
    return ops


@functools.lru_cache(maxsize=1)
def _core_aten_ops() -> frozenset[OpOverload]:
    ops = set()
    for full in tc.all_op_names():
        namespace, _, rest = full.partition("::")
        if namespace != "aten":
            continue
        op = tc.resolve_overload(namespace, rest)
        if op is not None and torch.Tag.core in op.tags:
            ops.add(op)
            if tc.schema_of(op).is_mutable:
                twin = tc.resolve_overload(namespace, f"{tc.schema_of(op).name.split('::')[1]}_functional."
                                                      f"{tc.overload_name(op)}")
                if twin is not None:
                    ops.add(twin)
    return frozenset(ops)
