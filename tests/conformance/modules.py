"""ModuleInfo cases: every module of ``module_db`` exported as itself.

Variants: the default build and, for modules that take ``inplace``, the
``inplace=True`` build, each in train and eval mode (``default-train``,
``inplace-eval``, ...), up to 3 samples each. Lazy modules run once first, as
a user's would before exporting.
"""

from __future__ import annotations

import functools
import inspect

import torch

from .case import Case, NotApplicable, fresh, seeded

SAMPLES = 3


@functools.cache
def _modules() -> dict:
    from torch.testing._internal.common_modules import module_db

    return {mi.name: mi for mi in module_db}


def _takes_inplace(mi) -> bool:
    return "inplace" in inspect.signature(mi.module_cls.__init__).parameters


def case_names() -> list[str]:
    names = []
    for key, mi in _modules().items():
        for build_kind in ("default", "inplace") if _takes_inplace(mi) else ("default",):
            for mode in ("train", "eval"):
                names += [f"modules/{key}/{build_kind}-{mode}/{i}" for i in range(SAMPLES)]
    return names


def build(name: str) -> Case:
    _, key, variant, index = name.split("/")
    mi = _modules()[key]
    build_kind, mode = variant.split("-")
    dtype = torch.float32 if torch.float32 in mi.dtypes else torch.float64
    with seeded(name):
        inputs = mi.module_inputs_func(mi, device="cpu", dtype=dtype, requires_grad=False,
                                       training=mode == "train")
        if len(inputs) <= int(index):
            raise NotApplicable(f"{key} has {len(inputs)} sample(s)")
        sample = inputs[int(index)]
        ctor = sample.constructor_input
        ctor_kwargs = dict(ctor.kwargs)
        if build_kind == "inplace":
            ctor_kwargs["inplace"] = True
        model = mi.module_cls(*ctor.args, **ctor_kwargs).to(dtype)
        model.train(mode == "train")
        args, kwargs = sample.forward_input.args, dict(sample.forward_input.kwargs)
        if mi.is_lazy:
            model(*fresh(args), **fresh(kwargs))
    return Case(name, model, tuple(args), kwargs)
