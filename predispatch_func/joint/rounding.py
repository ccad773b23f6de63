"""Is a joint program's float32 difference from eager rounding, or an error?

A program lowered to an op set (``target=core_aten``) computes batch norm's and layer
norm's sums with other ops than eager's fused kernels, so its float32 gradients round in
other places; on a net that amplifies rounding (a batch-norm bias whose gradient nearly
cancels) that misses ``allclose(1e-5)`` although nothing is wrong. Two questions tell the
cases apart, both answered on copies of the model (the caller's is not touched):

* the same program exported in float64 (same loss, same target): does it equal eager in
  float64 (1e-9)? An error of the lowering shows there too; rounding does not;
* for each gradient of one float32 step of the program at hand, the largest error against the
  float64 gradient over its largest magnitude, ours over eager's: near 1, the program is as
  close to the exact gradient as eager is.
"""

from __future__ import annotations

import copy
import dataclasses
import statistics
from collections.abc import Callable
from typing import Any

import torch

from .. import _torch_compat as tc


@dataclasses.dataclass
class RoundingJudgement:
    equal_in_float64: bool
    median_ratio: float  # per gradient: our error to the float64 gradient over eager's
    worst_ratio: float
    worst: str  # the gradient with the worst ratio, "name: ours vs eager's error"
    float64_problems: list[str] = dataclasses.field(default_factory=list)

    @property
    def rounding(self) -> bool:
        """Equal in float64, and in float32 about as close to the exact gradients as eager, in
        the median and in the worst gradient: the float32 difference is where each rounds. The
        bounds are loose (a lowered batch norm in a net that amplifies rounding came to 1.8 and
        4.3); a wrong program is off by orders of magnitude, if only in one gradient (a
        convolution's output scaled by 1.001 ahead of a batch norm: median 1.3, worst 750)."""
        return self.equal_in_float64 and self.median_ratio <= 2.0 and self.worst_ratio <= 10.0

    def __str__(self) -> str:
        if not self.equal_in_float64:
            return ("in float64 the program still differs from eager: not rounding ("
                    + "; ".join(self.float64_problems[:3]) + ")")
        verdict = "rounding" if self.rounding else "equal in float64, but in float32 farther from it than eager"
        return (f"{verdict}: in float64 the program equals eager (1e-9); in float32 its gradients' error to "
                f"the float64 ones is {self.median_ratio:.2f}x eager's own (median), worst {self.worst_ratio:.2f}x "
                f"({self.worst})")


def judge_rounding(ep: Any, model: torch.nn.Module, args: tuple, kwargs: dict, loss_fn: Callable[..., Any] | None,
                   float64_problems: list[str], seed: int = 0) -> RoundingJudgement:
    """``ep``'s float32 gradients of one step against eager's and the float64 ones;
    ``float64_problems``: what the same program exported from float64 copies met against eager
    in float64 (empty: equal), found by the caller (``verify_joint``)."""
    wide_model = copy.deepcopy(model).double()
    wide_args, wide_kwargs = doubled((args, kwargs))
    exact = _gradients(wide_model, wide_args, wide_kwargs, loss_fn, seed)
    eager = _gradients(copy.deepcopy(model), args, kwargs, loss_fn, seed)
    ours = _gradients(ep.module(), args, kwargs, loss_fn, seed, program=True)
    ratios = {}
    for name, truth in exact.items():
        if name not in eager or name not in ours:
            continue
        scale = float(truth.abs().max()) or 1.0
        eager_error = float((eager[name].double() - truth).abs().max()) / scale
        our_error = float((ours[name].double() - truth).abs().max()) / scale
        # eager exact on a gradient: ours still rounds, by a float32 unit at least
        ratios[name] = (our_error / max(eager_error, _UNIT_ROUNDOFF), our_error, eager_error)
    equal = not float64_problems
    if not ratios:
        return RoundingJudgement(equal, 1.0, 1.0, "no gradient", float64_problems)
    worst = max(ratios, key=lambda n: ratios[n][0])
    return RoundingJudgement(equal, statistics.median(r[0] for r in ratios.values()), ratios[worst][0],
                             f"{worst}.grad: {ratios[worst][1]:.1e} vs {ratios[worst][2]:.1e}", float64_problems)


_UNIT_ROUNDOFF = 2.0 ** -24  # float32's unit roundoff


def doubled(value: Any) -> Any:
    """Float tensors in float64 (leaves, requiring grad as they did); the rest as it is."""
    return tc.pytree.tree_map_only(
        torch.Tensor, lambda t: t.detach().double().requires_grad_(t.requires_grad) if t.is_floating_point()
        else t, value)


def _gradients(module: torch.nn.Module, args: tuple, kwargs: dict, loss_fn: Callable[..., Any] | None,
               seed: int, program: bool = False) -> dict[str, torch.Tensor]:
    """One step's parameter gradients: a joint program's module places them itself; eager's
    backward runs from ``loss_fn`` of the output, or from the loss the model returns first."""
    fresh = tc.pytree.tree_map_only(torch.Tensor, lambda t: t.detach().clone().requires_grad_(t.requires_grad),
                                    (args, kwargs))
    torch.manual_seed(seed)
    out = module(*fresh[0], **fresh[1])
    if not program:
        loss = loss_fn(out) if loss_fn is not None else (out[0] if isinstance(out, (tuple, list)) else out)
        loss.backward()
    return {n: p.grad.detach() for n, p in module.named_parameters() if p.grad is not None}


__all__ = ["RoundingJudgement", "doubled", "judge_rounding"]
