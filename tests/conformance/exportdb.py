"""ExportDB cases: ``torch._export.db.examples``, torch.export's own showcase.

Two variants each: ``as_given`` (the example's inputs and dynamic shapes,
outputs and write-backs compared) and ``grads`` (static shapes, gradients of
parameters and float inputs compared too).
"""

from __future__ import annotations

import copy
import functools

import torch

from .case import Case

VARIANTS = ("as_given", "grads")


@functools.cache
def _examples() -> dict:
    from torch._export.db.examples import all_examples

    return dict(all_examples())


def case_names() -> list[str]:
    return [f"exportdb/{key}/{variant}/0" for key in _examples() for variant in VARIANTS]


def build(name: str) -> Case:
    _, key, variant, _ = name.split("/")
    example = _examples()[key]
    model = example.model
    model = copy.deepcopy(model) if isinstance(model, torch.nn.Module) else model
    args, kwargs = copy.deepcopy((tuple(example.example_args), dict(example.example_kwargs or {})))
    if variant == "as_given":
        return Case(name, model, args, kwargs, dynamic_shapes=example.dynamic_shapes, check_grads=False)
    return Case(name, model, args, kwargs)
