"""The tracing mode stack, entered through one function: :func:`trace_functional`.

On the PreDispatch key (above autograd) sit, top first:

* :class:`PolicyFunctionalMode`: torch's FunctionalTensorMode, with the
  keep-or-decompose decision for composites handed to a
  :class:`~predispatch_func.trace.composite_policy.CompositePolicy`, and errors
  enriched with the op being dispatched;
* torch's ProxyTorchDispatchMode (pushed by ``make_fx(pre_dispatch=True)``),
  which records each functional op, plus grad-mode and autocast toggles as
  marker nodes that the region pass later outlines.

With ``pre_dispatch=False`` the same modes sit on the Python key, below
autograd, and record plain post-autograd ATen.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from .. import _torch_compat as tc
from ..artifacts import Trace
from ..autograd_facts import may_carry_grad
from ..errors import ExportError, user_source_line
from ..mode_capabilities import TraceBody
from ..op_schema import Match, functional_twin
from . import environment, refusals
from .ambient import AmbientModes
from .autocast_composites import AutocastComposites
from .composite_policy import CompositePolicy
from .differentiable_copy import CopyTarget, copy_decompositions
from .differentiable_scatter import scatter_decompositions, users_own_call
from .extensions.tensor_subclasses import SubclassValues
from .observers import (
    Bases,
    CopyTargetFlag,
    DetachedAliases,
    GradReach,
    IdentityEdges,
    Observer,
    OpCall,
    RequiresGradFlags,
    set_requires_grad,
    written_tensors,
)
from .out_variants import COMPARISONS_IN_PLACE, RANDOM_FILLS, compare_in_place_keeping_grad, fill_randomly_keeping_grad
from .saved_reads import SavedReads
from .tensor_data import HiddenWrites, StorageAliases
from .view_grad_modes import ViewGradModes

_RESIZE_AS_ = torch.ops.aten.resize_as_.default
_SET_SOURCE_TENSOR = torch.ops.aten.set_.source_Tensor
_RESIZE_ = torch.ops.aten.resize_.default


def _grows_storage(t: Any, size: Any) -> bool:
    """``t.resize_(size)`` needs more memory than ``t`` has, and ``PolicyFunctionalMode._grow`` can
    say it: static sizes, ``t`` contiguous (its elements in memory order), nothing after it in memory,
    (one that requires grad is refused first: refusals.resize_with_grad). Any other growth goes to torch's functionalization, which refuses it
    (refusals._KNOWN_TORCH_LIMITS: ``INPUT_METADATA_MUTATION``)."""
    if not (isinstance(t, torch.Tensor) and all(isinstance(n, int) for n in (*size, *t.shape, *t.stride()))
            and isinstance(t.storage_offset(), int) and t.is_contiguous()):
        return False
    needed = (t.storage_offset() + math.prod(size)) * t.element_size()
    held = tc.inner_of_functional(t).untyped_storage().nbytes()
    return needed > held and held == (t.storage_offset() + t.numel()) * t.element_size()


_AS_STRIDED_SCATTER = torch.ops.aten.as_strided_scatter.default

class PolicyFunctionalMode(tc.FunctionalTensorMode):
    """FunctionalTensorMode that asks our policy which composites to keep, and records
    what later stages need through named observers (observers.py).

    Every op: refuse (refusals.py), reroute (the policy's honest twin or eager's
    kernel), dispatch, with each observer's ``before``/``after`` around it. What
    runs is chosen once here, for ``pre_dispatch`` True or False. (torch's
    higher-order ops find a mode's rule by its exact type: trace/extensions/torch_hops.py
    gives this type FunctionalTensorMode's rules.)
    """

    def __init__(self, policy: CompositePolicy, *, pre_dispatch: bool, copy_target: CopyTarget,
                 under: PolicyFunctionalMode | None = None):
        super().__init__(pre_dispatch=pre_dispatch, export=True)
        self.policy = policy
        self.failed_op: Any = None
        self.dispatched = 0  # ops dispatched so far: one that grew it while dispatching was decomposed
        self._straight: dict[Any, bool] = {}  # op -> tc.goes_straight_to_functionalization(op)
        self.bases = Bases()
        self.grad_reach = GradReach()
        detached = DetachedAliases()
        self.identity = IdentityEdges(self.bases, self.grad_reach, detached)
        self.view_modes = ViewGradModes(self._base_may_need_grad)
        self.metadata_writes = refusals.InputMetadataWrites()
        # a twin below autograd (``under``) watches draws against its PreDispatch mode's reseeds
        # a twin below autograd (``under``) watches draws against its PreDispatch mode's reseeds
        self.draws_after_reseed: refusals.DrawsAfterReseed = (
            under.draws_after_reseed if under is not None else refusals.DrawsAfterReseed())
        self.subclasses = SubclassValues(self)  # a tensor subclass's API used, or one built, in forward
        self._refusals = (*refusals.checks(pre_dispatch, self.metadata_writes, self.draws_after_reseed,
                                           under_pre_dispatch=under is not None),
                           self.subclasses.refuse_writes, self.subclasses.refuse_shadowed_reads)
        self._reroute = self._rerouted if pre_dispatch else policy.rerouted_after_autograd
        self.autocast_composites = AutocastComposites()
        # `.data` (tensor_data.py): `t.data = v` against live aliases; writes after a saved read
        self.storage_aliases = StorageAliases()
        self.saved_reads = SavedReads(self.grad_reach.may_need_grad) if pre_dispatch else None
        self.hidden_writes = HiddenWrites(self.saved_reads) if self.saved_reads is not None else None
        self._observers: tuple[Observer, ...] = (
            self.view_modes, CopyTargetFlag(copy_target, self.bases), self.identity,
            detached, self.grad_reach, RequiresGradFlags(), self.bases, self.storage_aliases,
            self.hidden_writes, self.saved_reads) if self.hidden_writes is not None and self.saved_reads is not None \
            else (self.storage_aliases,)

    def add_graph_inputs(self, inputs: Sequence[Any]) -> None:
        self.bases.add_inputs(list(inputs))
        self.grad_reach.add_inputs(list(inputs))
        self.storage_aliases.add_inputs(list(inputs))
        self.subclasses.note_values(list(inputs))
        if self.saved_reads is not None:
            self.saved_reads.add_inputs(list(inputs))

    def before_opaque_call(self, operands: list[Any]) -> None:
        """Before a call this mode does not dispatch as one op reads ``operands`` (and so
        rebuilds their stale views): rebuild them in the grad mode eager made them in, as
        before an op (view_grad_modes.py)."""
        if self.saved_reads is not None:
            self.view_modes.rebuild_stale(operands)

    @contextlib.contextmanager
    def opaque_body(self) -> Iterator[None]:
        """Around torch's functionalization of a HOP's bodies (``trace/extensions/torch_hops.py``)."""
        self.identity.opaque_bodies += 1
        try:
            yield
        finally:
            self.identity.opaque_bodies -= 1

    def observe_opaque_call(self, what: str, operands: list[Any], results: list[Any], *, keeps_inputs: bool,
                            non_differentiable: Sequence[int] = (), backward_unchecked: bool = False,
                            saved_results: Sequence[int] = ()) -> None:
        """A call this mode does not dispatch as one op (a torch HOP, a custom autograd.Function),
        observed as an op's: its reads by the saved-read watch (saved_reads.SavedReads), its
        results by every observer. Without it a write through a result found no base to keep its
        identity, and its ``requires_grad`` read False where eager's is True."""
        if self.saved_reads is not None:
            self.saved_reads.note_opaque_read(what, operands, keeps_inputs=keeps_inputs)
            if backward_unchecked:
                self.saved_reads.note_unchecked_read(what, operands)
            self.saved_reads.note_saved_results(what, [results[i] for i in saved_results])
        call = OpCall(what, tuple(t for t in operands if isinstance(t, torch.Tensor)), {}, [])
        for observer in self._observers:
            observer.after(call, results)
        for i in non_differentiable:  # eager: marked non-differentiable, never requires grad
            set_requires_grad(results[i], False)

    def twin_below_autograd(self) -> PolicyFunctionalMode | None:
        """This mode as the Python key's (``pre_dispatch=False``), for what the PreDispatch key
        cannot trace (``torch.func`` transforms, trace/extensions/func_transforms.py); None when this mode is
        already below autograd."""
        if not self.pre_dispatch:
            return None
        return PolicyFunctionalMode(self.policy, pre_dispatch=False, copy_target=CopyTarget(), under=self)

    def note_identity(self, source: Any, value: Any) -> None:
        """``value`` keeps ``source``'s autograd identity (re-traced region HOPs call this)."""
        self.identity.note(source, value)

    def _rerouted(self, func: Any, args: tuple, kwargs: dict) -> Callable[..., Any] | None:
        """The policy's reroute; and an in-place random fill of a tensor that may require
        grad keeps its autograd identity (``zero_().add_(fresh fill)``), an in-place
        comparison with an operand that may require grad links it (zero gradient)."""
        if func in RANDOM_FILLS and self.grad_reach.may_need_grad(args[0]):
            return lambda *a, **k: fill_randomly_keeping_grad(func, a, k)
        if func is _RESIZE_AS_ and isinstance(args[1], torch.Tensor) and self.grad_reach.may_need_grad(args[1]):
            # only the template's shape is read; torch's functional resize_as makes its result
            # require grad when the template does (eager's resize_as_ does not)
            return lambda self_, template, *a, **k: func(self_, template.detach(), *a, **k)
        if (func in COMPARISONS_IN_PLACE and torch.is_grad_enabled() and self.grad_reach.may_need_grad(args[1])
                and may_carry_grad(args[0])
                and torch.can_cast(args[1].dtype, args[0].dtype)):
            return lambda *a, **k: compare_in_place_keeping_grad(func, a, k)
        return self.policy.rerouted(func, args, kwargs)

    def _base_may_need_grad(self, t: Any) -> bool:
        base = self.bases.base_of(t)
        return base is None or self.grad_reach.may_need_grad(base)

    def _can_decompose(self, func, args, kwargs) -> bool:  # torch's hook: keep or decompose
        if not self.pre_dispatch:
            return tc.torch_would_decompose(func, pre_dispatch=False)
        return self.policy.should_decompose(func, args, kwargs)

    def _grow(self, func: Any, types: Any, t: Any, size: list[int]) -> Any:
        """``t.resize_(size)`` past the end of its memory, which torch's functionalization refuses
        under FunctionalTensorMode (any tensor: the mode's wrapper shares the storage it checks is
        unshared). Eager keeps the old elements first, in memory order, and leaves the rest
        uninitialized: here ``t`` becomes an alias of its elements followed by zeros, as ``set_``
        makes one (an input's new layout is then a relaid input: ``ep.module()`` grows the caller's)."""
        with self:
            flat = t.reshape(-1)
            grown = torch.cat([flat, flat.new_zeros(math.prod(size) - flat.numel())]).view(size)
        with tc.disable_proxy_modes_tracing():
            super().__torch_dispatch__(_SET_SOURCE_TENSOR, types, (t, grown), {})
            tc.mirror_storage_swap(t, grown)
        return t

    def _functionalized(self, func: Any, types: Any, args: tuple, kwargs: dict) -> Any:
        """FunctionalTensorMode's dispatch; an aten op it would only hand to C++
        functionalization takes torch_compat's shorter equal of that path."""
        if func is _RESIZE_ and _grows_storage(args[0], args[1]):
            return self._grow(func, types, args[0], list(args[1]))
        if func is _SET_SOURCE_TENSOR:
            # on an intermediate (refusals.storage_swaps): functionalization makes it an alias of the
            # source (one functional storage); the set_ it runs on the values behind is no node of ours
            with tc.disable_proxy_modes_tracing():
                out = super().__torch_dispatch__(func, types, args, kwargs)
                tc.mirror_storage_swap(args[0], args[1])
                return out
        straight = self._straight.get(func)
        if straight is None:
            straight = self._straight[func] = tc.goes_straight_to_functionalization(func)
        if not straight or not tc.only_functionalized_tensor_types(types):
            if not tc.FUNCTIONAL_MODE_ASKS_CAN_DECOMPOSE and func not in tc.FunctionalTensor.metadata_fns:
                # torch before 2.12 decides in a closure, which would not ask our policy
                if self._can_decompose(func, args, kwargs) and tc.has_kernel(func):
                    with self:
                        out = func.decompose(*args, **kwargs)
                    if out is not NotImplemented:
                        return out
                elif isinstance(func, tc.OpOverload) and func.namespace == "aten" \
                        and tc.has_composite_implicit_kernel(func) and tc.only_functionalized_tensor_types(types) \
                        and tc.torch_would_decompose(func, pre_dispatch=True):
                    # a composite our policy keeps and torch's closure would decompose (batch_norm in eval)
                    return tc.functionalize_kept_op(self, func, args, kwargs)
            return super().__torch_dispatch__(func, types, args, kwargs)
        if self._can_decompose(func, args, kwargs) and tc.has_kernel(func):
            with self:
                out = func.decompose(*args, **kwargs)
            if out is not NotImplemented:
                return out
        twin = functional_twin(func, Match.IN_ORDER) if tc.is_unary_inplace_with_python_meta(func) else None
        if twin is not None:
            return tc.functionalize_inplace_through_twin(self, func, twin, args, kwargs)
        return tc.functionalize_kept_op(self, func, args, kwargs)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.pre_dispatch:  # a subclass built in forward is recorded in a pre-dispatch program only
            types, args, kwargs = self.subclasses.traced_arguments(types, args, kwargs)
        call = OpCall(func, args, kwargs, written_tensors(func, args, kwargs) if self._observers else [])
        try:
            if self.saved_reads is not None:  # on the PreDispatch key: views keep eager's grad mode
                self.view_modes.rebuild_read(call)
            for refuse in self._refusals:
                refuse(call, self.bases.input_ids)
            instead = self._reroute(func, args, call.kwargs)
            if self.pre_dispatch and self.autocast_composites.may_cast(func, args, call.kwargs) \
                    and (instead is not None or self._can_decompose(func, args, call.kwargs)):
                instead = self.autocast_composites.instead(func, args, call.kwargs, instead) or instead
            if instead is not None:
                with self:
                    out = instead(*args, **call.kwargs)
                if out is not NotImplemented:  # a lowering that declines these arguments: the op itself
                    return out
            for observer in self._observers:
                observer.before(call)
            with tc.grad_mode_untraced(False) if call.without_autograd else contextlib.nullcontext():
                seen, self.dispatched = self.dispatched, self.dispatched + 1
                with users_own_call() if func is _AS_STRIDED_SCATTER else contextlib.nullcontext():
                    out = self._functionalized(func, types, args, call.kwargs)
                call.decomposed = self.dispatched != seen + 1  # its ops came through this method
                for observer in self._observers:
                    observer.after(call, out)
            return out
        except BaseException:
            self.failed_op = self.failed_op or func
            raise


Body = Callable[[list[Any], PolicyFunctionalMode], list[Any]]


def trace_functional(body: Body, flat_inputs: Sequence[Any], *, policy: CompositePolicy,
                     pre_dispatch: bool, trace_body: TraceBody, decompositions: dict | None = None,
                     fake_mode: Any = None) -> Trace:
    """Trace ``body`` over functional wrappers of ``flat_inputs`` into a flat graph.

    ``body`` receives the wrapped inputs and the mode, runs the user's code and
    returns the flat list of graph outputs (functional tensors or constants).
    Inputs must already be fake tensors (or non-tensor constants) of ``fake_mode``
    (default: theirs); tensors the body creates are fake in it too, also when there
    are no tensor inputs at all (a model without inputs or state). ``trace_body``
    traces the bodies of custom Functions and hooks met on the way (the driver's
    pipeline, ``pipeline.TraceSettings.trace_body``). The managers around the trace
    are environment.py's layers.
    """
    ambient = AmbientModes.of_caller()
    if not pre_dispatch:  # after autograd there are no grad regions: values do not depend on it
        ambient = dataclasses.replace(ambient, grad_enabled=True, inference=False)
    traced = _TracedFunction(body, policy, pre_dispatch=pre_dispatch, ambient=ambient, trace_body=trace_body)
    fake_mode = fake_mode or tc.fake_mode_of([t for t in flat_inputs if isinstance(t, torch.Tensor)])
    tracer = tc.make_fx(traced, decomposition_table={**copy_decompositions(traced.copy_target),
                                                     **scatter_decompositions(),
                                                     **(decompositions or {})},
                        tracing_mode="real",
                        pre_dispatch=pre_dispatch, record_stack_traces=True)
    try:
        with environment.around_the_tracer(ambient, fake_mode):
            gm = tracer(*flat_inputs)
        return traced.findings(gm)
    except ExportError:
        raise
    except Exception as exc:  # enrich with the op and the user's line
        op = traced.mode.failed_op if traced.mode is not None else None
        source = user_source_line(exc.__traceback__)
        refusal = refusals.known_torch_limit(exc, op, source)
        if refusal is not None:
            raise refusal from exc
        if isinstance(exc, tc.GuardOnDataDependentSymNode):
            raise refusals.data_dependent_branch(exc, op, source) from exc
        raise ExportError.wrapping(exc, op=op, source=source) from exc


class _TracedFunction:
    """The function ``make_fx`` traces: the inputs wrapped, ``body`` run inside the trace's
    environment, the checks that follow it. It keeps the mode it made and the grad mode the
    body left, each set once, for :meth:`findings`."""

    __slots__ = ("_body", "_policy", "_pre_dispatch", "_ambient", "_trace_body", "_autocast_cache",
                 "copy_target", "mode", "grad_enabled_on_return")

    def __init__(self, body: Body, policy: CompositePolicy, *, pre_dispatch: bool, ambient: AmbientModes,
                 trace_body: TraceBody):
        self._body, self._policy, self._pre_dispatch = body, policy, pre_dispatch
        self._ambient, self._trace_body = ambient, trace_body
        self._autocast_cache = torch.is_autocast_cache_enabled()  # the caller's, as eager would use
        self.copy_target = CopyTarget()
        self.mode: PolicyFunctionalMode | None = None
        self.grad_enabled_on_return: bool | None = None

    def __call__(self, *flat: Any) -> tuple[Any, ...]:
        assert self.mode is None, "one trace per traced function"
        mode = self.mode = PolicyFunctionalMode(self._policy, pre_dispatch=self._pre_dispatch,
                                                copy_target=self.copy_target)
        with mode:
            wrapped = [tc.to_functional(t) if isinstance(t, torch.Tensor) else t for t in flat]
        mode.add_graph_inputs(wrapped)
        with environment.inside_the_traced_function(mode, autocast_cache=self._autocast_cache,
                                                    trace_body=self._trace_body, pre_dispatch=self._pre_dispatch):
            with environment.around_the_body(self._ambient, mode.storage_aliases, mode.hidden_writes,
                                             on_reseed=mode.draws_after_reseed.note):
                outs = self._body(wrapped, mode)
                if mode.pre_dispatch:
                    outs = mode.subclasses.traced_outputs(outs)
                mode.metadata_writes.refuse_symbolic()
                mode.draws_after_reseed.refuse_left_changed()
                mode.view_modes.rebuild_stale(tc.pytree.tree_leaves(outs))
            refusals.leaked_autocast()
            self.grad_enabled_on_return = torch.is_grad_enabled()
        return tuple(tc.inner_of_functional(o) for o in outs)

    def findings(self, gm: torch.fx.GraphModule) -> Trace:
        """What the trace learned, once ``make_fx`` has returned ``gm``."""
        mode, grad_enabled_on_return = self.mode, self.grad_enabled_on_return
        assert mode is not None and grad_enabled_on_return is not None, "the function has not been traced"
        hidden = mode.hidden_writes
        return Trace(gm, mode.identity.edges, grad_enabled_on_return,
                     hidden.hidden_only_inputs() if hidden is not None else frozenset(), self._ambient,
                     tuple(mode.identity.grad_free_writes))
