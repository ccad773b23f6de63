"""User inputs that share memory, carried through a synthetic base (as AOTAutograd does).

Functionalization gives each graph input its own storage, so a write through one
input would stay invisible to another input over the same memory (``f(x, x)``,
``f(x, x[1:])``). Where the model writes such an input, the model call is traced
over regenerated inputs instead:

- members laid out alike: the same tensor passed twice is one traced tensor (one object, as
  in eager), distinct tensors laid out alike are aliases (``view``) of the first;
- otherwise the group's memory becomes one *synthetic base*, a 1-D tensor built in
  the graph from the members (each copied into its view of it), and each member is read
  as a view of it (:func:`view_plan`: narrow, view, select, permute): functionalization
  then sees one storage, so a write through one member reaches the others, as in eager.

Each member written (or sharing memory with a written one) is a mutation whose final
value is its view of the final base; ``ep.module()`` writes each back, and since they
agree where they overlap, the caller's memory ends as eager's. A member whose layout the
model changed in place (``b.t_()``) is a relaid input, as any other (``ep.module()`` gives
the caller's tensor its new layout before the write). The program holds only
for the aliasing it was exported with: :class:`AliasGroup` is kept in the program's
facts and ``ep.module()`` checks it on every call (``runtime.expect_aliasing``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from .. import _torch_compat as tc
from ..artifacts import InputSlot, SlotKind
from ..errors import Refusal, UnsupportedError

Geometry = tuple  # (sizes, strides, storage offset relative to the group's lowest offset)


@dataclasses.dataclass(frozen=True, eq=False)  # sizes may be symbolic: never hashed
class AliasGroup:
    """Graph inputs (placeholder positions) whose memory overlaps, with each one's
    layout over the shared memory, in elements from the lowest offset among them."""

    members: tuple[int, ...]
    geometries: tuple[Geometry, ...]
    lowest: Any = 0  # the lowest storage offset among them (elements)
    # per member, the position (in members) of the first member that is the same tensor (itself if none):
    # one tensor passed twice is one object in eager, so ``x.t_()`` is seen through ``y``
    same_as: tuple[int, ...] = ()

    @property
    def span(self) -> int:
        """Elements of the base: each member's view chain (:func:`view_plan`) may reach a little
        past the member's last element (``x[::2]`` is read as rows of two, first column)."""
        return max(max(_extent(g), g[2] + _cover(g)) for g in self.geometries)

    @property
    def symbolic(self) -> bool:
        """Some size, stride or offset is symbolic (dynamic shapes): no base can be laid out."""
        return not all(isinstance(v, int) for g in self.geometries for v in (*g[0], *g[1], g[2]))

    @property
    def one_layout(self) -> bool:
        """The same tensor (or one layout of it) passed several times: no base needed."""
        return not self.symbolic and len(set(self.geometries)) == 1


def alias_groups(inputs: list[Any]) -> tuple[AliasGroup, ...]:
    """Connected groups of inputs whose byte spans overlap on one storage (fakes keep
    storages). Disjoint pieces of one storage (``base[:4]``, ``base[4:]``) are independent."""
    by_storage: dict[Any, list[int]] = {}
    for i, t in enumerate(inputs):
        if isinstance(t, torch.Tensor) and t.layout == torch.strided:
            by_storage.setdefault(tc.StorageWeakRef(t.untyped_storage()), []).append(i)
    groups = []
    for candidates in by_storage.values():
        component = {i: i for i in candidates}  # union-find over the inputs of one storage
        for k, i in enumerate(candidates):
            for j in candidates[:k]:
                if byte_spans_overlap(inputs[i], inputs[j]):
                    component[_root(component, i)] = _root(component, j)
        by_root: dict[int, list[int]] = {}
        for i in candidates:
            by_root.setdefault(_root(component, i), []).append(i)
        groups += [_group(inputs, members) for members in by_root.values() if len(members) > 1]
    return tuple(groups)


def _root(component: dict[int, int], i: int) -> int:
    while component[i] != i:
        i = component[i]
    return i


