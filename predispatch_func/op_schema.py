"""Per-op schema facts shared by export and eager: an op's ``out=`` arguments, what
else it writes, and its functional twin.

Both halves of the project turn a mutating op into "its functional form plus a
write": the trace for ``out=`` composites and in-place ops functionalization
cannot take (trace/out_variants.py), torch's unary in-place ops with a Python
Meta kernel (trace/stack.py), and ``pf.eager`` for every in-place and ``out=``
op outside a target (eager/plans.py). Which overload is that functional form is
one question with one answer, here; ``eager/`` reads it without reaching into
the trace.
"""

from __future__ import annotations

import enum
import functools

import torch

from . import _torch_compat as tc


class Match(enum.Enum):
    """How an in-place op's arguments must match its twin's."""

    IN_ORDER = "same names, types, order and defaults: a call passes the op's arguments on as they are"
    BY_NAME = "same names and types: a call passes them by name"


def out_argument_names(op: tc.OpOverload) -> list[str]:
    """Names of ``op``'s ``out=`` arguments (mutable keyword-only tensors)."""
    return [a.name for a in tc.schema_of(op).arguments if a.is_out]


def written_besides_out(op: tc.OpOverload) -> frozenset[str]:
    return frozenset(name for _, name in tc.written_arguments(op)) - frozenset(out_argument_names(op))


def writes_besides_out(op: tc.OpOverload) -> bool:
    """An ``out=`` overload that also writes other arguments (functionalization misorders it)."""
    return bool(out_argument_names(op)) and bool(written_besides_out(op))


@functools.cache
def functional_twin(op: tc.OpOverload, match: Match = Match.BY_NAME) -> tc.OpOverload | None:
    """The overload computing what ``op`` writes, without writing it; None if there is none.

    An ``out=`` overload: the overload of its packet taking the same arguments
    without ``out``, returning as many tensors and writing nothing ``op`` does not
    write besides ``out``. An in-place aten op (``add_.Tensor``): the overload of
    the name without ``_`` that writes nothing and takes the same arguments
    (``match``)."""
    if out_argument_names(op):
        return _out_twin(op)
    return _inplace_twin(op, match)


def _out_twin(op: tc.OpOverload) -> tc.OpOverload | None:
    wanted = [(a.name, str(a.type)) for a in tc.schema_of(op).arguments if not a.is_out]
    n_out = len(out_argument_names(op))
    packet = op.overloadpacket
    for name in packet.overloads():
        twin = getattr(packet, name)
        schema = tc.schema_of(twin)
        if (written_besides_out(twin) <= written_besides_out(op) and len(schema.returns) == n_out
                and [(a.name, str(a.type)) for a in schema.arguments] == wanted):
            return twin
    return None


def _inplace_twin(op: tc.OpOverload, match: Match) -> tc.OpOverload | None:
    name = tc.schema_of(op).name
    if not (name.startswith("aten::") and name.endswith("_") and not name.endswith("__")):
        return None
    packet = getattr(torch.ops.aten, name[len("aten::"):-1], None)
    wanted = _arguments_key(tc.schema_of(op), match)
    for overload in packet.overloads() if packet is not None else ():
        twin = getattr(packet, overload)
        schema = tc.schema_of(twin)
        if not schema.is_mutable and _arguments_key(schema, match) == wanted:
            return twin
    return None


def _arguments_key(schema: torch.FunctionSchema, match: Match) -> list[tuple]:
    if match is Match.IN_ORDER:
        return [(a.name, str(a.type), a.default_value if a.has_default_value() else None, a.kwarg_only)
                for a in schema.arguments]
    return sorted((a.name, str(a.type)) for a in schema.arguments)


__all__ = ["Match", "functional_twin", "out_argument_names", "written_besides_out", "writes_besides_out"]


@functools.cache
def takes_dtype_from_out(op: tc.OpOverload) -> bool:
    """An ``out=`` overload of one out tensor with a keyword ``dtype``: eager's kernel computes in
    the out tensor's dtype where none is given (``get_dtype_from_result``: ``torch.sum(x, 1,
    out=long_tensor)`` sums ``x`` cast to long, [1, 3] where summing the floats and casting gives
    [3, 4])."""
    return len(out_argument_names(op)) == 1 and any(
        a.name == "dtype" and a.kwarg_only for a in tc.schema_of(op).arguments)


def dtype_from_out(op: tc.OpOverload, args: tuple, kwargs: dict) -> torch.dtype | None:
    """The dtype eager computes ``op(*args, **kwargs)`` in where it is the out tensor's and not the
    input's (``takes_dtype_from_out``, no ``dtype`` given); None where the call needs none."""
    if not takes_dtype_from_out(op) or kwargs.get("dtype") is not None:
        return None
    out, source = kwargs.get(out_argument_names(op)[0]), args[0] if args else None
    if not isinstance(out, torch.Tensor) or not isinstance(source, torch.Tensor) or out.dtype == source.dtype:
        return None
    return out.dtype
