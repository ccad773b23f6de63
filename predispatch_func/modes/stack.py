"""The tracing mode stack, entered through one function: :func:`trace_functional`.

On the PreDispatch key (above autograd) sit, top first:

* :class:`PolicyFunctionalMode`: torch's FunctionalTensorMode, with the
  keep-or-decompose decision for composites handed to a
  :class:`~predispatch_func.modes.composite_policy.CompositePolicy`, and errors
  enriched with the op being dispatched;
* torch's ProxyTorchDispatchMode (pushed by ``make_fx(pre_dispatch=True)``),
  which records each functional op, plus grad-mode and autocast toggles as
  marker nodes that the region pass later outlines.

With ``pre_dispatch=False`` the same modes sit on the Python key, below
autograd, and record plain post-autograd ATen.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .. import _torch_compat as tc
from ..errors import ExportError, UnsupportedError, user_source_line
from ..hop.extensions import traced_extensions
from ..hop.ops import note_identity_hook
from .ambient import AmbientModes
from .composite_policy import HONEST_TWINS, CompositePolicy
from .differentiable_copy import CopyTarget, copy_decompositions
from .fast_paths import eager_fast_paths
from .tensor_data import TensorDataMode
from .out_variants import (
    RANDOM_FILLS,
    call_composite_out,
    call_inplace_through_twin,
    fill_randomly_keeping_grad,
    inplace_twin,
    is_composite_out,
)
from .view_grad_modes import ViewGradModes

# ops whose results never require grad, whatever their inputs (a *_like factory reads only
# its input's metadata)
_NEVER_DIFFERENTIABLE = frozenset({
    torch.ops.aten.detach.default, torch.ops.aten.zeros_like.default, torch.ops.aten.ones_like.default,
    torch.ops.aten.empty_like.default, torch.ops.aten.full_like.default, torch.ops.aten.rand_like.default,
    torch.ops.aten.randn_like.default, torch.ops.aten.randint_like.default,
})


class PolicyFunctionalMode(tc.FunctionalTensorMode):
    """FunctionalTensorMode that asks our policy which composites to keep."""

    def __init__(self, policy: CompositePolicy, *, pre_dispatch: bool, copy_target: CopyTarget):
        super().__init__(pre_dispatch=pre_dispatch, export=True)
        self.policy = policy
        self.copy_target = copy_target
        self.graph_input_ids: set[int] = set()
        # id -> (graph input, its layout before, the first in-place view op on it, source line)
        self.metadata_writes: dict[int, tuple[Any, tuple, Any, str | None]] = {}
        self.op_stack: list[Any] = []
        self.failed_op: Any = None
        # new-value node -> old-value node, for writes done while grad is off
        self.identity_edges: dict[torch.fx.Node, torch.fx.Node] = {}
        self._bases: dict[Any, tc.FunctionalTensor] = {}
        self.view_modes = ViewGradModes(self._base_may_need_grad)
        # detach()-ed aliases and their views, by id (held, so ids stay unique while tracing)
        self._detached: dict[int, Any] = {}
        # tensors that may require grad when the program runs: computed under grad mode
        # from a floating graph input (autograd does not run while tracing, so we track it)
        self._may_require_grad: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()

    def mark_grad_sources(self, inputs: Sequence[Any]) -> None:
        for t in inputs:
            if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex()):
                self._may_require_grad[id(t)] = t

    def _may_need_grad(self, t: Any) -> bool:
        return self._may_require_grad.get(id(t)) is t

    def _track_grad_flow(self, func, args, kwargs, out, written) -> None:
        if not torch.is_grad_enabled() or func in _NEVER_DIFFERENTIABLE:
            return
        if any(self._may_need_grad(t) for t in tc.pytree.tree_leaves((args, kwargs))):
            for t in [*tc.pytree.tree_leaves(out), *written]:
                if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex()):
                    self._may_require_grad[id(t)] = t

    def _unwritten_input(self, written: list[Any]) -> bool:
        """``written`` is one graph input (or a view of one) that nothing wrote before."""
        if len(written) != 1 or tc.storage_mutation_count(written[0]) != 0:
            return False
        base = self._bases.get(tc.storage_key(written[0]))
        return base is not None and id(base) in self.graph_input_ids

    def _base_may_need_grad(self, t: Any) -> bool:
        base = self._bases.get(tc.storage_key(t))
        return base is None or self._may_need_grad(base)

    def track_base(self, t: Any) -> None:
        if isinstance(t, tc.FunctionalTensor) and tc.is_functional_base(t):
            self._bases.setdefault(tc.storage_key(t), t)

    def note_identity(self, source: Any, value: Any) -> None:
        """``value`` keeps ``source``'s autograd identity (re-traced region HOPs call this)."""
        new = tc.proxy_node_of(tc.inner_of_functional(value))
        old = tc.proxy_node_of(tc.inner_of_functional(source))
        if new is not None and old is not None and new is not old:
            self.identity_edges[new] = old

    def _written_args(self, func, args, kwargs) -> list[Any]:
        """The tensors ``func`` writes, positional or keyword (``out=`` is keyword-only)."""
        schema = getattr(func, "_schema", None)
        if schema is None or not schema.is_mutable or not self.pre_dispatch:
            return []
        values = [*zip(schema.arguments, args),
                  *((arg, kwargs[arg.name]) for arg in schema.arguments if arg.kwarg_only and arg.name in kwargs)]
        return [value for arg, value in values
                if arg.alias_info is not None and arg.alias_info.is_write
                and isinstance(value, tc.FunctionalTensor)]

    def _note_metadata_write(self, func, t: Any) -> None:
        """An in-place view op on a graph input (``t_``, ``unsqueeze_``): refused at the
        end of the trace only if the input's metadata then differs (``t_()`` of a 1-D
        tensor, or ``unsqueeze_(0)`` undone by ``squeeze_(0)``, changes nothing)."""
        if id(t) not in self.metadata_writes:
            self.metadata_writes[id(t)] = (t, _layout(t), func, user_source_line())

    def refuse_changed_input_metadata(self) -> None:
        for t, layout, func, source in self.metadata_writes.values():
            if _layout(t) != layout:
                raise UnsupportedError(
                    "in-place metadata change (shape/stride) of a graph input cannot be expressed "
                    "in a functional program; use the out-of-place op instead", op=func, source=source)

    def _refuse_overlapping_writes(self, func, written: list[Any]) -> None:
        """One tensor passed as two mutable arguments (``batch_norm(x, None, None, s, s,
        True, ...)``): eager applies the kernel's writes one after the other, a
        functional program computes each from the old value. Refused."""
        spans = []
        for t in written:
            start = t.storage_offset()
            extent = sum((n - 1) * st for n, st in zip(t.shape, t.stride()) if n > 0) if t.numel() else -1
            spans.append((tc.storage_key(t), start, start + extent))
        for i, (key, lo, hi) in enumerate(spans):
            for key2, lo2, hi2 in spans[:i]:
                if key == key2 and lo <= hi2 and lo2 <= hi:
                    raise UnsupportedError(
                        "one tensor (or overlapping views of it) is passed as two arguments the op "
                        "writes; eager applies the writes one after the other, which a functional "
                        "program cannot express: pass separate tensors", op=func, source=user_source_line())

    def _bases_of(self, tensors: list[Any]) -> list[Any]:
        bases = []
        for t in tensors:
            base = self._bases.get(tc.storage_key(t))
            if base is not None and all(base is not b for b in bases):
                bases.append(base)
        return bases

    def _track_detached(self, func, args, out) -> None:
        # view(dtype) is a view autograd does not see (not differentiable): like detach()
        if func in (torch.ops.aten.detach.default, torch.ops.aten.view.dtype) or (
                getattr(func, "is_view", False) and args and id(args[0]) in self._detached):
            for t in tc.pytree.tree_leaves(out):
                # an op that *may* alias (``to``) but copied is no detached alias
                if isinstance(t, tc.FunctionalTensor) and (
                        func in (torch.ops.aten.detach.default, torch.ops.aten.view.dtype)
                        or tc.storage_key(t) == tc.storage_key(args[0])):
                    self._detached[id(t)] = t

    def _dispatch_recording_identity(self, func, types, args, kwargs, written):
        """Dispatch; a write done without autograd (grad off, or through a detached
        alias) records that the written base keeps its old autograd identity."""
        through_detach = torch.is_grad_enabled() and any(id(t) in self._detached for t in written)
        if not written or (torch.is_grad_enabled() and not through_detach):
            return super().__torch_dispatch__(func, types, args, kwargs)
        if through_detach:
            self._refuse_grad_value_through_detach(func, args, kwargs, written)
        # the bases written, and the written views themselves: after a write under
        # no_grad, eager's view keeps its own autograd identity too
        bases = self._bases_of(written)
        if not through_detach:  # a detached alias has no autograd identity to keep
            bases += [w for w in written if all(w is not b for b in bases)]
        before = [tc.proxy_node_of(tc.inner_of_functional(b)) for b in bases]
        if through_detach:  # eager: same as writing under no_grad
            tc.record_grad_marker(False)
        with tc.grad_mode_untraced(False):
            out = super().__torch_dispatch__(func, types, args, kwargs)
            after = [tc.proxy_node_of(tc.inner_of_functional(b)) for b in bases]
        if through_detach:
            tc.record_grad_marker(True)
        for old, new in zip(before, after):  # bases first: a base's identity wins
            if old is not None and new is not None and new is not old:
                self.identity_edges.setdefault(new, old)
        return out

    def _refuse_grad_value_through_detach(self, func, args, kwargs, written) -> None:
        """Writing a value that requires grad through a detached alias gives, in eager,
        the alias its own autograd history while the tensor it aliases keeps its old
        one: two histories for one storage, which a no_grad region cannot express."""
        operands = [t for t in tc.pytree.tree_leaves((args, kwargs))
                    if isinstance(t, torch.Tensor) and all(t is not w for w in written)]
        if any(self._may_need_grad(t) for t in operands):
            raise UnsupportedError(
                "a value that may require grad (computed under grad mode from a float input or "
                "parameter) is written through a detach()-ed alias (or .data, or view(dtype), which "
                "autograd does not see either): eager gives the alias its own "
                "autograd history while the tensor it aliases keeps its old one; write to a "
                "clone, or detach the value written", op=func, source=user_source_line())

    def _can_decompose(self, func, args, kwargs) -> bool:
        if not self.pre_dispatch:
            return super()._can_decompose(func, args, kwargs)
        return self.policy.should_decompose(func, args, kwargs)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if torch.is_inference_mode_enabled():
            raise UnsupportedError(
                "torch.inference_mode() inside the model cannot be expressed as a region "
                "(inference tensors cannot re-enter autograd); use torch.no_grad() instead",
                op=func, source=user_source_line())
        if not self.pre_dispatch and not torch.is_grad_enabled():
            raise UnsupportedError(
                "the model disables grad mode; after autograd (pre_dispatch=False) a region "
                "cannot be recorded, so its gradients would silently differ from eager; "
                "export with pre_dispatch=True", op=func, source=user_source_line())
        if torch.Tag.inplace_view in getattr(func, "tags", ()) and args and id(args[0]) in self.graph_input_ids:
            self._note_metadata_write(func, args[0])
        twin = HONEST_TWINS.get(func)
        if twin is not None:
            with self:
                return twin(*args, **kwargs)
        self.op_stack.append(func)
        try:
            written = self._written_args(func, args, kwargs)
            if len(written) > 1:
                self._refuse_overlapping_writes(func, written)
            if self.pre_dispatch:
                self.view_modes.before(func, args, kwargs, written)
            if (self.pre_dispatch and self.policy.needs_eager_kernel(func, args, kwargs)
                    and self._can_decompose(func, args, kwargs)):
                with self:
                    return tc.decompose_like_eager(func, *args, **kwargs)
            if self.pre_dispatch and is_composite_out(func):
                with self:
                    return call_composite_out(func, args, kwargs)
            if func in RANDOM_FILLS and self.pre_dispatch and self._may_need_grad(args[0]):
                with self:
                    return fill_randomly_keeping_grad(func, args, kwargs)
            if (twin_op := inplace_twin(func)) is not None:
                with self:
                    return call_inplace_through_twin(func, twin_op, args, kwargs)
            lowered = self.policy.lowering.functional_decomposition(func) if self.policy.lowering else None
            if lowered is not None:  # outside the target op set: lower it, functionalized
                with self:
                    return lowered(*args, **kwargs)
            self.copy_target.unwritten_input = func is torch.ops.aten.copy_.default and self._unwritten_input(written)
            try:
                out = self._dispatch_recording_identity(func, types, args, kwargs, written)
            finally:
                self.copy_target.unwritten_input = False
            self._track_detached(func, args, out)
            if self.pre_dispatch:
                self.view_modes.after(func, args, out, written)
            self._track_grad_flow(func, args, kwargs, out, written)
            for t in tc.pytree.tree_leaves(out):
                self.track_base(t)
            return out
        except BaseException:
            if self.failed_op is None:
                self.failed_op = func
            raise
        finally:
            self.op_stack.pop()


