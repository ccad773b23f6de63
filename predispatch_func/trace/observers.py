"""What the tracing mode records about each op, one small class per fact.

:class:`~predispatch_func.trace.stack.PolicyFunctionalMode` dispatches every
op the same way: refuse, reroute (policy), dispatch, and around the dispatch
call each observer's ``before(call)`` and ``after(call, out)`` in order. An
observer reads the :class:`OpCall` (the op, its arguments, the tensors it
writes, the user's grad mode) and keeps what a later observer, a later op or
a later stage needs::

    bases = Bases(); reach = GradReach(); detached = DetachedAliases()
    observers = [ViewGradModes(...), CopyTargetFlag(...),
                 IdentityEdges(bases, reach, detached), detached, reach, bases]

``after`` runs while the op's dispatch context is still active (grad off for a
write done without autograd, see :class:`IdentityEdges`); observers read the
user's mode from ``call.grad``, never from torch's global state. With
``pre_dispatch=False`` there is nothing to observe: autograd already ran.
"""

from __future__ import annotations

import weakref
from typing import Any, Protocol

import torch

from .. import _torch_compat as tc
from ..artifacts import GradFreeWrite
from ..autograd_facts import Fact, has, may_carry_grad
from ..errors import Refusal, UnsupportedError, user_source_line
from .differentiable_copy import CopyTarget

_COPY_ = torch.ops.aten.copy_.default
_DETACH_ = torch.ops.aten.detach_.default
_DETACH = torch.ops.aten.detach.default

_NO_RESULT = object()  # OpCall.results before the op returned


class OpCall:
    """One op being dispatched: what every observer reads."""

    __slots__ = ("func", "args", "kwargs", "written", "grad", "without_autograd", "decomposed", "_read", "_out",
                 "_results")

    def __init__(self, func: Any, args: tuple, kwargs: dict, written: list[Any]):
        self.func = func
        self.args = args
        self.kwargs = kwargs
        self.written = written  # the FunctionalTensors the op writes in place
        self.grad = torch.is_grad_enabled()  # the user's grad mode for this op
        self.without_autograd = False  # set by IdentityEdges: dispatch with grad off
        self.decomposed = False  # set by the mode: the op's decomposition was traced, op by op
        self._read: list[Any] | None = None
        self._out: Any = _NO_RESULT
        self._results: list[Any] = []

    def tensors_read(self) -> list[Any]:
        """The tensor arguments (flattened once per op: several observers read them)."""
        if self._read is None:
            self._read = [t for t in _leaves((self.args, tuple(self.kwargs.values()))) if isinstance(t, torch.Tensor)]
        return self._read

    def results(self, out: Any) -> list[Any]:
        """The leaves of the op's result ``out`` (flattened once per op)."""
        if self._out is not out:
            self._out, self._results = out, _leaves(out)
        return self._results


def _leaves(value: Any) -> list[Any]:
    """The leaves of an ATen op's arguments or results, in order: only lists and tuples
    nest there (``Tensor[]``, a tuple of results), so torch's general pytree walk is not
    needed on a path every op takes."""
    if not isinstance(value, (list, tuple)):
        return [value]
    found: list[Any] = []
    for item in value:
        if isinstance(item, (list, tuple)):
            found.extend(_leaves(item))
        else:
            found.append(item)
    return found


class Observer(Protocol):
    def before(self, call: OpCall) -> None: ...

    def after(self, call: OpCall, out: Any) -> None: ...


def written_tensors(func: Any, args: tuple, kwargs: dict) -> list[Any]:
    """The traced tensors ``func`` writes, positional or keyword (``out=`` is keyword-only)."""
    if not tc.written_arguments(func):
        return []
    return [v for v in tc.written_values(func, args, kwargs) if isinstance(v, tc.FunctionalTensor)]


