"""The global RNG reseeded in forward (OpInfo's ``wrapper_set_seed``): refused where a draw
follows (the program cannot carry a reseed; RNG_STATE_SET) or the reseed outlives forward,
exported where nothing is drawn after it; a refused export leaves the caller's RNG state.

Found by the conformance runner (scripts/conformance.py), judged as it judges (tests/support/conformance_judge.py).
"""

from __future__ import annotations

import pytest
import torch
from torch.testing._internal.common_utils import freeze_rng_state

from tests.support.conformance_judge import assert_ok


class ReseedsInForward(torch.nn.Module):
    """OpInfo's ``wrapper_set_seed``: eager draws from seed 42 on every call."""

    def forward(self, x):
        with freeze_rng_state():
            torch.manual_seed(42)
            return torch.normal(x, 1.0)


class RestoresTheRngItDidNotChange(torch.nn.Module):
    """cond's dynamo capture saves and restores the RNG state: no refusal."""

    def forward(self, x):
        with torch.random.fork_rng():
            y = torch.cond(x.sum() > 0, lambda t: t.sin(), lambda t: t.cos(), (x,))
        return y + torch.rand_like(x)


def test_manual_seed_in_forward_is_refused():
    """Both exporters' programs drew from the caller's RNG state (20 OpInfo random ops,
    silently wrong); the program cannot carry a reseed, so it is refused."""
    import predispatch_func as pf

    x = torch.randn(3)
    rng = torch.get_rng_state()
    with pytest.raises(pf.UnsupportedError, match=r"torch\.manual_seed[\s\S]*torch\.manual_seed\(42\)") as info:
        pf.export(ReseedsInForward(), (x,))
    assert info.value.kind is pf.Refusal.RNG_STATE_SET
    assert torch.equal(rng, torch.get_rng_state()), "the refused export moved the caller's RNG state"


class ReseedsThenDrawsNothing(torch.nn.Module):
    """OpInfo's dropout samples in eval: reseeded and restored, nothing drawn."""

    def forward(self, x):
        with freeze_rng_state():
            torch.manual_seed(42)
            return torch.nn.functional.dropout(x, 0.5, training=False) * 2


class ReseedsAndLeavesItSo(torch.nn.Module):
    def forward(self, x):
        torch.manual_seed(0)
        return x * 2


@pytest.mark.parametrize("model_cls", [RestoresTheRngItDidNotChange, ReseedsThenDrawsNothing])
def test_rng_state_set_without_a_draw_after_it_exports(model_cls):
    assert_ok(model_cls(), (torch.randn(3),))


def test_reseed_left_in_place_when_forward_returns_is_refused():
    import predispatch_func as pf

    with pytest.raises(pf.UnsupportedError, match=r"leaves the global RNG reseeded[\s\S]*manual_seed\(0\)") as info:
        pf.export(ReseedsAndLeavesItSo(), (torch.randn(3),))
    assert info.value.kind is pf.Refusal.RNG_STATE_SET


class ReseedsThenAttendsWithoutDropout(torch.nn.Module):
    """OpInfo's attention samples: ``dropout_p=0`` draws nothing."""

    def forward(self, q):
        with freeze_rng_state():
            torch.manual_seed(42)
            return torch.nn.functional.scaled_dot_product_attention(q, q, q, dropout_p=0.0)


class ReseedsThenRunsRReLUInEval(torch.nn.Module):
    """rrelu's ``training`` left at its schema default (False): nothing is drawn."""

    def forward(self, x):
        with freeze_rng_state():
            torch.manual_seed(42)
            return torch.rrelu(x, 0.1, 0.3) * 2


@pytest.mark.parametrize("model_cls,shape", [(ReseedsThenRunsRReLUInEval, (3,)),
                                             (ReseedsThenAttendsWithoutDropout, (1, 2, 4, 8))])
def test_reseed_before_a_random_op_that_draws_nothing_exports(model_cls, shape):
    assert_ok(model_cls(), (torch.randn(shape),))
