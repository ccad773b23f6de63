"""OpInfo samples as training steps (tests/joint/opinfo_steps.py), for the ops whose backward
formulas write through views of their temporaries: ``svd``'s and ``eigh``'s diagonal fill,
``irfft``'s and ``hfft``'s doubled ``narrow``, ``qr``'s halved diagonal, ``pad``'s circular
backward, Householder products. Each was refused (a mutable node left in the program) where
torch's joint paths train it; ``scripts/joint_opinfo.py`` sweeps every differentiable OpInfo.
"""

from __future__ import annotations

import pytest

import predispatch_func as pf
from tests.joint.opinfo_steps import differentiable_ops, ramp_loss, step_of

WRITE_THROUGH_VIEWS = ["svd", "linalg.svd", "linalg.eigh", "fft.irfft", "fft.hfft", "linalg.qr",
                       "linalg.householder_product", "ormqr", "nn.functional.pad.circular", "as_strided_scatter",
                       "nn.functional.linear_cross_entropy.chunked_none"]


@pytest.mark.parametrize("name", WRITE_THROUGH_VIEWS)
def test_backward_writing_through_views_trains_as_eager(name):
    if name not in differentiable_ops():
        pytest.skip(f"this torch's op_db has no {name}")
    model, inputs = step_of(name, 0)
    ep = pf.export_joint(model, inputs, loss_fn=ramp_loss)
    report = pf.verify_joint(ep, model, inputs, loss_fn=ramp_loss, calls=2)
    assert report.ok, report.problems


def test_a_sparse_output_is_compared_by_its_values():
    """``to_sparse``'s output: verify_joint compared it with ``allclose``, which has no sparse kernel."""
    model, inputs = step_of("to_sparse", 0)
    model.process = None  # the sparse tensor itself is the output
    ep = pf.export_joint(model, inputs, loss_fn=ramp_loss)
    report = pf.verify_joint(ep, model, inputs, loss_fn=ramp_loss, calls=2)
    assert report.ok, report.problems


def test_a_saved_sparse_tensor_is_refused_by_name():
    """``to_sparse(x).to_dense()``: autograd saves the sparse tensor for ``to_dense``'s backward,
    which the trace cannot map to a graph value (no storage): refused, saying so (it crashed in
    the saved-value hooks, then blamed torch's control flow)."""
    model, inputs = step_of("to_sparse", 0)  # its OpInfo's processing densifies the result
    with pytest.raises(pf.JointError, match="sparse_coo tensor autograd saved"):
        pf.export_joint(model, inputs, loss_fn=ramp_loss)


@pytest.mark.parametrize("index", [0, 1])
def test_cpu_flash_attention_called_directly_lowers_with_its_logsumexp(index):
    """torch's decomposition of ``_scaled_dot_product_flash_attention_for_cpu`` returns the attention
    weights as its second output; the kernel returns the logsumexp. Lowered with torch's, a direct
    call's program returned the weights, silently (opsets/decompositions/attention.py)."""
    name = "torch.ops.aten._scaled_dot_product_flash_attention_for_cpu"
    if name not in differentiable_ops():
        pytest.skip(f"this torch's op_db has no {name}")
    model, inputs = step_of(name, index)
    core = pf.OpSet.core_aten()
    ep = pf.export_joint(model, inputs, loss_fn=ramp_loss, target=core)
    report = pf.verify_joint(ep, model, inputs, loss_fn=ramp_loss, calls=2, target=core)
    assert report.ok, report.problems
