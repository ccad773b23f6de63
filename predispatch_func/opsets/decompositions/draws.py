"""Random ops drawing from the generator what their CPU kernels draw, through the floor's fills.

* ``multinomial`` without replacement (or one sample): the exponential race (Gumbel's max
  trick with ``exp`` applied): ``argmax`` or ``topk`` of ``p / q``, ``q`` filled by
  ``exponential_(1)`` over a tensor like ``p``, which is the kernel's own method, so the same
  numbers are drawn in the same order and the same categories come out. With replacement and
  more than one sample, the kernel's search: each row's running sum accumulated in the
  input's dtype, divided by the total (the last set to 1), then per draw one float64
  ``uniform(0, 1)``, row by row, and the first category whose sum reaches it.
* ``rrelu_with_noise`` in training: one ``uniform(lower, upper)`` in float64 for each
  non-positive element, in order (positives draw nothing, their noise is 1), which is what
  ``uniform_`` over a float64 tensor of that many elements draws; the products round within
  an ulp of the kernel's. Out of training: ``leaky_relu`` with the mean slope, no draw.

* ``bernoulli.p`` (the mask of dropout and of stochastic depth in training, drawn by
  ``bernoulli_`` into a fresh tensor and functionalized): the mask Core ATen's
  ``native_dropout`` draws over ones with drop probability ``1 - p``. Its CPU kernel draws
  that mask by the same ``bernoulli_(1 - drop)`` over a contiguous tensor, so the same
  numbers come out where ``1 - (1 - p) == p`` exactly (every ``p >= 0.5``, which covers
  dropout below 0.5 and the usual survival rates); elsewhere, with a generator, with ``p`` 0
  or 1, or on CUDA, whose fused dropout kernel draws another stream, it stays undecomposed.
  torch's own joint path reaches ``native_dropout`` too, from ``dropout``.

* ``uniform`` (``uniform_`` functionalized: BigBird's random attention blocks, ``nn.init`` in a
  forward): Core ATen's ``rand`` (the same draws: ``rand`` is ``uniform_(0, 1)``) scaled as the
  CPU kernel scales it, ``low + (high - low) * u`` rounded once (``add`` with ``alpha``: the
  kernel's fused multiply-add), so the same numbers come out in float32 and float64 over a
  contiguous tensor; elsewhere (reduced precision, another layout, a generator, CUDA, whose
  kernel maps a draw that rounds up to ``high`` back to ``low``: 1 element in 4M differed on an
  H200) it stays undecomposed. torch decomposes ``uniform`` only into prims.

* ``randn_like`` and ``rand_like`` (a VAE's reparameterisation noise, ``torch.randn_like(std)``):
  Core ATen's ``randn`` and ``rand`` over the same sizes, which fill a fresh contiguous tensor by
  the same ``normal_``/``uniform_`` kernel as the ``_like`` op fills its fresh tensor, so the same
  numbers come out, on the CPU and on CUDA; where the fresh tensor would not be contiguous (a
  non-contiguous input whose layout ``preserve_format`` keeps) the kernel fills it in another order,
  and it stays undecomposed.

multinomial and rrelu read the data (the validity checks, the count of non-positive elements),
so ``pf.eager`` runs them uncached and export names them (``reads_data``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ... import _torch_compat as tc


def multinomial(probabilities: torch.Tensor, num_samples: int, replacement: bool = False, *,
                generator: torch.Generator | None = None) -> Any:
    if probabilities.dim() not in (1, 2) or not probabilities.is_floating_point():
        return NotImplemented
    if not bool(((probabilities.max() < float("inf")) & (probabilities.min() >= 0)).item()):
        raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
    if bool((probabilities.sum(-1) == 0).any().item()):
        raise RuntimeError("invalid multinomial distribution (sum of probabilities <= 0)")
    if not replacement and num_samples > probabilities.size(-1):
        raise RuntimeError("cannot sample n_sample > prob_dist.size(-1) samples without replacement")
    if replacement and num_samples > 1:
        return _with_replacement(probabilities, num_samples, generator)
    race = probabilities / torch.empty_like(probabilities).exponential_(1, generator=generator)
    if num_samples == 1:
        return race.argmax(-1, keepdim=True)
    return race.topk(num_samples).indices


def _with_replacement(probabilities: torch.Tensor, num_samples: int, generator: torch.Generator | None) -> torch.Tensor:
    rows = probabilities.reshape(-1, probabilities.size(-1))
    total = torch.zeros_like(rows[:, 0])
    running = []
    for j in range(rows.size(1)):  # one add at a time, in the input's dtype, as the kernel sums
        total = total + rows[:, j]
        running.append(total)
    cumulative = torch.stack(running, -1) / total.unsqueeze(-1)
    cumulative = torch.cat([cumulative[:, :-1], torch.ones_like(cumulative[:, -1:])], -1)
    draws = torch.empty((rows.size(0), num_samples), dtype=torch.float64, device=rows.device).uniform_(
        0, 1, generator=generator)
    chosen = (cumulative.to(torch.float64).unsqueeze(1) < draws.unsqueeze(-1)).sum(-1)
    return chosen.reshape(*probabilities.shape[:-1], num_samples)


def _rrelu(x: torch.Tensor, lower: float, upper: float, training: bool,
           generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(the result, the noise drawn: None out of training)."""
    if not training:
        return torch.nn.functional.leaky_relu(x, (float(lower) + float(upper)) / 2), None
    non_positive = x <= 0
    count = int(non_positive.sum().item())
    draws = torch.empty(count, dtype=torch.float64, device=x.device).uniform_(
        float(lower), float(upper), generator=generator).to(x.dtype)
    noise = torch.ones_like(x).masked_scatter(non_positive, draws)
    return x * noise, noise


