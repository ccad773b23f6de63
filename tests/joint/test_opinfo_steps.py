"""OpInfo samples as training steps (tests/joint/opinfo_steps.py), for the ops whose backward
formulas write through views of their temporaries: ``svd``'s and ``eigh``'s diagonal fill,
``irfft``'s and ``hfft``'s doubled ``narrow``, ``qr``'s halved diagonal, ``pad``'s circular
backward, Householder products. Each was refused (a mutable node left in the program) where
torch's joint paths train it; ``scripts/joint_opinfo.py`` sweeps every differentiable OpInfo.
"""

from __future__ import annotations

import copy

import pytest

import predispatch_func as pf
from tests.joint.opinfo_steps import differentiable_ops, ramp_loss, step_of
from tests.support.torch_release import torch_release

# the chunked ``linear_cross_entropy`` (torch 2.13 on) keeps the gradients it computes in forward
# on its autograd ctx (detached outputs, not saved tensors): its backward reads them by storage
UNSAVED_CTX_VALUES = ["nn.functional.linear_cross_entropy.chunked"]
WRITE_THROUGH_VIEWS = ["svd", "linalg.svd", "linalg.eigh", "fft.irfft", "fft.hfft", "linalg.qr",
                       "linalg.householder_product", "ormqr", "nn.functional.pad.circular", "as_strided_scatter",
                       "nn.functional.linear_cross_entropy.chunked_none"]


@pytest.mark.parametrize("name", WRITE_THROUGH_VIEWS + UNSAVED_CTX_VALUES)
def test_backward_formula_a_plain_trace_could_not_carry_trains_as_eager(name):
    """Each was refused where torch's joint paths train it: a backward writing through views of its
    temporaries (a mutable node left in the program), or reading values its op kept on its ctx
    below the recording level (read now as the graph value in the same storage and layout)."""
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


# Every differentiable OpInfo's first float64 sample as a training step (``deep``: about 1,000
# programs). What export_joint refuses there, with the refusal it must give; torch's joint paths
# refuse these too or keep ops outside Core ATen (scripts/joint_opinfo.py compares), except where
# op_db's wrapper seeds the RNG in forward, a program's refusal by design (docs/joint.md, RNG).
# Pinned on torch 2.15.0's op_db.
_SEEDS = "called torch.manual_seed in forward"
_UNLOWERABLE = "cannot lower .* into the target op set"
_EFFECT_TOKEN = "Could not find a token for effect"  # torch's export of _linalg_check_errors, torch.export's too
REFUSED: dict[str, dict[str, str]] = {
    "plain": {
        "bernoulli": _SEEDS, "normal": _SEEDS, "nn.functional.rrelu": _SEEDS, "pca_lowrank": _SEEDS,
        "svd_lowrank": _SEEDS, "nn.functional.fractional_max_pool2d": _SEEDS,
        "nn.functional.fractional_max_pool3d": _SEEDS, "nn.functional.multi_head_attention_forward": _SEEDS,
        "corrcoef": "DataDependentOutputException", "cov": "DataDependentOutputException",
        "linalg.lstsq": "DynamicOutputShapeException", "linalg.lstsq.grad_oriented": "DynamicOutputShapeException",
        "nn.functional.ctc_loss": "DynamicOutputShapeException",
        "masked_select": "data-dependent expression", "tensor_split": "data-dependent expression",
        "nn.functional.gaussian_nll_loss": "data-dependent expression",
        # torch's joint paths train this one (Known gaps in docs/joint.md)
        "to_sparse": "sparse_coo tensor autograd saved",
    },
}
REFUSED["core_aten"] = {
    **{name: why for name, why in REFUSED["plain"].items() if name not in (
        "nn.functional.ctc_loss", "to_sparse")},
    **{name: _UNLOWERABLE for name in (
        "fft.hfft", "fft.hfft2", "fft.hfftn", "fft.irfft", "fft.irfft2", "fft.irfftn",
        "linalg.eig", "masked_scatter", "matrix_exp", "nn.functional.linear_cross_entropy.chunked",
        "nn.functional.linear_cross_entropy.chunked_none", "polygamma.polygamma_n_0", "polygamma.polygamma_n_1",
        "polygamma.polygamma_n_2", "polygamma.polygamma_n_3", "polygamma.polygamma_n_4",
        "special.polygamma.special_polygamma_n_0", "to_sparse")},
    **{name: _EFFECT_TOKEN for name in (
        "linalg.cholesky", "linalg.inv", "linalg.lu_factor", "linalg.solve", "linalg.tensorinv", "linalg.tensorsolve")},
}
DIFFERS = {"core_aten": {
    "as_strided_scatter": "eager's derivative gives self the gradient on the positions src overwrote; the "
                          "decomposition's is the definition's (tests/opsets/test_decompositions.py)",
}}


def _every_opinfo() -> list[str]:
    return sorted(differentiable_ops()) if torch_release() >= (2, 15) else []


@pytest.mark.deep
@pytest.mark.parametrize("target", ["plain", "core_aten"])
@pytest.mark.parametrize("name", _every_opinfo())
def test_every_differentiable_opinfo_trains_as_eager_or_is_refused_by_name(name, target, request):
    try:
        step = step_of(name, 0)
    except Exception as exc:  # noqa: BLE001 (op_db's own sample generator)
        pytest.skip(f"{name}'s samples cannot be drawn: {type(exc).__name__}: {str(exc)[:120]}")
    if step is None:
        pytest.skip(f"{name} has no float64 sample")
    model, inputs = step
    if not list(model.parameters()):
        pytest.skip(f"{name}'s sample has no differentiable input")
    try:
        twin = copy.deepcopy(model)
        for _ in range(2):
            ramp_loss(twin(*inputs)).backward()
    except Exception as exc:  # noqa: BLE001 (eager itself: no reference to compare with)
        pytest.skip(f"eager cannot run two steps of {name}: {type(exc).__name__}: {str(exc)[:120]}")
    core = pf.OpSet.core_aten() if target == "core_aten" else None
    refused = REFUSED[target].get(name)
    if refused is not None:
        with pytest.raises(Exception, match=refused):
            pf.export_joint(model, inputs, loss_fn=ramp_loss, target=core)
        return
    if name in DIFFERS.get(target, {}):
        request.applymarker(pytest.mark.xfail(strict=True, reason=DIFFERS[target][name]))
    ep = pf.export_joint(model, inputs, loss_fn=ramp_loss, target=core)
    report = pf.verify_joint(ep, model, inputs, loss_fn=ramp_loss, calls=2, target=core)
    assert report.ok, report.problems
