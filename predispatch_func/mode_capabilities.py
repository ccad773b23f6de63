"""What the tracing mode and the driver offer the code that runs inside a trace, as Protocols.

``trace/extensions/`` (the Function and hook tracers, torch's HOP rules) and the
model call (``program/mutations.py``) run under the mode of ``trace/stack.py`` but
must not import it (the extensions are entered by the trace, and ``program/`` sits
after it), and a HOP rule may meet torch's own FunctionalTensorMode instead of ours. They name what they need here;
``trace.stack.PolicyFunctionalMode`` and ``pipeline.TraceSettings`` provide it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable

import torch


class TraceBody(Protocol):
    """How a body is traced into a functional subgraph: the driver's pipeline
    (``pipeline.TraceSettings.trace_body``), handed down through the trace."""

    def __call__(self, body: Callable[[list[Any], Any], list[Any]], inputs: list[Any], *,
                 grad_enabled: bool) -> torch.fx.GraphModule: ...


@runtime_checkable
class ObservesOpaqueCalls(Protocol):
    """A mode that wants to see a call it does not dispatch as one op (a torch HOP, a custom
    Function) as an op: its reads and its results (``PolicyFunctionalMode``)."""

    def before_opaque_call(self, operands: list[Any]) -> None: ...

    def observe_opaque_call(self, what: str, operands: list[Any], results: list[Any], *, keeps_inputs: bool,
                            non_differentiable: Sequence[int] = (), backward_unchecked: bool = False,
                            saved_results: Sequence[int] = ()) -> None: ...

    def opaque_body(self) -> AbstractContextManager[None]:
        """Around torch's functionalization of a HOP's bodies, which run under this mode on
        operands the mode did not see made."""
        ...


@runtime_checkable
class TracesBelowAutograd(Protocol):
    """A PreDispatch mode that can hand the trace a twin for the Python key, below autograd,
    where what the PreDispatch key cannot trace runs (``torch.func`` transforms:
    ``trace/extensions/func_transforms.py``); None from a mode already below autograd."""

    def twin_below_autograd(self) -> Any | None: ...


@runtime_checkable
class CarriedIntoBodies(Protocol):
    """A torch-function mode of the trace in progress that a body traced inside it keeps
    (``trace/environment.py`` hides the others): the node metadata mode of ``passes/node_meta.py``,
    which names the body's calls in the caller's count and gives them the user's lines."""

    def carried_into_bodies(self) -> bool: ...


class LayoutChanges(Protocol):
    def changed(self) -> dict[int, tuple[tuple, tuple]]:
        """id of each input whose layout changed -> (layout before, layout after)."""
        ...


class SharedMemory(Protocol):
    def sharing(self, t: Any) -> set[Any]:
        """The storages sharing memory with traced tensor ``t``'s in eager."""


class TracingMode(Protocol):
    """What a traced body is handed besides its inputs: the mode's record of in-place
    layout changes of the inputs (``x.t_()``), which the model call carries as mutations,
    and of the storages ``.data =`` made one (which outputs eager returns as inputs' memory)."""

    @property
    def metadata_writes(self) -> LayoutChanges: ...

    @property
    def storage_aliases(self) -> SharedMemory: ...


def observer_of_opaque_calls(mode: Any) -> ObservesOpaqueCalls | None:
    """``mode`` if it observes opaque calls, else None (torch's own mode)."""
    return mode if isinstance(mode, ObservesOpaqueCalls) else None


__all__ = ["LayoutChanges", "ObservesOpaqueCalls", "SharedMemory", "TraceBody", "TracesBelowAutograd", "TracingMode",
           "observer_of_opaque_calls"]
