"""Dynamic batch and sequence on decoder LLMs: one program, correct at other sizes.

The program is exported once with ``torch.export.Dim`` for batch and sequence,
then replayed against the reference (outputs and gradients) at sizes it was not
traced with. Toy modules pin down the Dim semantics: shared names are one
symbol, declared ranges become ``range_constraints`` and runtime guards, and a
model that specialises a declared dim is refused.
"""

import pytest
import torch
from torch.export import Dim

import predispatch_func as pf
from tests.models.corpus import CASES, _ids, build
from tests.support.expect_refusal import refused
from tests.support.reference import export_checked

_LLMS = [name for name, case in CASES.items() if case.decoder_llm]
_OTHER_SIZES = [(3, 5), (1, 16)]


def _dynamic_llm_replays_at_other_sizes(name: str) -> None:
    model, args, kwargs = build(name)
    batch, seq = Dim("batch", min=1, max=8), Dim("seq", min=2, max=32)
    ep = export_checked(model, args, kwargs,
                        dynamic_shapes={"input_ids": {0: batch, 1: seq}})
    ids = next(n for n in ep.graph.nodes if n.op == "placeholder" and n.name == "input_ids")
    b_sym, s_sym = (s.node.expr for s in ids.meta["val"].shape)
    assert (ep.range_constraints[b_sym].lower, ep.range_constraints[b_sym].upper) == (1, 8)
    assert (ep.range_constraints[s_sym].lower, ep.range_constraints[s_sym].upper) == (2, 32)
    for b, s in _OTHER_SIZES:
        pf.verify(ep, model, (_ids(b, s, seed=b * 100 + s),), kwargs, raise_on_failure=True)


def test_gpt2_dynamic_batch_and_sequence():
    _dynamic_llm_replays_at_other_sizes("gpt2")


@pytest.mark.models
@pytest.mark.parametrize("name", _LLMS)
def test_decoder_llm_dynamic_batch_and_sequence(name):
    _dynamic_llm_replays_at_other_sizes(name)


class Add(torch.nn.Module):
    def forward(self, x, y):
        return x + y


def test_shared_dim_name_is_one_symbol_and_a_runtime_guard():
    b = Dim("b", min=1, max=8)
    ep = export_checked(Add(), (torch.randn(2, 3), torch.randn(2, 3)),
                        dynamic_shapes={"x": {0: b}, "y": {0: b}})
    x, y = (n.meta["val"] for n in ep.graph.nodes if n.op == "placeholder")
    assert x.shape[0].node.expr == y.shape[0].node.expr
    assert list(ep.range_constraints.values())[0].upper == 8
    out = ep.module()(torch.ones(5, 3), torch.ones(5, 3))
    assert torch.equal(out, torch.full((5, 3), 2.0))
    with pytest.raises(AssertionError, match=r"y.size\(\)\[0\] == x.size\(\)\[0\]"):
        ep.module()(torch.ones(5, 3), torch.ones(4, 3))
    with pytest.raises(AssertionError, match=r"<= 8"):
        ep.module()(torch.ones(9, 3), torch.ones(9, 3))


def test_declared_dim_that_the_model_specialises_is_refused():
    class FixedView(torch.nn.Module):
        def forward(self, x):
            return x.view(2, 3) * 2

    with refused(pf.Refusal.DIM_NOT_DYNAMIC, r"You marked b as dynamic but your code specialized it to be a constant \(2\)"):
        pf.export(FixedView(), (torch.randn(2, 3),), dynamic_shapes={"x": {0: Dim("b")}})


def test_dim_auto_may_be_specialised_but_dim_dynamic_may_not():
    class FixedView(torch.nn.Module):
        def forward(self, x):
            return x.view(2, 3) * 2

    ep = export_checked(FixedView(), (torch.randn(2, 3),), dynamic_shapes={"x": {0: Dim.AUTO}})
    assert not ep.range_constraints
    with refused(pf.Refusal.DIM_NOT_DYNAMIC, r"specialized it to be a constant \(2\)"):
        pf.export(FixedView(), (torch.randn(2, 3),), dynamic_shapes={"x": {0: Dim.DYNAMIC}})


def test_declared_range_wider_than_the_model_allows_is_refused():
    class AtMostFour(torch.nn.Module):
        def forward(self, x):
            torch._check(x.shape[0] <= 4)
            return x * 2

    with refused(pf.Refusal.DIM_NOT_DYNAMIC, r"b \(user input 0, dim 0\).*only supports \[2, 4\]"):
        pf.export(AtMostFour(), (torch.randn(2, 3),), dynamic_shapes={"x": {0: Dim("b", max=16)}})


def test_example_outside_declared_range_is_refused():
    with refused(pf.Refusal.DYNAMIC_SHAPES_SPEC, r"9 not in range \[0, 8\] \(outside Dim 'b'\)"):  # torch's words
        pf.export(Add(), (torch.randn(9, 3), torch.randn(9, 3)),
                  dynamic_shapes={"x": {0: Dim("b", max=8)}, "y": {0: Dim("b", max=8)}})
