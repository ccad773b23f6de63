"""``torch.autograd.grad`` and ``backward()`` called inside ``forward``: refused on the pre-dispatch trace.

The pre-dispatch trace runs ``forward`` before autograd: the program's backward is
made later, from the graph. So while ``forward`` is traced no autograd graph links
its values, and a backward pass asked for there has nothing to run on: torch raises
("appears to not have been used in the graph"), or, with ``allow_unused=True``,
hands back None or zeros, which would make the program silently different from eager.
``torch.func.grad`` / ``vjp`` are the traceable spelling (``func_transforms.py`` runs
them below autograd, where the trace has a backward to record), and a trace after
autograd (``pre_dispatch=False``) records ``torch.autograd.grad`` as it runs.
torch.export fails on it too (torch 2.13 to 2.15: a fake tensor left in the program's
constants), so this is not a limit torch alone removes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ... import _torch_compat as tc
from ...errors import Refusal, UnsupportedError, user_source_line
from ...mode_capabilities import TracesBelowAutograd


def _refused_before_autograd(what: str) -> None:
    mode = tc.active_functional_mode()
    # not our trace, or one after autograd (pre_dispatch=False, a torch.func level): the backward runs there
    if not isinstance(mode, TracesBelowAutograd) or mode.twin_below_autograd() is None:
        return
    after_autograd = (", or export with pre_dispatch=False, where torch.autograd.grad is traced (without "
                      "grad-mode and autocast regions)" if what == "torch.autograd.grad" else "")
    raise UnsupportedError(
        f"{what} is called inside forward: the pre-dispatch trace runs forward before autograd, so there is "
        "no autograd graph to differentiate yet (torch.export fails on it too). Use torch.func.grad or "
        f"torch.func.vjp inside forward, which export traces{after_autograd}",
        kind=Refusal.AUTOGRAD_CALL_IN_FORWARD, op=what, source=user_source_line())


@contextlib.contextmanager
def autograd_calls_refused() -> Iterator[None]:
    """While the trace runs, a backward pass asked for by the model is refused (module docstring);
    the ones ``torch.func`` transforms run, below autograd, go through."""
    with tc.autograd_engine_runs_routed(_refused_before_autograd):
        yield
