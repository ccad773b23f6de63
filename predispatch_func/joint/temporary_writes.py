"""In-place writes to the backward's own temporaries, made functional.

The backward is recorded as the ops autograd's engine and C++ kernels run, and those
write their own temporaries in place: ``rms_norm``'s decomposition, recomputed for
its saved rstd, computes ``mean(x.pow(2)).add_(eps)`` (transformers' diffllama); a
CUDA backward formula masks a gradient it just made with ``masked_fill_`` (xglm);
the engine lays a gradient out in a fresh buffer through ``new_zeros`` +
``as_strided`` + ``copy_`` (timm's convnext on the GPU). A write that touches only
a value the backward made, which nothing else views, is its functional twin
(``add``, ``masked_fill``; ``as_strided_scatter`` for a copy into a strided window
of the buffer), with the later readers of the temporary reading the result.

Backward formulas also write through views of their temporaries: ``svd``'s and
``eigh``'s set a diagonal (``E.diagonal().fill_(1)``), ``irfft``'s doubles a
``narrow`` of its spectrum (``mul_``), ``pad``'s circular backward copies into
slices, the chunked ``linear_cross_entropy`` writes ``mm(out=)`` into rows of a
buffer. There the written window is scattered into the temporary
(``as_strided_scatter`` at the window's sizes, strides and offset, which its fake
value records), and every view of the temporary read after the write is taken
again from the result: how functionalization restates a write through a view,
done here only for temporaries all of whose aliases are views in the graph.
A write that could reach anything else (an input, a forward value) is left for
the contract check, which refuses the program.
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Callable
from typing import Any

import torch

from .. import _torch_compat as tc
from ..op_schema import Match, functional_twin

aten = torch.ops.aten


def functional_writes(graph: torch.fx.Graph, first: torch.fx.Node | None = None, *,
                      allows: Callable[[Any], bool] | None = None) -> None:
    """Rewrite, from ``first`` on (the whole graph when None), each in-place op on a temporary
    made in that stretch that nothing aliases, and each ``copy_`` into an ``as_strided``
    window of one. ``allows``: a target's test for an op; where it refuses
    ``as_strided_scatter``, the window is written by ``index_put`` at its flat positions."""
    nodes = list(graph.nodes)
    stretch = nodes[nodes.index(first):] if first is not None else nodes
    made_here = {n for n in stretch if n.op == "call_function"}
    position = {n: i for i, n in enumerate(nodes)}
    for node in stretch:
        twin = _writes_a_temporary(node, made_here, position)
        if twin is not None:
            temporary = node.args[0]
            assert isinstance(temporary, torch.fx.Node)
            node.target = twin
            _read_after(temporary, node, node, position)
        elif _copies_into_a_window_of_a_temporary(node, made_here, position):
            by_index = allows is not None and not allows(aten.as_strided_scatter.default)
            _as_strided_scatter(graph, node, position, by_index=by_index)
    by_index = allows is not None and not allows(aten.as_strided_scatter.default)
    while _one_write_through_a_view(graph, made_here, by_index=by_index):
        pass


def _writes_a_temporary(node: torch.fx.Node, made_here: set[torch.fx.Node], position: dict) -> tc.OpOverload | None:
    """The functional twin of ``node``'s op when it writes only its first argument, a value
    ``made_here`` that aliases nothing and that nothing views."""
    if node.op != "call_function" or not isinstance(node.target, tc.OpOverload):
        return None
    if [i for i, _ in tc.written_arguments(node.target)] != [0] or not node.args:
        return None
    temporary = node.args[0]
    if not _unaliased_temporary(temporary, made_here, writer=node, position=position):
        return None
    return functional_twin(node.target, Match.IN_ORDER)


def _copies_into_a_window_of_a_temporary(node: torch.fx.Node, made_here: set[torch.fx.Node], position: dict) -> bool:
    """``copy_(as_strided(base, ...), src)``: base an unaliased temporary, src of the window's shape
    and dtype (no broadcast or cast to restate)."""
    if node.target is not aten.copy_.default or len(node.args) != 2:
        return False
    window, src = node.args
    if not isinstance(window, torch.fx.Node) or window.target is not aten.as_strided.default:
        return False
    base = window.args[0]
    if not _unaliased_temporary(base, made_here, writer=window, position=position) or len(window.users) != 1:
        return False
    have, want, fresh = getattr(src, "meta", {}).get("val"), window.meta.get("val"), base.meta.get("val")
    return bool(isinstance(have, torch.Tensor) and isinstance(want, torch.Tensor) and isinstance(fresh, torch.Tensor)
                and have.shape == want.shape and have.dtype == want.dtype
                and fresh.is_contiguous() and fresh.storage_offset() == 0)


def _as_strided_scatter(graph: torch.fx.Graph, node: torch.fx.Node, position: dict, *, by_index: bool) -> None:
    window, src = node.args
    assert isinstance(window, torch.fx.Node)
    base, size, stride, *offset = window.args
    assert isinstance(base, torch.fx.Node)
    with graph.inserting_before(node):
        if by_index:
            scattered = _written_by_index(graph, base, src, size, stride, offset[0] if offset else 0)
        else:
            scattered = graph.call_function(aten.as_strided_scatter.default, (base, src, size, stride, *offset))
        scattered.meta.update({k: v for k, v in base.meta.items() if k != "val"})
        scattered.meta["val"] = base.meta.get("val")
        view = graph.call_function(aten.as_strided.default, (scattered, size, stride, *offset))
        view.meta.update(window.meta)
    position[scattered] = position[view] = position[node]
    node.replace_all_uses_with(view)  # copy_ returns the window, now a window of the result
    graph.erase_node(node)
    _read_after(base, scattered, scattered, position)


def _written_by_index(graph: torch.fx.Graph, base: torch.fx.Node, src: Any, size: Any, stride: Any,
                      offset: Any) -> torch.fx.Node:
    """``base`` (contiguous: a fresh buffer) with the window's flat positions set to ``src``, in ops
    of Core ATen: the positions ``offset + sum(arange(size[d]) * stride[d])``, built in the graph."""
    fake_mode = tc.fake_mode_of([base.meta["val"]])

    def call(op: Any, args: tuple, kwargs: dict | None = None) -> torch.fx.Node:
        node = graph.call_function(op, args, kwargs or {})
        value_of = lambda a: a.meta["val"] if isinstance(a, torch.fx.Node) else a  # noqa: E731
        with fake_mode if fake_mode is not None else contextlib.nullcontext():
            node.meta["val"] = op(*tc.pytree.tree_map(value_of, args), **tc.pytree.tree_map(value_of, kwargs or {}))
        return node

    device = base.meta["val"].device
    flat: Any = None if size else call(aten.arange.start_step, (0, 1), {"dtype": torch.int64, "device": device})
    for d, (n, step) in enumerate(zip(size, stride)):
        shape = [1] * len(size)
        shape[d] = n
        along = call(aten.view.default, (call(aten.mul.Scalar, (
            call(aten.arange.start_step, (0, n), {"dtype": torch.int64, "device": device}), step)), shape))
        flat = along if flat is None else call(aten.add.Tensor, (flat, along))
    positions = call(aten.view.default, (call(aten.add.Scalar, (flat, offset)), [-1]))  # a 0-d window: one position
    values = call(aten.view.default, (call(aten.clone.default, (src,), {"memory_format": torch.contiguous_format}), [-1]))
    written = call(aten.index_put.default, (call(aten.view.default, (base, [-1])), [positions], values))
    return call(aten.view.default, (written, list(base.meta["val"].shape)))


def _read_after(temporary: torch.fx.Node, written: torch.fx.Node, result: torch.fx.Node, position: dict) -> None:
    """Readers of ``temporary`` after ``written`` read ``result``."""
    for reader in list(temporary.users):
        if reader is not written and reader is not result and position.get(reader, -1) > position[written]:
            reader.replace_input_with(temporary, result)


def _unaliased_temporary(value: object, made_here: set[torch.fx.Node], *, writer: torch.fx.Node,
                         position: dict) -> bool:
    """A value made here by an op that returns a fresh tensor, with no view of it taken before
    ``writer`` but ``writer`` itself (views taken after read the written value: redirected)."""
    if not isinstance(value, torch.fx.Node) or value not in made_here or _returns_a_view(value):
        return False
    return not any(_returns_a_view(u) for u in value.users
                   if u is not writer and position.get(u, -1) < position[writer])


def _returns_a_view(node: torch.fx.Node) -> bool:
    if node.target is operator.getitem:  # one result of a multi-output op: a view if the op's are (split)
        return isinstance(node.args[0], torch.fx.Node) and _returns_a_view(node.args[0])
    target = node.target
    if not isinstance(target, tc.OpOverload):  # a region call: functional, its results fresh
        return False
    if target.overloadpacket is aten.to and _converts(node):  # `to` returns its input only when it changes nothing
        return False
    schema = tc.schema_of(target)
    return not schema.is_mutable and any(r.alias_info is not None for r in schema.returns)


def _converts(node: torch.fx.Node) -> bool:
    source = node.args[0].meta.get("val") if node.args and isinstance(node.args[0], torch.fx.Node) else None
    result = node.meta.get("val")
    return (isinstance(source, torch.Tensor) and isinstance(result, torch.Tensor)
            and (source.dtype != result.dtype or source.device != result.device))


def _one_write_through_a_view(graph: torch.fx.Graph, made_here: set[torch.fx.Node], *, by_index: bool) -> bool:
    """Rewrite the first write (in-place, or ``out=`` one tensor) into an alias of a temporary
    whose aliases are all known; False when none is left."""
    nodes = list(graph.nodes)
    position = {n: i for i, n in enumerate(nodes)}
    for writer in nodes:
        written = _written_tensor(writer)
        if written is None or writer not in made_here:
            continue
        base = _base_of(written)
        family = _aliases_of(base, nodes) if _fresh(base, made_here) else None
        if family is None or writer not in family:
            continue
        twin = functional_twin(writer.target)
        if twin is None:
            continue
        if _scatter_the_write(graph, writer, twin, written, base, family, position, made_here, by_index=by_index):
            return True
    return False


def _written_tensor(node: torch.fx.Node) -> torch.fx.Node | None:
    """The one tensor ``node`` writes: an in-place op's first argument, or its single ``out=``."""
    if node.op != "call_function" or not isinstance(node.target, tc.OpOverload):
        return None
    written = tc.written_arguments(node.target)
    if [name for _, name in written] == ["out"] and isinstance(node.kwargs.get("out"), torch.fx.Node):
        return node.kwargs["out"]  # type: ignore[return-value]
    if [i for i, _ in written] == [0] and node.args and isinstance(node.args[0], torch.fx.Node):
        return node.args[0]
    return None


