"""OpInfo samples as training steps: the op called on parameters, a loss that weighs every output
element differently. Shared by tests/joint/test_opinfo_steps.py and scripts/joint_opinfo.py."""

from __future__ import annotations

import functools
from typing import Any

import torch

from predispatch_func import _torch_compat as tc
from tests.conformance.case import first, seeded


@functools.cache
def differentiable_ops() -> dict[str, Any]:
    """op_db's OpInfos that support autograd, by ``name[.variant]``."""
    from torch.testing._internal.common_methods_invocations import op_db

    return {op.name + (f".{op.variant_test_name}" if op.variant_test_name else ""): op
            for op in op_db if op.supports_autograd}


class OnParameters(torch.nn.Module):
    """``fn(*args, **kwargs)`` with the call's differentiable tensors as parameters and its other
    tensors as forward inputs, so every exporter reports the gradients as parameter gradients."""

    def __init__(self, fn: Any, args: tuple, kwargs: dict, process: Any = None):
        super().__init__()
        self.fn = fn
        self.process = process  # the OpInfo's output_process_fn_grad: what its own gradient checks compare
        leaves, self.spec = tc.pytree.tree_flatten((args, kwargs))
        self.kinds: list[str] = []
        self.constants: list[Any] = []
        self.inputs: list[torch.Tensor] = []
        for i, value in enumerate(leaves):
            if isinstance(value, torch.Tensor) and value.requires_grad:
                self.register_parameter(f"p{i}", torch.nn.Parameter(value.detach().clone()))
                self.kinds.append(f"p{i}")
                self.constants.append(None)
            elif isinstance(value, torch.Tensor):
                self.inputs.append(value.detach().clone())
                self.kinds.append("input")
                self.constants.append(None)
            else:
                self.kinds.append("constant")
                self.constants.append(value)

    def forward(self, *tensors: torch.Tensor) -> Any:
        given = iter(tensors)
        leaves = [getattr(self, kind) if kind.startswith("p") else next(given) if kind == "input" else constant
                  for kind, constant in zip(self.kinds, self.constants)]
        args, kwargs = tc.pytree.tree_unflatten(leaves, self.spec)
        out = self.fn(*args, **kwargs)
        return self.process(out) if self.process is not None else out


def ramp_loss(out: Any) -> torch.Tensor:
    """Every floating output weighted by a ramp, summed: each element gets its own gradient."""
    leaves = [t for t in tc.pytree.tree_leaves(out)
              if isinstance(t, torch.Tensor) and t.dtype.is_floating_point]
    if not leaves:
        raise ValueError("the op returns no floating tensor")
    total = None
    for t in leaves:
        w = torch.linspace(0.5, 1.5, t.numel(), dtype=t.dtype, device=t.device).reshape(t.shape)
        term = (t * w).sum()
        total = term if total is None else total + term
    return total  # type: ignore[return-value]


def samples(op: Any, dtype: torch.dtype, count: int, name: str) -> list:
    with seeded(name):
        return first(op.sample_inputs("cpu", dtype, requires_grad=True), count)


def step_of(name: str, index: int, dtype: torch.dtype = torch.float64) -> tuple[OnParameters, tuple] | None:
    """The ``index``-th sample of OpInfo ``name`` as (module, forward inputs); None if it has none."""
    op = differentiable_ops()[name]
    drawn = samples(op, dtype, index + 1, name)
    if len(drawn) <= index:
        return None
    sample = drawn[index]
    model = OnParameters(op.op, (sample.input, *sample.args), dict(sample.kwargs), sample.output_process_fn_grad)
    return model, tuple(model.inputs)
