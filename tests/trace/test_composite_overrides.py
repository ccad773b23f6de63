"""``composite_overrides``: what a key may be, and bad keys refused. A key torch's op table did not
know (an OpOverload object, a typo, an op named without its overload) was ignored silently: the
program kept what the user asked to decompose."""

from __future__ import annotations

import pytest
import torch

import predispatch_func as pf
from tests.support.reference import call_targets, export_checked


def _linear():
    torch.manual_seed(0)
    return torch.nn.Linear(3, 4), (torch.randn(2, 3),)


@pytest.mark.parametrize("key", ["aten.linear.default", "aten::linear.default", "aten.linear",
                                 torch.ops.aten.linear.default, torch.ops.aten.linear],
                         ids=["name", "schema name", "op name", "overload", "packet"])
def test_every_way_of_naming_the_op_decomposes_it(key):
    model, args = _linear()
    ep = export_checked(model, args, composite_overrides={key: "decompose"})
    assert "aten.linear.default" not in call_targets(ep)


@pytest.mark.parametrize("key", ["aten.lnear.default", "aten.linear.nosuchoverload", "aten.nosuchop", 3])
def test_a_key_naming_no_op_is_refused_naming_it(key):
    model, args = _linear()
    with pytest.raises(ValueError, match=rf"composite_overrides: {key!r} names no op torch knows"):
        pf.export(model, args, composite_overrides={key: "decompose"})


def test_a_decision_other_than_keep_or_decompose_is_refused_naming_it():
    model, args = _linear()
    with pytest.raises(ValueError, match=r"composite_overrides\['aten.linear.default'\] = 'decomp': the decision is"):
        pf.export(model, args, composite_overrides={"aten.linear.default": "decomp"})
