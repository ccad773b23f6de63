"""hop_db cases: torch's higher-order ops (``cond``, ``while_loop``, ``map``,
``scan``, ``flex_attention``, ...) called by a module, 2 samples each, with
gradients of float inputs where eager has them."""

from __future__ import annotations

import functools

import torch

from .case import Call, Case, NotApplicable, first, seeded

SAMPLES = 2


@functools.cache
def _hops() -> dict:
    from torch.testing._internal.hop_db import hop_db

    return {(op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")): op for op in hop_db}


def case_names() -> list[str]:
    return [f"hop/{key}/call/{i}" for key in _hops() for i in range(SAMPLES)]


def build(name: str) -> Case:
    _, key, _, index = name.split("/")
    op = _hops()[key]
    dtype = torch.float32 if torch.float32 in op.supported_dtypes("cpu") else torch.float64
    with seeded(name.rsplit("/", 1)[0]):
        samples = first(op.sample_inputs("cpu", dtype, requires_grad=False), int(index) + 1)
    if len(samples) <= int(index):
        raise NotApplicable(f"{key} has {len(samples)} sample(s)")
    s = samples[int(index)]
    args, kwargs = (s.input, *s.args), dict(s.kwargs)
    model = Call(op.op, args, kwargs)
    return Case(name, model, model.tensors_of(args, kwargs))
