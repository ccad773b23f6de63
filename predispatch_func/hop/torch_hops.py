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

from collections.abc import Callable
from typing import Any

from .. import _torch_compat as tc
from ..errors import Refusal, UnsupportedError, user_source_line

TORCH_EXPORT_FAILS_TOO = "torch.export.export fails on it the same way"
# HOPs whose programs torch cannot represent, with why: refused when met
_REFUSED: dict[str, Callable[[tuple, dict], str | None]] = {
    "local_map_hop": lambda args, kwargs: (
        "local_map's traced call records a Python closure as the op, which no ExportedProgram "
        f"accepts ({TORCH_EXPORT_FAILS_TOO})"),
    "flex_attention_backward": lambda args, kwargs: (
        "flex_attention_backward is flex_attention's internal backward; call flex_attention and "
        f"let the program differentiate it ({TORCH_EXPORT_FAILS_TOO})"),
    "invoke_quant_packed": lambda args, kwargs: (
        "invoke_quant's options object (InvokeQuant) becomes a graph node without a value, which "
        f"an ExportedProgram rejects ({TORCH_EXPORT_FAILS_TOO}); call invoke_quant_packed without "
        "quant_options") if kwargs.get("quant_options") is not None else None,
}


def let_torch_hops_through(mode_type: type) -> None:
    """Register torch's FunctionalTensorMode rule of every HOP for ``mode_type`` too."""
    if mode_type is tc.FunctionalTensorMode:
        return
    for hop in tc.all_higher_order_ops():
        rule = hop.python_key_table.get(tc.FunctionalTensorMode)
        if rule is not None and mode_type not in hop.python_key_table:
            refusal = _REFUSED.get(hop.name())
            hop.python_key_table[mode_type] = rule if refusal is None else _refusing(hop.name(), rule, refusal)


def _refusing(name: str, rule: Callable[..., Any], why: Callable[[tuple, dict], str | None]):
    def checked(mode: Any, *args: Any, **kwargs: Any) -> Any:
        reason = why(args, kwargs)
        if reason is not None:
            raise UnsupportedError(reason, kind=Refusal.HOP_NOT_REPRESENTABLE, op=f"higher_order.{name}",
                                   source=user_source_line())
        return rule(mode, *args, **kwargs)
    return checked
