"""OpInfo cases: every op of ``op_db`` written in place and through ``out=``.

Variants, 2 samples each:

* ``inplace``: the in-place variant on a forward input (returned);
* ``inplace_view``: on ``x[1]`` of an input ``x`` that stacks two copies;
* ``inplace_buffer``: on a buffer of the module;
* ``out``: ``op(..., out=o)`` with ``o`` a forward input, zero-filled, of
  eager's result shapes and dtypes;
* ``grad``: the plain op, with gradients of every float input.

Float inputs require grad in the replay where eager allows it (an input
written in place is then a leaf's ``clone()``, see ``pf.verify``).
"""

from __future__ import annotations

import functools

import torch

from .case import Call, Case, NotApplicable, first, fresh, seeded

SAMPLES = 2
VARIANTS = ("inplace", "inplace_view", "inplace_buffer", "out", "grad")
_DTYPES = (torch.float32, torch.float64, torch.int64, torch.int32, torch.bool, torch.complex64)


@functools.cache
def _ops() -> dict:
    from torch.testing._internal.common_methods_invocations import op_db

    return {(op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")): op for op in op_db}


def _variants(op) -> list[str]:
    out = []
    if op.inplace_variant is not None:
        out += ["inplace", "inplace_view", "inplace_buffer"]
    if op.supports_out:
        out.append("out")
    if op.supports_autograd:
        out.append("grad")
    return out


def case_names() -> list[str]:
    return [f"opinfo/{key}/{variant}/{i}" for key, op in _ops().items()
            for variant in _variants(op) for i in range(SAMPLES)]


def _dtype(op, grad: bool) -> torch.dtype:
    supported = op.supported_backward_dtypes("cpu") if grad else op.supported_dtypes("cpu")
    for dtype in _DTYPES[:2] if grad else _DTYPES:
        if dtype in supported:
            return dtype
    raise NotApplicable(f"no {'differentiable ' if grad else ''}dtype among {sorted(map(str, supported))}")


def _sample(op, name: str, variant: str, index: int):
    """The ``index``-th sample; every sample of one op and variant comes from one seeded stream."""
    dtype = _dtype(op, grad=variant == "grad")
    with seeded(name.rsplit("/", 1)[0]):
        samples = first(op.sample_inputs("cpu", dtype, requires_grad=variant == "grad"), index + 1)
    if len(samples) <= index:
        raise NotApplicable(f"{op.name} has {len(samples)} sample(s) of {dtype}")
    s = samples[index]
    if not isinstance(s.input, torch.Tensor) and variant.startswith("inplace"):
        raise NotApplicable("the sample's input is not a tensor")
    return s


class OnView(torch.nn.Module):
    """``fn_(x[1], ...)`` for an input ``x`` that stacks two copies of the sample's input."""

    def __init__(self, fn, args: tuple, kwargs: dict):
        super().__init__()
        self.fn = fn
        self.call = Call(fn, args, kwargs)

    def forward(self, base, *tensors):
        args, kwargs = self.call.call_args(tensors)
        return self.fn(base[1], *args, **kwargs)


class OnBuffer(torch.nn.Module):
    """``fn_(self.buf, ...)``; returns a copy of the buffer."""

    def __init__(self, fn, buf: torch.Tensor, args: tuple, kwargs: dict):
        super().__init__()
        self.fn = fn
        self.register_buffer("buf", buf)
        self.call = Call(fn, args, kwargs)

    def forward(self, *tensors):
        args, kwargs = self.call.call_args(tensors)
        self.fn(self.buf, *args, **kwargs)
        return self.buf.clone()


def _out_like(result):
    """Zero-filled ``out=`` tensors shaped as eager's result (a tuple for several)."""
    if isinstance(result, torch.Tensor):
        return torch.zeros_like(result)
    if isinstance(result, (tuple, list)) and all(isinstance(r, torch.Tensor) for r in result):
        return tuple(torch.zeros_like(r) for r in result)
    raise NotApplicable(f"result is {type(result).__name__}, not tensors")


def build(name: str) -> Case:
    _, key, variant, index = name.split("/")
    op = _ops()[key]
    s = _sample(op, name, variant, int(index))
    args, kwargs = (s.input, *s.args), dict(s.kwargs)
    if variant == "grad":
        model = Call(op.op, args, kwargs)
        return Case(name, model, model.tensors_of(args, kwargs))
    args, kwargs = fresh((args, kwargs), requires_grad=False)
    if variant == "inplace":
        model = Call(op.inplace_variant, args, kwargs)
        return Case(name, model, model.tensors_of(args, kwargs))
    if variant == "inplace_view":
        model = OnView(op.inplace_variant, args[1:], kwargs)
        base = torch.stack([args[0], args[0]])
        return Case(name, model, (base, *model.call.tensors_of(args[1:], kwargs)))
    if variant == "inplace_buffer":
        model = OnBuffer(op.inplace_variant, args[0], args[1:], kwargs)
        return Case(name, model, model.call.tensors_of(args[1:], kwargs))
    if variant == "out":
        try:
            with seeded(name):
                result = op.op(*fresh(args), **fresh(kwargs))
        except Exception as exc:
            raise NotApplicable(f"eager raises: {type(exc).__name__}") from exc
        kwargs["out"] = _out_like(result)
        model = Call(op.op, args, kwargs)
        return Case(name, model, model.tensors_of(args, kwargs))
    raise KeyError(name)