def _aliased(node: torch.fx.Node) -> torch.fx.Node | None:
    """The tensor ``node``'s result aliases: a view's input, what an in-place or ``out=`` op wrote."""
    if node.op != "call_function":
        return None
    if node.target is operator.getitem:
        return _aliased(node.args[0]) if isinstance(node.args[0], torch.fx.Node) and _returns_a_view(node) else None
    if _returns_a_view(node):
        first = node.args[0] if node.args else None
        return first if isinstance(first, torch.fx.Node) else None
    return _written_tensor(node)


def _base_of(node: torch.fx.Node) -> torch.fx.Node:
    while (inner := _aliased(node)) is not None:
        node = inner
    return node


def _fresh(base: torch.fx.Node, made_here: set[torch.fx.Node]) -> bool:
    """A value the backward made by an op that returns a new tensor (not a view, not a write)."""
    return bool(base in made_here and _aliased(base) is None and isinstance(base.target, tc.OpOverload)
                and not tc.schema_of(base.target).is_mutable and isinstance(base.meta.get("val"), torch.Tensor))


def _static(value: torch.Tensor) -> bool:
    return all(type(n) is int for n in (*value.shape, *value.stride(), value.storage_offset()))


def _aliases_of(base: torch.fx.Node, nodes: list[torch.fx.Node]) -> list[torch.fx.Node] | None:
    """Every node whose result aliases ``base`` (views, writes into them), in graph order; None when
    one is read by something that could alias it unseen (a call that is not an aten op)."""
    family = [node for node in nodes if node is not base and _aliased(node) is not None and _base_of(node) is base]
    for member in (base, *family):
        if any(u.op == "call_function" and not isinstance(u.target, tc.OpOverload) and u.target is not operator.getitem
               for u in member.users):
            return None
    return family


