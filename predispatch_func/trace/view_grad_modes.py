"""Rebuild every stale view in the grad mode eager gave it.

Functionalization keeps a view as its base plus the chain of view ops that
made it, and rebuilds it from the base lazily: a view made after its storage
was written, or whose storage was written since, is rebuilt when a non-view
op next reads it, *in the grad mode of that read*. Eager fixed each link of the
chain when the view was made::

    v = x.t()                      # grad on: v stays differentiable towards x
    with torch.no_grad():
        x.zero_()                  # v is now stale
        y = torch.cat([v, x])      # functionalization rebuilds v here, grad off
    return v                       # eager: v requires grad; its gradient reaches x

    with torch.no_grad():
        v = x.unsqueeze(0)         # eager: a leaf of its own, cut from x
    w = v.expand(2, 3)             # rebuilt from x with grad on: x would get a gradient

So :class:`ViewGradModes` rebuilds a view before an op reads it, between grad
markers (the region pass turns them into region boundaries), whenever the read
runs in the other mode than the view needs: grad off if a link of its chain was
made with grad off, grad on otherwise. Markers around a rebuild that records
nothing (the view was not stale) are erased again.

Two more boundaries. Inside a grad-off region, a tensor written there is the
region's fresh value, and a view made there is a value of the region: either
gets its autograd identity only where the region ends (``identity_of``,
regions/ops.py, carries an operand's identity to a result). So the region is
ended and reopened

* before a view is made, with grad off, of a tensor written in the region: it
  must view the carried value, as eager's view (a leaf that requires grad) does;
* before a write, with grad off, to a view made in the region: the view's own
  identity (that leaf) must come in as an operand to be carried to its new value.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch

from .. import _torch_compat as tc
from .observers import OpCall


def _is_view_op(func: Any) -> bool:
    return bool(getattr(func, "is_view", False))


class ViewGradModes:
    """Per-trace record of each view's chain, and the rebuilds and boundaries it needs
    (an observer of the tracing mode, see observers.py).

    ``may_need_grad(t)`` says whether the base of ``t``'s storage may require
    grad when the program runs; views of other storages need nothing.
    """

    __slots__ = ("_cut", "_made_in_stretch", "_may_need_grad", "_written_in_stretch")

    def __init__(self, may_need_grad: Callable[[Any], bool]):
        self._may_need_grad = may_need_grad
        # id(view) -> (weakref to it, whether a link of its chain was made with grad off)
        self._cut: dict[int, tuple[weakref.ref, bool]] = {}
        # since the current grad-off stretch began: storages written, views made (by id)
        self._written_in_stretch: set[Any] = set()
        self._made_in_stretch: set[int] = set()

    # --- the mode calls these around every op ------------------------------------

    def rebuild_read(self, call: OpCall) -> None:
        """Rebuild the stale views ``call`` reads, before anything else about the call
        reads their values: the refusals, the composite policy's guards and reroutes sync
        (rebuild) their arguments too, in whatever grad mode is current."""
        if not _is_view_op(call.func):  # view ops do not read (sync) their input
            self.rebuild_stale(call.tensors_read())

    def before(self, call: OpCall) -> None:
        func, args, grad = call.func, call.args, call.grad
        if grad:
            self._end_stretch()
        self.rebuild_read(call)  # again: a reroute may have made what this call reads
        if not grad and (self._views_a_storage_written_in_stretch(func, args)
                         or self._writes_a_view_made_in_stretch(call.written)):
            tc.record_grad_marker(True)
            tc.record_grad_marker(False)
            self._end_stretch()

    def after(self, call: OpCall, out: Any) -> None:
        func, args, grad = call.func, call.args, call.grad
        if not grad:
            for w in call.written:
                if self._may_need_grad(w):
                    self._written_in_stretch.add(tc.storage_key(w))
        if _is_view_op(func) and args:
            parent_cut = self.is_cut(args[0])
            for t in call.results(out):
                if (isinstance(t, tc.FunctionalTensor) and t is not args[0]
                        and not tc.is_functional_base(t)):
                    self._cut[id(t)] = (weakref.ref(t), (not grad) or parent_cut)
                    if not grad:
                        self._made_in_stretch.add(id(t))

    def _end_stretch(self) -> None:
        self._written_in_stretch.clear()
        self._made_in_stretch.clear()

    # --- rebuilds ------------------------------------------------------------

    def is_cut(self, t: Any) -> bool:
        """Whether a link of ``t``'s view chain was made with grad off."""
        entry = self._cut.get(id(t))
        return entry is not None and entry[0]() is t and entry[1]

    def rebuild_stale(self, values: list[Any]) -> None:
        """Rebuild the views among ``values`` (flat) that the current grad mode would rebuild wrongly."""
        grad = torch.is_grad_enabled()
        wanted = not grad
        views = [t for t in values if self._needs_mode(t) is wanted]
        if not views:
            return
        marker = tc.record_grad_marker(wanted)
        with tc.grad_mode_untraced(wanted):
            for view in views:
                tc.inner_of_functional(view)
        if tc.erase_if_last_recorded(marker):
            return  # none was stale
        tc.record_grad_marker(grad)
        if not grad:
            self._end_stretch()  # the grad-off region was ended

    def _needs_mode(self, t: Any) -> bool | None:
        """The grad mode a rebuild of ``t`` must run in; None if any mode will do."""
        if not isinstance(t, tc.FunctionalTensor):
            return None
        entry = self._cut.get(id(t))
        if entry is None or entry[0]() is not t:
            return None
        if tc.storage_mutation_count(t) == 0 or not self._may_need_grad(t):  # type: ignore[arg-type]
            return None  # never written: never stale; or no gradient either way
        return not entry[1]

    def _views_a_storage_written_in_stretch(self, func: Any, args: tuple) -> bool:
        return (_is_view_op(func) and bool(self._written_in_stretch) and bool(args)
                and isinstance(args[0], tc.FunctionalTensor)
                and tc.storage_key(args[0]) in self._written_in_stretch)

    def _writes_a_view_made_in_stretch(self, written: list[Any]) -> bool:
        return any(id(w) in self._made_in_stretch and self.is_cut(w) and self._may_need_grad(w)
                   for w in written)