def _rrelu_writing_noise(x: torch.Tensor, noise: torch.Tensor, lower: float, upper: float, training: bool,
                         generator: torch.Generator | None) -> torch.Tensor:
    """The result, with ``noise`` written (in training), as the kernel does."""
    out, drawn = _rrelu(x, lower, upper, training, generator)
    if drawn is not None:
        noise.copy_(drawn)
    return out


def rrelu_with_noise(x: torch.Tensor, noise: torch.Tensor, lower: float = 0.125, upper: float = 1 / 3,
                     training: bool = False, generator: torch.Generator | None = None) -> Any:
    """Writes ``noise`` (in training), as the kernel does."""
    if not x.is_floating_point():
        return NotImplemented
    return _rrelu_writing_noise(x, noise, lower, upper, training, generator)


def rrelu_with_noise_(x: torch.Tensor, noise: torch.Tensor, lower: float = 0.125, upper: float = 1 / 3,
                      training: bool = False, generator: torch.Generator | None = None) -> Any:
    if not x.is_floating_point():
        return NotImplemented
    return x.copy_(_rrelu_writing_noise(x, noise, lower, upper, training, generator))


def rrelu_with_noise_functional(x: torch.Tensor, noise: torch.Tensor, lower: float = 0.125, upper: float = 1 / 3,
                                training: bool = False, generator: torch.Generator | None = None) -> Any:
    if not x.is_floating_point():
        return NotImplemented
    out, drawn = _rrelu(x, lower, upper, training, generator)
    return out, (drawn if drawn is not None else noise.clone())


def bernoulli_p(x: torch.Tensor, p: float = 0.5, *, generator: torch.Generator | None = None) -> Any:
    drawn_alike = (generator is None and isinstance(p, (float, int)) and 0 < p < 1 and 1 - (1 - p) == p
                   and x.device.type != "cuda")
    if not drawn_alike:
        return NotImplemented
    # contiguous, as bernoulli.p allocates
    ones = torch.ops.aten.full.default(list(x.shape), 1, dtype=x.dtype, device=x.device)
    return torch.ops.aten.native_dropout.default(ones, 1 - p, True)[1].to(x.dtype)