def _scatter_the_write(graph: torch.fx.Graph, writer: torch.fx.Node, twin: tc.OpOverload, window: torch.fx.Node,
                       base: torch.fx.Node, family: list[torch.fx.Node], position: dict, made_here: set[torch.fx.Node],
                       *, by_index: bool) -> bool:
    """``writer`` computed functionally and scattered back into ``base`` view by view (each view's
    inverse: ``slice_scatter`` for a ``narrow``, ``diagonal_scatter`` for a ``diagonal``, ...: by
    logical index, so the result does not depend on strides, which a fake value may record
    otherwise than the kernel lays out: ``_fft_r2c`` on torch 2.11); readers after it of ``base``
    read the result, of an alias taken before it the same view of the result."""
    chain = []
    node = window
    while node is not base:
        if not _invertible(node, by_index):
            return False
        chain.append(node)
        node = _source_of(node)
    kwargs = {k: v for k, v in writer.kwargs.items() if k != "out"}
    later = {n for n in graph.nodes if position[n] > position[writer]}
    with graph.inserting_before(writer):
        value = graph.call_function(twin, writer.args, kwargs)
        value.meta.update(writer.meta)
        value.meta["val"] = window.meta.get("val") if "out" in writer.kwargs else writer.meta.get("val")
        made_here.add(value)
        result = value
        for view in chain:
            result = _scattered_back(graph, view, result, writer)
            made_here.add(result)
        again: dict[torch.fx.Node, torch.fx.Node] = {base: result}
        for member in [m for m in family if position[m] < position[writer]] + [writer]:
            readers = [u for u in member.users if u in later]
            if readers:
                taken = _taken_again(graph, window if member is writer else member, again, made_here)
                for reader in readers:
                    reader.replace_input_with(member, taken)
    for reader in [u for u in base.users if u in later]:
        reader.replace_input_with(base, result)
    graph.erase_node(writer)
    return True


