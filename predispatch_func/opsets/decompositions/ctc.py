"""The connectionist temporal classification loss and its backward kernel (Graves et al., 2006).

Each target is extended with blanks around and between its labels (``l'``, length
``2 S + 1``). The forward variables ``alpha[t, s]`` (log-probability of every path through
``l'[:s+1]`` in the first ``t + 1`` steps) follow ``alpha[t, s] = lse(alpha[t-1, s],
alpha[t-1, s-1], alpha[t-1, s-2] where l'[s] is a label unlike l'[s-2]) + lp[t, l'[s]]``, and
the loss is ``-lse(alpha[L-1, 2S], alpha[L-1, 2S-1])``; the backward variables ``beta`` run the
same recursion from the end. The time loop's length is the input's (static); each batch
element's own input length ``L`` is a mask, all elements stepping together over the padded
extended targets.

The backward kernel's result is eager's: ``(exp(lp) - exp(lse_{s: l'[s] = c}(alpha + beta) +
nll - lp)) * grad`` at steps inside the input, 0 after; 0 for an infinite loss under
``zero_infinity``. Its ``exp(lp)`` term is not the derivative of the loss with respect to
``lp`` (it is what makes the sum with ``log_softmax``'s backward the logits' gradient), so the
forward carries it for autograd above it too: a term zero in value whose derivative is
``exp(lp)``. An impossible alignment's loss is inf (``ctc_loss`` zeroes it under ``zero_infinity``,
not this op), its gradient NaN, or 0 under ``zero_infinity``, as eager's (above autograd, without
``zero_infinity``, that NaN-or-not gradient of an infinite loss is autograd's, not the kernel's).
``log_alpha``'s entries past each element's input length or extended target are
left uninitialised by the kernel; here they are -inf (the backward reads none of them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ... import _torch_compat as tc


def _lse(*terms: torch.Tensor) -> torch.Tensor:
    """log(sum(exp)) of equal-shaped tensors, -inf where all are (no NaN from -inf - -inf)."""
    peak = terms[0]
    for term in terms[1:]:
        peak = torch.maximum(peak, term)
    finite = torch.isfinite(peak)
    shift = torch.where(finite, peak, torch.zeros_like(peak))
    total = torch.exp(terms[0] - shift)
    for term in terms[1:]:
        total = total + torch.exp(term - shift)
    safe = torch.where(finite, total, torch.ones_like(total))  # its log's derivative stays finite
    return torch.where(finite, torch.log(safe) + shift, peak)


def _extended(targets: torch.Tensor, target_lengths: list[int], blank: int) -> torch.Tensor:
    """(N, 2 max S + 1) labels with blanks around and between; targets 2-D padded or 1-D concatenated."""
    longest = max(target_lengths, default=0)
    if targets.dim() == 1:
        starts = [sum(target_lengths[:i]) for i in range(len(target_lengths))]
        rows = [torch.nn.functional.pad(targets[start:start + length], (0, longest - length), value=blank)
                for start, length in zip(starts, target_lengths)]
        padded = torch.stack(rows) if rows else targets.new_zeros((0, longest))
    else:
        padded = targets[:, :longest]
    n = padded.size(0)
    labels = torch.stack([torch.full_like(padded, blank), padded], -1).reshape(n, 2 * longest)
    return torch.cat([labels, torch.full_like(padded[:, :1], blank)], -1).to(torch.int64)


class _Lattice:
    """What both directions share: per step, the log-probabilities of the extended labels,
    which positions may skip a blank, and which lie inside each element's target."""

    def __init__(self, log_probs: torch.Tensor, targets: torch.Tensor, input_lengths: list[int],
                 target_lengths: list[int], blank: int):
        steps, n, _ = log_probs.shape
        self.labels = _extended(targets, target_lengths, blank)
        width = self.labels.size(1)
        self.emit = log_probs.gather(2, self.labels.unsqueeze(0).expand(steps, n, width))  # (T, N, 2S+1)
        position = torch.arange(width, device=log_probs.device)
        before = torch.cat([self.labels.new_full((n, 2), blank), self.labels[:, :-2]], -1)
        self.skips = (position >= 2) & (self.labels != blank) & (self.labels != before)
        extent = torch.tensor([2 * s + 1 for s in target_lengths], device=log_probs.device).unsqueeze(-1)
        self.inside = position < extent
        self.lengths = torch.tensor(input_lengths, device=log_probs.device)
        self.target_lengths = torch.tensor(target_lengths, device=log_probs.device)
        self.last = extent.squeeze(-1) - 1
        self.none = torch.full_like(self.emit[0], float("-inf"))

    def alphas(self) -> list[torch.Tensor]:
        position = torch.arange(self.labels.size(1), device=self.labels.device)
        start = (position == 0) | ((position == 1) & (self.target_lengths > 0).unsqueeze(-1))
        alpha = torch.where(start, self.emit[0], self.none)
        alphas = [alpha]
        for t in range(1, self.emit.size(0)):
            one = torch.cat([self.none[:, :1], alpha[:, :-1]], -1)
            two = torch.where(self.skips, torch.cat([self.none[:, :2], alpha[:, :-2]], -1), self.none)
            step = torch.where(self.inside, _lse(alpha, one, two) + self.emit[t], self.none)
            alpha = torch.where((t < self.lengths).unsqueeze(-1), step, self.none)
            alphas.append(alpha)
        return alphas

    def betas(self) -> list[torch.Tensor]:
        position = torch.arange(self.labels.size(1), device=self.labels.device)
        last = self.last.unsqueeze(-1)
        end = (position == last) | ((position == last - 1) & (self.target_lengths > 0).unsqueeze(-1))
        beta = self.none
        betas = []
        for t in range(self.emit.size(0) - 1, -1, -1):
            one = torch.cat([beta[:, 1:], self.none[:, :1]], -1)
            two_source = torch.cat([beta[:, 2:], self.none[:, :2]], -1)
            skips_ahead = torch.cat([self.skips[:, 2:], torch.zeros_like(self.skips[:, :2])], -1)
            two = torch.where(skips_ahead, two_source, self.none)
            step = torch.where(self.inside, _lse(beta, one, two) + self.emit[t], self.none)
            first = torch.where(end, self.emit[t], self.none)
            at_end = (self.lengths - 1 == t).unsqueeze(-1)
            beta = torch.where(at_end, first, torch.where((t < self.lengths - 1).unsqueeze(-1), step, self.none))
            betas.append(beta)
        return betas[::-1]

    def nll(self, alphas: list[torch.Tensor]) -> torch.Tensor:
        stacked = torch.stack(alphas, 1)  # (N, T, 2S+1)
        at = (self.lengths - 1).clamp_min(0)
        final = stacked.gather(1, at.view(-1, 1, 1).expand(-1, 1, stacked.size(2))).squeeze(1)
        ends = final.gather(1, self.last.unsqueeze(-1)).squeeze(-1)
        before = final.gather(1, (self.last - 1).clamp_min(0).unsqueeze(-1)).squeeze(-1)
        before = torch.where(self.target_lengths > 0, before, torch.full_like(before, float("-inf")))
        return -_lse(ends, before)


