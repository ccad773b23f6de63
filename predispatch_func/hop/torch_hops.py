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

from .. import _torch_compat as tc


def let_torch_hops_through(mode_type: type) -> None:
    """Register torch's FunctionalTensorMode rule of every HOP for ``mode_type`` too."""
    if mode_type is tc.FunctionalTensorMode:
        return
    for hop in tc.all_higher_order_ops():
        rule = hop.python_key_table.get(tc.FunctionalTensorMode)
        if rule is not None and mode_type not in hop.python_key_table:
            hop.python_key_table[mode_type] = rule