bernoulli_p.declines = (  # type: ignore[attr-defined]  # the refusal's reason (Lowering.why_missing)
    "where it cannot draw eager's mask: a p with 1 - (1 - p) != p, p 0 or 1, a generator, or CUDA (whose "
    "fused dropout kernel draws another stream than bernoulli_); write the mask with a p of at least 0.5, "
    "or add bernoulli.p to the target")


def uniform(x: torch.Tensor, low: float = 0.0, high: float = 1.0, *,
            generator: torch.Generator | None = None) -> Any:
    drawn_alike = (generator is None and x.dtype in (torch.float32, torch.float64) and x.device.type == "cpu"
                   and x.is_contiguous() and isinstance(low, (float, int)) and isinstance(high, (float, int)))
    if not drawn_alike:
        return NotImplemented
    draws = torch.ops.aten.rand.default(list(x.shape), dtype=x.dtype, device=x.device)
    low_tensor = torch.ops.aten.full.default([], low, dtype=x.dtype, device=x.device)
    return torch.ops.aten.add.Tensor(low_tensor, draws, alpha=high - low)


uniform.declines = (  # type: ignore[attr-defined]  # the refusal's reason (Lowering.why_missing)
    "where it cannot draw eager's numbers: a generator, a dtype other than float32 and float64, a "
    "non-contiguous tensor, or CUDA; add uniform to the target, or draw with torch.rand")


def _dense(x: torch.Tensor) -> bool:
    """Non-overlapping and dense (its elements fill one block): ``preserve_format`` keeps the
    strides of such a tensor only; any other gets contiguous ones."""
    expected = 1
    for size, stride in sorted(zip(x.shape, x.stride()), key=lambda pair: pair[1]):
        if size == 1:
            continue
        if stride != expected:
            return False
        expected *= size
    return True


def _like_drawn_fresh(op_name: str) -> Callable[..., Any]:
    def like(x: torch.Tensor, *, dtype: torch.dtype | None = None, layout: torch.layout | None = None,
             device: Any = None, pin_memory: bool | None = None, memory_format: Any = None) -> Any:
        contiguous = x.is_contiguous() or memory_format is torch.contiguous_format or not _dense(x)
        if not contiguous or layout not in (None, torch.strided) or pin_memory \
                or memory_format not in (None, torch.preserve_format, torch.contiguous_format):
            return NotImplemented
        fresh = getattr(torch.ops.aten, op_name).default
        return fresh(list(x.shape), dtype=dtype or x.dtype, device=device if device is not None else x.device)
    like.__name__ = f"{op_name}_like"
    like.declines = (  # type: ignore[attr-defined]
        f"where the fresh tensor would not be contiguous (a non-contiguous input, preserve_format), or another "
        f"layout: {op_name}'s kernel would fill it in another order; make the input contiguous, or draw with "
        f"torch.{op_name}(x.shape)")
    return like


randn_like = _like_drawn_fresh("randn")
rand_like = _like_drawn_fresh("rand")


for _decomposition in (multinomial, rrelu_with_noise, rrelu_with_noise_, rrelu_with_noise_functional):
    _decomposition.reads_data = True  # type: ignore[attr-defined]


DECOMPOSITIONS: dict[Any, Callable] = {op: decomposition for op, decomposition in (
    (tc.resolve_overload("aten", "multinomial.default"), multinomial),
    (tc.resolve_overload("aten", "bernoulli.p"), bernoulli_p),
    (tc.resolve_overload("aten", "uniform.default"), uniform),
    (tc.resolve_overload("aten", "randn_like.default"), randn_like),
    (tc.resolve_overload("aten", "rand_like.default"), rand_like),
    (tc.resolve_overload("aten", "rrelu_with_noise.default"), rrelu_with_noise),
    (tc.resolve_overload("aten", "rrelu_with_noise_.default"), rrelu_with_noise_),
    (tc.resolve_overload("aten", "rrelu_with_noise_functional.default"), rrelu_with_noise_functional),
) if op is not None}