class Bases:
    """The base FunctionalTensor of each storage, and which bases are graph inputs.

    A write through a view changes its base: identity edges, the ``copy_``
    lowering and view rebuilds all need the base a written view belongs to.
    """

    __slots__ = ("_by_storage", "input_ids")

    def __init__(self) -> None:
        self._by_storage: dict[Any, Any] = {}
        self.input_ids: set[int] = set()

    def add_inputs(self, inputs: list[Any]) -> None:
        self.input_ids = {id(t) for t in inputs if isinstance(t, torch.Tensor)}
        for t in inputs:
            self._track(t)

    def base_of(self, t: Any) -> Any:
        return self._by_storage.get(tc.storage_key(t))

    def bases_of(self, tensors: list[Any]) -> list[Any]:
        """The distinct bases of ``tensors``, in order."""
        found: list[Any] = []
        for t in tensors:
            base = self.base_of(t)
            if base is not None and all(base is not b for b in found):
                found.append(base)
        return found

    def is_unwritten_input(self, written: list[Any]) -> bool:
        """``written`` is one graph input (or a view of one) that nothing wrote before."""
        if len(written) != 1 or tc.storage_mutation_count(written[0]) != 0:
            return False
        return self.is_input_storage(written[0])

    def is_input_storage(self, t: Any) -> bool:
        """``t`` is a graph input or a view of one (written or not)."""
        base = self.base_of(t)
        return base is not None and id(base) in self.input_ids

    def _track(self, t: Any) -> None:
        if isinstance(t, tc.FunctionalTensor) and tc.is_functional_base(t):
            self._by_storage.setdefault(tc.storage_key(t), t)

    def before(self, call: OpCall) -> None:
        pass

    def after(self, call: OpCall, out: Any) -> None:
        for t in call.results(out):
            self._track(t)


class GradReach:
    """Tensors that may require grad when the program runs.

    Autograd does not run while tracing, so we track it: a float tensor computed
    with grad on from one that may require grad (a float graph input, a
    parameter) may too. A view rebuild, and a write through a detached alias,
    behave differently for such tensors.
    """

    __slots__ = ("_reached", "nodes_without_grad")

    def __init__(self) -> None:
        self._reached: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
        # graph nodes of values made with grad off (under no_grad, detach): no gradient
        # flows back through them, whatever they were computed from
        self.nodes_without_grad: set[torch.fx.Node] = set()

    def add_inputs(self, inputs: list[Any]) -> None:
        for t in inputs:
            if may_carry_grad(t):
                self._reached[id(t)] = t

    def may_need_grad(self, t: Any) -> bool:
        return self._reached.get(id(t)) is t

    def before(self, call: OpCall) -> None:
        pass

    def after(self, call: OpCall, out: Any) -> None:
        if not call.grad or call.without_autograd or has(call.func, Fact.NEVER_DIFFERENTIABLE):
            self._note_made_without_grad(call, out)
            return
        if call.func is _DETACH:  # eager's result is a new leaf that does not require grad
            return
        if call.func is _DETACH_:  # nor does the tensor detach_() is called on
            self._reached.pop(id(call.args[0]), None)
            return
        if any(self.may_need_grad(t) for t in call.tensors_read()):
            for t in [*call.results(out), *call.written]:
                if may_carry_grad(t):
                    self._reached[id(t)] = t


    def _note_made_without_grad(self, call: OpCall, out: Any) -> None:
        """Only new values: a tensor written in place with grad off keeps its history in eager
        (a parameter clamped under no_grad still requires grad), so its new node stays walkable."""
        if call.written:
            return
        for t in call.results(out):
            node = tc.proxy_node_of(tc.fresh_inner_of_functional(t)) if isinstance(t, torch.Tensor) else None
            if node is not None:
                self.nodes_without_grad.add(node)


class RequiresGradFlags:
    """Sets each traced tensor's ``requires_grad`` as eager's would read.

    Autograd does not run while tracing, so a traced intermediate reported
    ``requires_grad=False`` where eager's requires grad; Python code that
    branches on it (the model's, or torch's: ``linear_cross_entropy`` baked
    ``compute_input_grad=input.requires_grad`` into its op) traced the branch
    eager does not take. Eager's rule, on the flags of the example inputs: a
    result of an op run with autograd from a tensor that requires grad does.
    """

    __slots__ = ("_cleared",)

    def __init__(self) -> None:
        self._cleared: dict[int, list[Any]] = {}  # by id(call)

    def before(self, call: OpCall) -> None:
        # torch replays an in-place view op on the wrapper itself (to update its
        # metadata); the wrapper is an autograd leaf, refused in-place while flagged
        if torch.Tag.inplace_view in getattr(call.func, "tags", ()):
            flagged = [t for t in call.written if t.requires_grad]
            for t in flagged:
                set_requires_grad(t, False)
            if flagged:
                self._cleared[id(call)] = flagged

    def after(self, call: OpCall, out: Any) -> None:
        for t in self._cleared.pop(id(call), ()):
            set_requires_grad(t, True)
        if call.func is _DETACH_:  # eager: the tensor no longer requires grad
            set_requires_grad(call.args[0], False)
            return
        if not call.grad or call.without_autograd or has(call.func, Fact.NEVER_DIFFERENTIABLE):
            return
        if any(t.requires_grad for t in call.tensors_read()):
            for t in [*call.results(out), *call.written]:
                if may_carry_grad(t):
                    set_requires_grad(t, True)