def _layout(t: Any) -> tuple:
    return tuple(t.shape), tuple(t.stride()), t.storage_offset()


Body = Callable[[list[Any], PolicyFunctionalMode], list[Any]]


@dataclasses.dataclass
class Trace:
    """The flat functional graph with its region markers, and what tracing learned."""

    graph_module: torch.fx.GraphModule
    identity_edges: dict[torch.fx.Node, torch.fx.Node]  # new value -> value it keeps identity of
    grad_enabled_on_return: bool  # False: forward called set_grad_enabled(False) and never restored


def trace_functional(body: Body, flat_inputs: Sequence[Any], *, policy: CompositePolicy,
                     pre_dispatch: bool, decompositions: dict | None = None
                     ) -> Trace:
    """Trace ``body`` over functional wrappers of ``flat_inputs`` into a flat graph.

    ``body`` receives the wrapped inputs and the mode, runs the user's code and
    returns the flat list of graph outputs (functional tensors or constants).
    Inputs must already be fake tensors (or non-tensor constants).
    """
    state: dict[str, Any] = {}

    copy_target = CopyTarget()
    autocast_cache = torch.is_autocast_cache_enabled()  # the caller's, as eager would use
    ambient = AmbientModes.of_caller()
    if not pre_dispatch:  # after autograd there are no grad regions: values do not depend on it
        ambient = dataclasses.replace(ambient, grad_enabled=True, inference=False)

    def traced(*flat):
        mode = PolicyFunctionalMode(policy, pre_dispatch=pre_dispatch, copy_target=copy_target)
        state["mode"] = mode
        with mode:
            wrapped = [tc.to_functional(t) if isinstance(t, torch.Tensor) else t for t in flat]
        mode.graph_input_ids = {id(t) for t in wrapped if isinstance(t, torch.Tensor)}
        mode.mark_grad_sources(wrapped)
        for t in wrapped:
            mode.track_base(t)
        with mode, note_identity_hook(mode.note_identity), torch.enable_grad(), \
                tc.autocast_cache_as(autocast_cache), traced_extensions(
                    policy, decompositions, pre_dispatch=pre_dispatch):
            with ambient.entered(), eager_fast_paths(), TensorDataMode():  # caller's modes: outer regions
                outs = body(wrapped, mode)
                mode.refuse_changed_input_metadata()
                mode.view_modes.rebuild_stale(outs)
            _refuse_leaked_autocast()
            state["grad_enabled_on_return"] = torch.is_grad_enabled()
        return tuple(tc.inner_of_functional(o) for o in outs)

    fake_mode = tc.fake_mode_of([t for t in flat_inputs if isinstance(t, torch.Tensor)])
    tracer = tc.make_fx(traced, decomposition_table={**copy_decompositions(copy_target), **(decompositions or {})},
                        tracing_mode="real",
                        pre_dispatch=pre_dispatch, record_stack_traces=True)
    try:
        with ambient.neutral(), tc.exporting_state(), (fake_mode if fake_mode is not None else _null()):
            gm = tracer(*flat_inputs)
        return Trace(gm, state["mode"].identity_edges, state["grad_enabled_on_return"])
    except ExportError:
        raise
    except Exception as exc:  # enrich with the op and the user's line
        mode = state.get("mode")
        op = getattr(mode, "failed_op", None)
        source = user_source_line(exc.__traceback__)
        refusal = _known_torch_limit(exc)
        if refusal is not None:
            raise UnsupportedError(refusal, op=op, source=source) from exc
        raise ExportError(f"tracing failed: {type(exc).__name__}: {exc}", op=op, source=source) from exc