def _lengths(value: Any) -> list[int] | None:
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else None


def ctc_loss(log_probs: torch.Tensor, targets: torch.Tensor, input_lengths: list[int], target_lengths: list[int],
             blank: int = 0, zero_infinity: bool = False) -> Any:
    inputs, labels = _lengths(input_lengths), _lengths(target_lengths)
    if inputs is None or labels is None or log_probs.dim() != 3 or not log_probs.is_floating_point():
        return NotImplemented
    lattice = _Lattice(log_probs, targets, inputs, labels, blank)
    alphas = lattice.alphas()
    # eager's backward adds exp(lp) at every step inside the input: carried for autograd above us
    change = log_probs - log_probs.detach()
    inside = torch.arange(log_probs.size(0), device=log_probs.device).unsqueeze(-1) < lattice.lengths
    loss = lattice.nll(alphas) + (change * torch.exp(log_probs.detach()) * inside.unsqueeze(-1)).sum((0, 2))
    return loss, torch.stack(alphas, 1)


def ctc_loss_backward(grad: torch.Tensor, log_probs: torch.Tensor, targets: torch.Tensor, input_lengths: list[int],
                      target_lengths: list[int], neg_log_likelihood: torch.Tensor, log_alpha: torch.Tensor,
                      blank: int, zero_infinity: bool = False) -> Any:
    inputs, labels = _lengths(input_lengths), _lengths(target_lengths)
    if inputs is None or labels is None or log_probs.dim() != 3:
        return NotImplemented
    lattice = _Lattice(log_probs, targets, inputs, labels, blank)
    alphas = log_alpha.unbind(1)
    betas = lattice.betas()
    steps, n, classes = log_probs.shape
    both = torch.stack([a + b for a, b in zip(alphas, betas)], 0)  # (T, N, 2S+1)
    index = lattice.labels.unsqueeze(0).expand_as(both)
    peak = torch.full((steps, n, classes), float("-inf"), dtype=both.dtype, device=both.device)
    peak = peak.scatter_reduce(2, index, both, "amax")
    finite = torch.isfinite(peak)
    shift = torch.where(finite, peak, torch.zeros_like(peak))
    summed = torch.zeros_like(peak).scatter_add(2, index, torch.exp(both - shift.gather(2, index)))
    per_class = torch.where(finite, torch.log(summed) + shift, peak)
    nll = neg_log_likelihood.view(1, n, 1)
    result = (torch.exp(log_probs) - torch.exp(per_class + nll - log_probs)) * grad.view(1, n, 1)
    inside = (torch.arange(steps, device=log_probs.device).unsqueeze(-1) < lattice.lengths).unsqueeze(-1)
    result = torch.where(inside, result, torch.zeros_like(result))
    if zero_infinity:
        result = torch.where(torch.isinf(nll), torch.zeros_like(result), result)
    return result


DECOMPOSITIONS: dict[Any, Callable] = {
    tc.resolve_overload("aten", "_ctc_loss.default"): ctc_loss,
    tc.resolve_overload("aten", "_ctc_loss_backward.default"): ctc_loss_backward,
}