def _group(inputs: list[Any], members: list[int]) -> AliasGroup:
    lowest = min(inputs[i].storage_offset() for i in members)
    return AliasGroup(tuple(members), tuple(
        (tuple(inputs[i].shape), tuple(inputs[i].stride()), inputs[i].storage_offset() - lowest) for i in members),
        lowest, tuple(next(k for k, j in enumerate(members) if inputs[j] is inputs[i]) for i in members))


def _extent(geometry: Geometry) -> int:
    sizes, strides, offset = geometry
    if not all(sizes):
        return offset
    return offset + sum((n - 1) * st for n, st in zip(sizes, strides)) + 1


def _cover(geometry: Geometry) -> int:
    """Elements from a member's offset its view chain spans: its largest stride times that size."""
    sizes, strides, _ = geometry
    dims = [(st, n) for n, st in zip(sizes, strides) if n > 1]
    return max((st * n for st, n in dims), default=1 if all(sizes) else 0)


Step = tuple  # ("narrow", dim, start, length) | ("view", sizes) | ("select", dim, index) | ...


def view_plan(geometry: Geometry) -> list[Step] | None:
    """How to read ``geometry`` from a 1-D base with views whose functional inverses have
    right gradients (narrow, view, select, permute, unsqueeze: functionalization writes through
    them with ``slice_scatter``/``select_scatter``; torch's ``as_strided_scatter`` gives ``self``
    a wrong gradient, tests/torch_compat). None where no such chain exists: strides that do not
    nest (each a multiple of the next smaller one, the sizes fitting), stride 0, negative strides."""
    sizes, strides, offset = geometry
    if not all(sizes):
        return [("narrow", 0, 0, 0), ("view", tuple(sizes))]
    big = sorted(((st, d) for d, (n, st) in enumerate(zip(sizes, strides)) if n > 1), reverse=True)
    if any(st <= 0 for st, _ in big):
        return None
    steps: list[Step] = []
    if not big:
        return [("narrow", 0, offset, 1), ("view", tuple(sizes))]
    first_stride, first_dim = big[0]
    steps += [("narrow", 0, offset, sizes[first_dim] * first_stride), ("view", (sizes[first_dim], first_stride))]
    for (outer, _), (st, d) in zip(big, big[1:]):
        if outer % st or sizes[d] * st > outer:
            return None
        steps.append(("split_last", sizes[d] * st, sizes[d], st))
    steps.append(("select", -1, 0))
    order = [d for _, d in big]  # the chain's dims, by decreasing stride
    steps.append(("permute", tuple(sorted(range(len(order)), key=lambda k: order[k]))))
    steps.append(("view", tuple(sizes)))  # the size-1 dims back
    return steps


def read_view(base: Any, plan: list[Step]) -> Any:
    t = base
    for step in plan:
        if step[0] == "narrow":
            t = t.narrow(step[1], step[2], step[3])
        elif step[0] == "view":
            t = t.view(step[1])
        elif step[0] == "split_last":
            t = t.narrow(-1, 0, step[1]).unflatten(-1, (step[2], step[3]))
        elif step[0] == "select":
            t = t.select(step[1], step[2])
        elif step[0] == "permute":
            t = t.permute(step[1])
    return t


def _byte_span(t: torch.Tensor) -> tuple[Any, Any]:
    start = t.storage_offset() * t.element_size()
    extent = sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride())) if t.numel() else -1
    return start, start + (extent + 1) * t.element_size() - 1


def byte_spans_overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    (lo, hi), (lo2, hi2) = _byte_span(a), _byte_span(b)
    return lo <= hi2 and lo2 <= hi


