"""target= over the whole joint program: forward and backward ops inside the op set."""

from __future__ import annotations

import copy

import pytest

import predispatch_func as pf
from tests.joint.cases import CASES, case_params
from tests.joint.reference import export_joint_checked

# The forward program of these already differs from eager under target=core_aten (pf.export +
# pf.verify, on main): bf16 autocast blocks lowered op by op round differently. The joint program
# inherits it; strict, so a fix shows. (issue_41_repro's no_grad lerp_ EMA update was refused here
# until lerp with a number weight got a lowering of ours.)
FORWARD_TARGET_DIFFERS = {
    "autocast_bf16_block": "forward export with target=core_aten: bf16 autocast lowered op by op, grads differ",
    "nested_regions": "forward export with target=core_aten: bf16 autocast lowered op by op, grads differ",
}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=FORWARD_TARGET_DIFFERS[n]))
                                  if n in FORWARD_TARGET_DIFFERS else case_params([n])[0] for n in CASES])
def test_core_aten_joint_program_equals_eager(name):
    model, args, kwargs, loss_fn = CASES[name].build()
    export_joint_checked(model, args, kwargs, loss_fn=loss_fn, target=pf.OpSet.core_aten())


@pytest.mark.parametrize("name", list(FORWARD_TARGET_DIFFERS))
def test_those_forward_programs_differ_too(name):
    """The xfails above are the forward's: its own program under the target differs from eager."""
    model, args, kwargs, _ = CASES[name].build()
    reference = copy.deepcopy(model)
    ep = pf.export(model, args, kwargs, target=pf.OpSet.core_aten())
    assert not pf.verify(ep, reference, args, kwargs, calls=2).ok
