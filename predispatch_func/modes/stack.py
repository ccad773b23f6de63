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

from typing import Any, Callable, Sequence

import torch

from .. import _torch_compat as tc
from ..errors import ExportError, UnsupportedError, user_source_line
from .composite_policy import HONEST_TWINS, CompositePolicy


class PolicyFunctionalMode(tc.FunctionalTensorMode):
    """FunctionalTensorMode that asks our policy which composites to keep."""

    def __init__(self, policy: CompositePolicy, *, pre_dispatch: bool,
                 graph_inputs: Sequence[Any] = ()):
        super().__init__(pre_dispatch=pre_dispatch, export=True)
        self.policy = policy
        self.graph_input_ids: set[int] = set()
        self.op_stack: list[Any] = []
        self.failed_op: Any = None

    def _can_decompose(self, func, args, kwargs) -> bool:  # noqa: D401 (torch hook)
        if not self.pre_dispatch:
            return super()._can_decompose(func, args, kwargs)
        return self.policy.should_decompose(func, args, kwargs)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if torch.Tag.inplace_view in getattr(func, "tags", ()) and args and id(args[0]) in self.graph_input_ids:
            raise UnsupportedError(
                "in-place metadata change (shape/stride) of a graph input cannot be expressed "
                "in a functional program; use the out-of-place op instead",
                op=func, source=user_source_line())
        twin = HONEST_TWINS.get(func)
        if twin is not None:
            with self:
                return twin(*args, **kwargs)
        self.op_stack.append(func)
        try:
            if (self.pre_dispatch and self.policy.needs_eager_kernel(func, args, kwargs)
                    and self._can_decompose(func, args, kwargs)):
                with self:
                    return tc.decompose_like_eager(func, *args, **kwargs)
            return super().__torch_dispatch__(func, types, args, kwargs)
        except BaseException:
            if self.failed_op is None:
                self.failed_op = func
            raise
        finally:
            self.op_stack.pop()


Body = Callable[[list[Any], PolicyFunctionalMode], list[Any]]


def trace_functional(body: Body, flat_inputs: Sequence[Any], *, policy: CompositePolicy,
                     pre_dispatch: bool, decompositions: dict | None = None) -> torch.fx.GraphModule:
    """Trace ``body`` over functional wrappers of ``flat_inputs`` into a flat graph.

    ``body`` receives the wrapped inputs and the mode, runs the user's code and
    returns the flat list of graph outputs (functional tensors or constants).
    Inputs must already be fake tensors (or non-tensor constants).
    """
    state: dict[str, Any] = {}

    def traced(*flat):
        mode = PolicyFunctionalMode(policy, pre_dispatch=pre_dispatch)
        state["mode"] = mode
        with mode:
            wrapped = [tc.to_functional(t) if isinstance(t, torch.Tensor) else t for t in flat]
        mode.graph_input_ids = {id(t) for t in wrapped if isinstance(t, torch.Tensor)}
        with mode:
            outs = body(wrapped, mode)
        return tuple(tc.inner_of_functional(o) for o in outs)

    fake_mode = tc.fake_mode_of([t for t in flat_inputs if isinstance(t, torch.Tensor)])
    tracer = tc.make_fx(traced, decomposition_table=decompositions, tracing_mode="real",
                        pre_dispatch=pre_dispatch, record_stack_traces=True)
    try:
        with tc.exporting_state(), (fake_mode if fake_mode is not None else _null()):
            return tracer(*flat_inputs)
    except ExportError:
        raise
    except Exception as exc:  # enrich with the op and the user's line
        mode = state.get("mode")
        op = getattr(mode, "failed_op", None)
        raise ExportError(f"tracing failed: {type(exc).__name__}: {exc}", op=op,
                          source=user_source_line(exc.__traceback__)) from exc


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False
