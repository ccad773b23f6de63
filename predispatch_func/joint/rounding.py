"""Is a joint program's float32 difference from eager rounding, or an error?

A program lowered to an op set (``target=core_aten``) computes batch norm's and layer
norm's sums with other ops than eager's fused kernels, so its float32 gradients round in
other places; on a net that amplifies rounding (a batch-norm bias whose gradient nearly
cancels) that misses ``allclose(1e-5)`` although nothing is wrong. Two questions tell the
cases apart (``verify_joint(judge_float64=True)`` asks them on copies of the model):

* the same program exported in float64 (same loss, same target): does it equal eager in
  float64 (1e-9)? An error of the lowering shows there too; rounding does not;
* for each gradient of one float32 step of the program at hand, the largest error against the
  float64 gradient over its largest magnitude, ours over eager's: near 1, the program is as
  close to the exact gradient as eager is.
"""

from __future__ import annotations

import dataclasses
import statistics

import torch


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


def judge_rounding(ours: dict[str, torch.Tensor], eager: dict[str, torch.Tensor], exact: dict[str, torch.Tensor],
                   float64_problems: list[str]) -> RoundingJudgement:
    """One float32 step's gradients, ours and eager's, against ``exact`` (float64 eager's);
    ``float64_problems``: what the same program exported from float64 copies met against eager
    in float64 (empty: equal). Both found by ``verify_joint``, which runs the models."""
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


def not_measured(exc: Exception) -> RoundingJudgement:
    """A model that cannot run in float64 (raft builds float32 grids): nothing judged."""
    return RoundingJudgement(False, float("nan"), float("nan"), "not measured",
                             [f"the float64 copy could not run ({type(exc).__name__}: {str(exc)[:200]})"])


__all__ = ["RoundingJudgement", "judge_rounding", "not_measured"]