# torch 2.13 failures a model can run into while traced, each with what to write instead:
# (exception type, text in its message, our explanation; {exc} is torch's message)
_KNOWN_TORCH_LIMITS = (
    (RuntimeError, "Attempted to set the storage of a tensor on device",
     "torch's functionalization cannot rebuild a view(dtype) of a tensor written before the "
     "view was made, under no_grad ({exc}); take the view before the write, or outside no_grad"),
    (ValueError, "Cannot view a tensor",
     "torch's functionalization cannot replay a .view() of a tensor written through a "
     "non-contiguous alias ({exc}); use .reshape() for that view, or write through a "
     "contiguous alias"),
    (RuntimeError, "where view 1 was an as_strided() call",
     "torch's functionalization cannot write through an as_strided() view taken of another "
     "view (as_strided is not compositional, pytorch/pytorch#104505); take the as_strided() "
     "view of the base tensor itself, or write through ordinary views"),
    (RuntimeError, "Autograd not support dtype",
     "a value that requires grad is written into an integer tensor: torch's functional form "
     "of this op cannot run under autograd ({exc}), and eager's in-place op attaches autograd "
     "history to the integer tensor or not depending on how it is called; an integer tensor "
     "carries no gradient, so detach the value written (x[i] = v.detach())"),
)


def _known_torch_limit(exc: BaseException) -> str | None:
    """Our explanation of ``exc`` if it is one of :data:`_KNOWN_TORCH_LIMITS`."""
    for kind, text, explanation in _KNOWN_TORCH_LIMITS:
        if isinstance(exc, kind) and text in str(exc):
            return explanation.format(exc=exc)
    return None


def _refuse_leaked_autocast() -> None:
    """Autocast left enabled when forward returns has no functional form (grad mode
    left off does: the program's module() sets it, see export.FunctionalExportedProgram)."""
    if not tc.autocast_enabled_anywhere():
        return
    raise UnsupportedError(
        "the model leaves autocast enabled when forward returns; a functional program "
        "cannot change the caller's autocast state", op=tc.ENTER_AUTOCAST.__name__,
        source=tc.last_recorded_call_source(tc.ENTER_AUTOCAST))


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False