def refuse_uncarriable(group: AliasGroup, slots: tuple[InputSlot, ...], inputs: list[Any]) -> None:
    """What no synthetic base can stand for: state (a parameter or buffer passed as an input
    too: its write-back is the module's), members of different dtypes or devices (one base has
    one), symbolic layouts (dynamic shapes: the base's extent is not known), negative strides."""
    names = ", ".join(repr(slots[i].target) for i in group.members)
    first = inputs[group.members[0]]
    why = None
    if any(slots[i].kind is not SlotKind.USER for i in group.members):
        why = "one of them is a parameter, buffer or constant of the model"
    elif any(inputs[i].dtype != first.dtype or inputs[i].device != first.device for i in group.members):
        why = "they view the memory with different dtypes or devices"
    elif group.symbolic:
        why = "their layouts are symbolic (dynamic shapes)"
    elif not group.one_layout and any(view_plan(g) is None for g in group.geometries):
        why = ("one of them is laid out so that no chain of narrow/view/select/permute reads it from "
               "the shared memory (strides that do not nest, or a stride of 0)")
    if why is not None:
        raise UnsupportedError(
            f"the model writes to inputs {names}, which share memory, and {why}: a functional program "
            "cannot carry the write from one to the other; pass distinct tensors (e.g. .clone() one of them)",
            kind=Refusal.WRITE_TO_ALIASED_INPUTS)


class SyntheticBases:
    """The traced inputs with each written alias group regenerated over one base (module
    docstring); after the model call, each member's final value and new layout."""

    __slots__ = ("_groups", "_bases", "_writes_before", "_views", "_start")

    def __init__(self, groups: tuple[AliasGroup, ...]):
        self._groups = groups
        self._bases: list[Any] = []
        self._writes_before: list[int] = []  # the base's storage write count when the model starts
        self._views: dict[int, Any] = {}  # placeholder position -> what the model is given
        self._start: dict[int, int] = {}  # placeholder position -> that view's storage offset then

    def regenerate(self, traced: list[Any]) -> list[Any]:
        """``traced`` with each group's members replaced by views of its base (where all are laid
        out alike, the first member and aliases of it: each keeps its own layout, ``b.t_()`` leaves
        ``a`` as it is). Runs inside the trace: the ops are recorded."""
        given = list(traced)
        for group in self._groups:
            first = traced[group.members[0]]
            if group.one_layout:
                base = first
                views: list[Any] = []
                for k, same in enumerate(group.same_as):
                    views.append(views[same] if same != k else first if k == 0 else first.view(first.shape))
            else:
                base = torch.zeros((group.span,), dtype=first.dtype, device=first.device)
                plans = [view_plan(g) for g in group.geometries]
                for i, plan in zip(group.members, plans):
                    read_view(base, plan).copy_(traced[i])  # type: ignore[arg-type]
                views = [read_view(base, plan) for plan in plans]  # type: ignore[arg-type]
            self._bases.append(base)
            self._writes_before.append(tc.storage_mutation_count(base))
            for i, view in zip(group.members, views):
                given[i] = self._views[i] = view
                self._start[i] = view.storage_offset()
        return given

    @property
    def groups(self) -> tuple[AliasGroup, ...]:
        return self._groups

    def covers(self, i: int) -> bool:
        """Placeholder ``i`` was traced as a member of a group here."""
        return i in self._views

    def written(self) -> tuple[dict[int, Any], dict[int, tuple[tuple, tuple]]]:
        """Placeholder position -> final value, for every member of a group whose memory the model
        wrote or whose layout it changed in place (``b.t_()``); and for the latter, the layout before
        and after (sizes, strides, storage offset), which ``ep.module()`` gives the caller's tensor."""
        final: dict[int, Any] = {}
        relaid: dict[int, tuple[tuple, tuple]] = {}
        for group, base, before in zip(self._groups, self._bases, self._writes_before):
            for i, (sizes, strides, offset) in zip(group.members, group.geometries):
                view = self._views[i]
                now = view.storage_offset() - self._start[i] + offset + group.lowest
                was = (tuple(sizes), tuple(strides), offset + group.lowest)
                if tuple(view.shape) != was[0] or now != was[2] or any(
                        n > 1 and a != b for n, a, b in zip(view.shape, view.stride(), strides)):
                    relaid[i] = (was, (tuple(view.shape), tuple(view.stride()), now))
            written = tc.storage_mutation_count(base) != before
            for i in group.members:
                if written or i in relaid:
                    final[i] = self._views[i]
        return final, relaid