def set_requires_grad(t: Any, wanted: bool) -> None:
    """Set a traced tensor's flag as eager's would read (a traced wrapper is an autograd leaf)."""
    if isinstance(t, tc.FunctionalTensor) and t.requires_grad != wanted and t.is_leaf:
        t.requires_grad = wanted  # the attribute: requires_grad_() is an op our mode would see


class DetachedAliases:
    """``detach()``-ed aliases and their views: a write through one is done without
    autograd although grad is on (eager: the data changes, the history does not)."""

    __slots__ = ("_held",)

    def __init__(self) -> None:
        # by id, weakly (a dropped alias is no alias: `w.data = w.data * s` keeps none alive)
        self._held: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()

    def _holds(self, t: Any) -> bool:
        return self._held.get(id(t)) is t

    def holds_any(self, tensors: list[Any]) -> bool:
        return any(self._holds(t) for t in tensors)

    def before(self, call: OpCall) -> None:
        pass

    def after(self, call: OpCall, out: Any) -> None:
        func, args = call.func, call.args
        # view(dtype) is a view autograd does not see (not differentiable): like detach()
        unseen = has(func, Fact.UNSEEN_ALIAS)
        if unseen or (getattr(func, "is_view", False) and args and self._holds(args[0])):
            for t in call.results(out):
                # an op that *may* alias (``to``) but copied is no detached alias
                if isinstance(t, tc.FunctionalTensor) and (
                        unseen or tc.storage_key(t) == tc.storage_key(args[0])):
                    self._held[id(t)] = t


class CopyTargetFlag:
    """Tells the ``copy_`` lowering (differentiable_copy.py), which runs below this
    mode on plain tensors, whether its destination is an unwritten graph input."""

    __slots__ = ("_target", "_bases")

    def __init__(self, target: CopyTarget, bases: Bases):
        self._target = target
        self._bases = bases

    def before(self, call: OpCall) -> None:
        is_copy = call.func is _COPY_
        self._target.unwritten_input = is_copy and self._bases.is_unwritten_input(call.written)
        self._target.source_is_input = (is_copy and len(call.args) > 1
                                        and self._bases.is_input_storage(call.args[1]))

    def after(self, call: OpCall, out: Any) -> None:
        self._target.unwritten_input = False
        self._target.source_is_input = False


