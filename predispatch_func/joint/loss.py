"""The model as the forward of a training step: a call returning ``(loss, *outputs)``.

``export`` traces this call, so the loss (and ``loss_fn``, when given) is part of the
functional forward, with the same composite policy and regions as the model's code.
The step is a shallow copy of the model: it shares the model's parameter, buffer and
submodule tables (same names in the program, nothing copied), and only its ``forward``
differs; the model object itself is never touched.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable
from typing import Any

import torch


def training_step(model: torch.nn.Module, loss_fn: Callable[..., Any] | None) -> torch.nn.Module:
    """A module whose forward returns ``(loss, *user outputs)``, the loss first.

    Without ``loss_fn`` the model returns the loss, or a tuple/list whose first element is it;
    with it, the loss is ``loss_fn(model(*args, **kwargs))`` and the model's output follows it.
    """
    # copy.copy's default (GraphModule overrides __copy__ to build a new one): the same class,
    # a new object whose attributes are the model's (shares _parameters, _buffers and _modules)
    step = type(model).__new__(type(model))
    step.__dict__.update(model.__dict__)
    if not _plain_forward(model):  # an instance-level forward: a deep copy of the step copies it too
        step.__dict__["_pf_user_forward"] = model.forward

    def forward(self: torch.nn.Module, *args: Any, **kwargs: Any) -> tuple:
        # bound to the step, not closed over it: the state judge runs a deep copy of the step,
        # whose forward must run on the copy's tensors, never on the caller's
        user_forward = vars(self).get("_pf_user_forward")
        out = type(model).forward(self, *args, **kwargs) if user_forward is None else user_forward(*args, **kwargs)
        if loss_fn is not None:
            return (loss_fn(out), out)
        if isinstance(out, (tuple, list)) and len(out) > 0:
            return tuple(out)
        return (out,)

    signature = inspect.signature(model.forward)  # the model's, for dynamic_shapes by name
    forward.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY), *signature.parameters.values()])
    step.forward = types.MethodType(forward, step)  # type: ignore[method-assign]
    return step


def _plain_forward(model: torch.nn.Module) -> bool:
    """Whether ``forward`` is the class's method (then it runs on the step, whose attribute
    writes stay off the model); an instance-level forward runs as the user set it."""
    return "forward" not in vars(model)


__all__ = ["training_step"]