_SPLITS = (aten.split.Tensor, aten.split_with_sizes.default, aten.unbind.int)
# views of the same elements in another shape (not reshape or flatten: they copy a tensor no view can
# reshape, and a write into the copy leaves the source as it was)
_SAME_ELEMENTS = (aten.view.default, tc.resolve_overload("aten", "_unsafe_view.default"), aten.squeeze.dim,
                  aten.squeeze.dims, aten.squeeze.default, aten.unsqueeze.default)


def _source_of(view: torch.fx.Node) -> torch.fx.Node:
    source = view.args[0]
    if view.target is operator.getitem:
        assert isinstance(source, torch.fx.Node)
        source = source.args[0]
    assert isinstance(source, torch.fx.Node)
    return source


def _invertible(view: torch.fx.Node, by_index: bool) -> bool:
    """A view whose write-back by logical index is written below (``_scattered_back``)."""
    target = view.target
    if target is operator.getitem:
        multi = view.args[0]
        return isinstance(multi, torch.fx.Node) and multi.target in _SPLITS and isinstance(view.args[1], int) \
            and all(_static(t) for t in multi.meta.get("val", ()))
    if target in _SAME_ELEMENTS:
        source = view.args[0]
        return isinstance(source, torch.fx.Node) and isinstance(source.meta.get("val"), torch.Tensor) \
            and _static(source.meta["val"])
    if target is aten.as_strided.default:
        return not by_index
    if target is aten.real.default:  # of a real tensor: the tensor itself (qr's backward halves a diagonal's real part)
        source = view.args[0]
        return isinstance(source, torch.fx.Node) and isinstance(source.meta.get("val"), torch.Tensor) \
            and not source.meta["val"].is_complex()
    return target in (aten.narrow.default, aten.slice.Tensor, aten.select.int, aten.diagonal.default,
                      aten.permute.default, aten.transpose.int, aten.t.default, aten.alias.default,
                      aten.detach.default) \
        and all(not isinstance(a, torch.fx.Node) for a in view.args[1:])