class IdentityEdges:
    """New-value node -> old-value node, for each write done without autograd.

    Eager keeps a tensor's autograd identity across an in-place write under
    ``no_grad`` or through a detached alias; functionalization makes a new
    value. The region pass (regions/outline.py) reads these edges to carry the old
    identity to the new value (``identity_of``). Such a write is dispatched
    with grad off (``call.without_autograd``); one through a detached alias with
    grad on, or by an op eager's autograd does not record
    (``Fact.WRITE_NOT_RECORDED``), also gets grad markers around it, so
    it becomes a no_grad region.
    """

    __slots__ = ("edges", "grad_free_writes", "opaque_bodies", "_bases", "_reach", "_detached", "_pending")

    def __init__(self, bases: Bases, reach: GradReach, detached: DetachedAliases):
        self.edges: dict[torch.fx.Node, torch.fx.Node] = {}
        self.grad_free_writes: list[GradFreeWrite] = []  # see _refuse_grad_value
        # > 0 inside torch's functionalization of a HOP's bodies: their operands are wrappers
        # made there, which the grad reach never saw, and no program input stands for them
        self.opaque_bodies = 0
        self._bases = bases
        self._reach = reach
        self._detached = detached
        self._pending: dict[int, tuple[list[Any], list[Any], bool]] = {}  # by id(call)

    def note(self, source: Any, value: Any) -> None:
        """``value`` keeps ``source``'s autograd identity (a re-traced region HOP says so)."""
        new = tc.proxy_node_of(tc.inner_of_functional(value))
        old = tc.proxy_node_of(tc.inner_of_functional(source))
        if new is not None and old is not None and new is not old:
            self.edges[new] = old

    def before(self, call: OpCall) -> None:
        through_detach = call.grad and self._detached.holds_any(call.written)
        transparent = call.grad and has(call.func, Fact.WRITE_NOT_RECORDED)
        call.without_autograd = bool(call.written) and (not call.grad or through_detach or transparent)
        if not call.without_autograd:
            return
        if through_detach:
            self._refuse_grad_value(call)
        # the bases written, and the written views themselves: after a write under
        # no_grad, eager's view keeps its own autograd identity too
        bases = self._bases.bases_of(call.written)
        if not through_detach:  # a detached alias has no autograd identity to keep
            bases += [w for w in call.written if all(w is not b for b in bases)]
        before = [tc.proxy_node_of(tc.inner_of_functional(b)) for b in bases]
        marked = through_detach or transparent
        if marked:  # eager: same as writing under no_grad
            tc.record_grad_marker(False)
        self._pending[id(call)] = (bases, before, marked)

    def after(self, call: OpCall, out: Any) -> None:
        if not call.without_autograd:
            return
        bases, before, marked = self._pending.pop(id(call))
        after = [tc.proxy_node_of(tc.inner_of_functional(b)) for b in bases]
        if marked:
            tc.record_grad_marker(True)
        for old, new in zip(before, after):  # bases first: a base's identity wins
            if old is not None and new is not None and new is not old:
                self.edges.setdefault(new, old)

    def _refuse_grad_value(self, call: OpCall) -> None:
        """Writing a value that requires grad through a detached alias gives, in eager,
        the alias its own autograd history while the tensor it aliases keeps its old
        one: two histories for one storage, which a no_grad region cannot express.

        Refused where the value requires grad in this export (eager's flag, on the example
        inputs' and parameters' flags: :class:`RequiresGradFlags`). A value that only may
        (computed from float inputs or parameters that do not require grad here) carries no
        gradient to change: the write is exported without autograd and noted
        (:class:`~predispatch_func.artifacts.GradFreeWrite`), so the program refuses to run
        with those inputs requiring grad."""
        operands = [t for t in call.tensors_read() if all(t is not w for w in call.written)]
        if self.opaque_bodies:  # a HOP body: any float value may carry a gradient, nothing can be checked
            if any(may_carry_grad(t) for t in operands):
                raise grad_value_through_detach(call.func, user_source_line(), " inside a torch higher-order "
                                                "op's body, whose operands the program cannot check",
                                                value="a value that may require grad (a float value computed "
                                                "under grad mode)")
            return
        may_need = [t for t in operands if self._reach.may_need_grad(t)]
        if not may_need:
            return
        line = user_source_line()
        if any(t.requires_grad for t in may_need):
            raise grad_value_through_detach(call.func, line)
        self.grad_free_writes.append(GradFreeWrite(_placeholders_behind(may_need, self._reach.nodes_without_grad),
                                                   str(call.func), line))


def grad_value_through_detach(op: Any, line: str | None, where: str = "", *,
                              value: str = "a value that requires grad (computed under grad mode from a float "
                              "input or parameter that requires grad)") -> UnsupportedError:
    """The refusal of a write, through a detached alias, of a value that requires grad."""
    return UnsupportedError(
        f"{value} is written through a detach()-ed alias{where}: eager gives the alias its own "
        "autograd history while the tensor it aliases keeps its old one, which one functional value "
        "cannot carry; write to a clone, or detach the value written", kind=Refusal.GRAD_VALUE_THROUGH_DETACH,
        op=op, source=line)


def _placeholders_behind(tensors: list[Any], without_grad: set[torch.fx.Node]) -> tuple[torch.fx.Node, ...]:
    """The graph placeholders whose values ``tensors`` were computed from with autograd, as
    traced so far: through float values made with grad on only."""
    todo = [node for node in (tc.proxy_node_of(tc.inner_of_functional(t)) for t in tensors) if node is not None]
    seen: set[torch.fx.Node] = set()
    found: dict[torch.fx.Node, None] = {}
    while todo:
        node = todo.pop()
        if node in seen:
            continue
        seen.add(node)
        if node in without_grad or not _may_hold_a_gradient(node):  # made under no_grad; a mask, an index
            continue
        if node.op == "placeholder":
            found[node] = None
        if node.target is not _DETACH:  # no gradient reaches anything behind a detach
            todo.extend(node.all_input_nodes)
    return tuple(found)


def _may_hold_a_gradient(node: torch.fx.Node) -> bool:
    """Whether ``node``'s value can be on an autograd path: eager gives no boolean or integer
    tensor a history (``w > 0`` used as ``masked_fill_``'s mask leaves the result free of ``w``)."""
    value = node.meta.get("val")
    if isinstance(value, torch.Tensor):
        return value.is_floating_point() or value.is_complex()
    return True

