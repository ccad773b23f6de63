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
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Iterator

import torch

from .. import _torch_compat as tc

OpOverload = tc.OpOverload


class OpSet:
    """An immutable, named set of ``OpOverload``s."""

    __slots__ = ("_ops", "name")

    def __init__(self, ops: Iterable[OpOverload] = (), name: str = "ops"):
        self._ops: frozenset[OpOverload] = frozenset(ops)
        self.name = name

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

        A line ``@core_aten`` includes the Core ATen set.
        """
        names, include_core = [], False
        with open(path, encoding="utf-8") as f:
            for line in f:
                text = line.split("#", 1)[0].strip()
                if text == "@core_aten":
                    include_core = True
                elif text:
                    names.append(text)
        found = cls.from_names(names, name=os.path.basename(str(path)))
        return cls.core_aten() | found if include_core else found

    @classmethod
    def parse(cls, spec: str) -> OpSet:
        """``core_aten``, or a path to a file for :meth:`from_file` (the CLI's ``--target``)."""
        return cls.core_aten() if spec == "core_aten" else cls.from_file(spec)

    # --- set algebra ---------------------------------------------------------

    def __or__(self, other: OpSet) -> OpSet:
        return OpSet(self._ops | other._ops, name=f"{self.name}|{other.name}")

    def __sub__(self, other: OpSet) -> OpSet:
        return OpSet(self._ops - other._ops, name=f"{self.name}-{other.name}")

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
        return isinstance(other, OpSet) and self._ops == other._ops

    def __hash__(self) -> int:
        return hash(self._ops)

    def names(self) -> list[str]:
        return sorted(str(op) for op in self._ops)

    def __repr__(self) -> str:
        return f"OpSet({self.name!r}, {len(self)} ops)"


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
