"""torch's higher-order ops (``cond``, ``while_loop``, ``map``, ``scan``, ...) through our mode.

A HOP finds its rule for a dispatch mode by the mode's exact type, so our
subclass of ``FunctionalTensorMode`` finds none ("Current active mode ... not
registered"). :func:`let_torch_hops_through` gives it torch's own
functionalization rule of every HOP: unwrap the operands, functionalize the
bodies (with our mode, so our composite policy applies inside them too),
redispatch, wrap the results. The bodies come out as subgraphs whose
grad/autocast markers ``regions.py`` outlines like the top graph's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from ... import _torch_compat as tc
from ...autograd_facts import Fact, has
from ...errors import Refusal, UnsupportedError, user_source_line
from ...mode_capabilities import observer_of_opaque_calls

TORCH_EXPORT_FAILS_TOO = "torch.export.export fails on it too, strict and non-strict"
# HOPs whose programs torch cannot represent, with why: refused when met
_REFUSED: dict[str, Callable[[tuple, dict], str | None]] = {
    "local_map_hop": lambda args, kwargs: (
        "local_map's traced call records a Python closure as the op, which no ExportedProgram "
        f"accepts ({TORCH_EXPORT_FAILS_TOO})"),
    "invoke_quant_packed": lambda args, kwargs: (
        "invoke_quant's options object (InvokeQuant) becomes a graph node without a value, which "
        f"an ExportedProgram rejects ({TORCH_EXPORT_FAILS_TOO}); call invoke_quant_packed without "
        "quant_options") if kwargs.get("quant_options") is not None else None,
}




def _joint_graph_as_eager_derives(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """``flex_attention_backward`` called without a joint graph: eager's kernel derives it
    from the score_mod; torch's tracing rule calls it unchecked (non-strict torch.export
    fails there, dynamo derives it like eager). Derive it before tracing."""
    if len(args) == 14 and args[8] is None:
        joint = tc.flex_attention_joint_graph(args[7], args[0], tuple(args[12]))
        args = (*args[:8], joint, *args[9:])
    return args, kwargs


# HOPs whose arguments are completed as eager completes them before torch's rule runs
_PREPARED: dict[str, Callable[[tuple, dict], tuple[tuple, dict]]] = {
    "flex_attention_backward": _joint_graph_as_eager_derives,
}


def _real_parameters_as_constants(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """A real ``nn.Parameter`` among the operands (a module the model closes over, not its
    own state) as a plain tensor: torch's functionalization rule of a HOP declines every
    tensor subclass but fake and functional ones (a TypeError "no implementation found"),
    where torch.export takes such a tensor as a constant of the program. The alias is made
    outside the trace; the program holds it as a constant, as torch.export's does."""
    def plain(t: Any) -> Any:
        if not isinstance(t, torch.nn.Parameter) or isinstance(t, (tc.FakeTensor, tc.FunctionalTensor)):
            return t
        with tc.outside_all_modes(), tc.torch_function_modes_off():
            return t.detach()
    return tc.pytree.tree_map(plain, (args, kwargs))


def let_torch_hops_through(mode_type: type) -> None:
    """Register torch's FunctionalTensorMode rule of every HOP for ``mode_type`` too."""
    if mode_type is tc.FunctionalTensorMode:
        return
    for hop in tc.all_higher_order_ops():
        rule = hop.python_key_table.get(tc.FunctionalTensorMode)
        if rule is not None and mode_type not in hop.python_key_table:
            refusal, prepare = _REFUSED.get(hop.name()), _PREPARED.get(hop.name())
            if prepare is not None:
                rule = _preparing(rule, prepare)
            rule = _preparing(rule, _real_parameters_as_constants)
            rule = _observed(hop, rule)
            hop.python_key_table[mode_type] = rule if refusal is None else _refusing(hop.name(), rule, refusal)


def _observed(hop: Any, rule: Callable[..., Any]):
    """Show the mode the HOP as it sees an op (``observe_opaque_call``): its reads to the
    ``.data`` watch, its results to the observers (bases, grad reach, ``requires_grad``)."""
    name, unchecked = hop.name(), has(hop, Fact.BACKWARD_READS_UNCHECKED)

    def observed(mode: Any, *args: Any, **kwargs: Any) -> Any:
        observer = observer_of_opaque_calls(mode)
        with observer.opaque_body() if observer is not None else contextlib.nullcontext():
            out = rule(mode, *args, **kwargs)
        if observer is not None:
            observer.before_opaque_call(tc.pytree.tree_leaves((args, kwargs)))
        out = rule(mode, *args, **kwargs)
        if observer is not None:
            observer.observe_opaque_call(f"higher_order.{name}", tc.pytree.tree_leaves((args, kwargs)), tc.pytree.tree_leaves(out),
                    keeps_inputs=False, backward_unchecked=unchecked)
        return out
    return observed


def _preparing(rule: Callable[..., Any], prepare: Callable[[tuple, dict], tuple[tuple, dict]]):
    def prepared(mode: Any, *args: Any, **kwargs: Any) -> Any:
        args, kwargs = prepare(args, kwargs)
        return rule(mode, *args, **kwargs)
    return prepared


def _refusing(name: str, rule: Callable[..., Any], why: Callable[[tuple, dict], str | None]):
    def checked(mode: Any, *args: Any, **kwargs: Any) -> Any:
        reason = why(args, kwargs)
        if reason is not None:
            raise UnsupportedError(reason, kind=Refusal.HOP_NOT_REPRESENTABLE, op=f"higher_order.{name}",
                                   source=user_source_line())
        return rule(mode, *args, **kwargs)
    return checked