def _scattered_back(graph: torch.fx.Graph, view: torch.fx.Node, content: torch.fx.Node,
                    writer: torch.fx.Node) -> torch.fx.Node:
    """The source of ``view`` with ``view``'s elements replaced by ``content``."""
    source = _source_of(view)
    target: Any = view.target
    rest: list[Any] = list(view.args[1:])
    call: tuple[Any, tuple]
    if target is operator.getitem:
        multi: Any = view.args[0]
        index: Any = view.args[1]
        dim: Any = _argument(multi, 2 if multi.target is not aten.unbind.int else 1, "dim", 0)
        if multi.target is aten.unbind.int:
            call = (aten.select_scatter.default, (source, content, dim, index))
        else:
            sizes = [t.shape[dim] for t in multi.meta["val"]]
            start = sum(sizes[:index])
            call = (aten.slice_scatter.default, (source, content, dim, start, start + sizes[index], 1))
    elif target is aten.narrow.default:
        along, start, length = rest
        call = (aten.slice_scatter.default, (source, content, along, start, start + length, 1))
    elif target is aten.slice.Tensor:
        call = (aten.slice_scatter.default, (source, content, *rest))
    elif target is aten.select.int:
        call = (aten.select_scatter.default, (source, content, *rest))
    elif target is aten.diagonal.default:
        call = (aten.diagonal_scatter.default, (source, content, *rest))
    elif target is aten.as_strided.default:
        call = (aten.as_strided_scatter.default, (source, content, *rest))
    elif target in _SAME_ELEMENTS:
        call = (aten.view.default, (content, list(source.meta["val"].shape)))
    elif target is aten.permute.default:
        dims = [d % len(rest[0]) for d in rest[0]]
        call = (aten.permute.default, (content, sorted(range(len(dims)), key=dims.__getitem__)))
    elif target in (aten.transpose.int, aten.t.default):
        call = (target, (content, *rest))
    else:  # alias, detach, real of a real tensor: the same elements
        return content
    node = graph.call_function(call[0], call[1], dict(view.kwargs) if call[0] is target else {})
    node.meta.update({k: v for k, v in writer.meta.items() if k != "val"})
    node.meta["val"] = source.meta.get("val")
    return node


def _argument(node: torch.fx.Node, position: int, name: str, default: Any) -> Any:
    if len(node.args) > position:
        return node.args[position]
    return node.kwargs.get(name, default)


def _taken_again(graph: torch.fx.Graph, alias: torch.fx.Node, again: dict[torch.fx.Node, torch.fx.Node],
                 made_here: set[torch.fx.Node]) -> torch.fx.Node:
    """``alias`` (a chain of views of the base) taken again from the written result."""
    if alias not in again:
        source, target = alias.args[0], alias.target
        assert isinstance(source, torch.fx.Node) and callable(target)
        node = graph.call_function(target, (_taken_again(graph, source, again, made_here), *alias.args[1:]),
                                   dict(alias.kwargs))
        node.meta.update(alias.meta)
        again[alias] = node
        made_here.add(node)
    return again[alias]


__all__ = ["functional_writes"]
