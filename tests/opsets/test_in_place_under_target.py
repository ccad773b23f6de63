"""Every in-place op of a scan (elementwise, indexing, activations with ``inplace=True``) written
inside a model and exported with ``target=core_aten``: each exports and equals eager, or is refused
with a clear error for a reason listed here. Six of them were once refused as "a constant with no
value" (a factory result the tracer never saw: lerp_, index_fill_, hypot_, ldexp_, i0_, nextafter_;
tests/opsets/test_lowering_refusals.py)."""

import pytest
import torch

import predispatch_func as pf

WRITES = {
    "lerp_": lambda x, y: x.lerp_(y, 0.1),
    "addcdiv_": lambda x, y: x.addcdiv_(y, y.abs() + 1, value=0.5),
    "hardswish_": lambda x, y: torch.nn.functional.hardswish(x, inplace=True),
    "logit_": lambda x, y: x.sigmoid().logit_(),
    "nan_to_num_": lambda x, y: x.nan_to_num_(),
    "clamp_": lambda x, y: x.clamp_(min=0),
    "index_fill_": lambda x, y: x.index_fill_(0, torch.tensor([1]), 1.0),
    "masked_fill_": lambda x, y: x.masked_fill_(y > 0, 1.0),
    "heaviside_": lambda x, y: x.heaviside_(y),
    "xlogy_": lambda x, y: x.abs().xlogy_(2.0),
    "copysign_": lambda x, y: x.copysign_(1.0),
    "fmod_": lambda x, y: x.fmod_(2.0),
    "remainder_": lambda x, y: x.remainder_(2.0),
    "fill_diagonal_": lambda x, y: x.view(2, 2).fill_diagonal_(1.0),
    "renorm_": lambda x, y: x.view(2, 2).renorm_(2, 0, 1.0),
    "rad2deg_": lambda x, y: x.rad2deg_(),
    "threshold_": lambda x, y: torch.nn.functional.threshold(x, 0.1, 2.0, inplace=True),
    "elu_": lambda x, y: torch.nn.functional.elu(x, inplace=True),
    "leaky_relu_": lambda x, y: torch.nn.functional.leaky_relu(x, 0.1, inplace=True),
    "hardtanh_": lambda x, y: torch.nn.functional.hardtanh(x, inplace=True),
    "addcmul_": lambda x, y: x.addcmul_(y, y, value=0.5),
    "mul_": lambda x, y: x.mul_(0.5),
    "add_alpha": lambda x, y: x.add_(y, alpha=0.3),
    "sub_": lambda x, y: x.sub_(y, alpha=2),
    "pow_": lambda x, y: x.abs().pow_(1.5),
    "div_trunc": lambda x, y: x.div_(2.0, rounding_mode="trunc"),
    "logaddexp": lambda x, y: x.copy_(torch.logaddexp(x, y)),
    "celu_": lambda x, y: torch.nn.functional.celu(x, inplace=True),
    "rrelu_eval": lambda x, y: torch.nn.functional.rrelu(x, training=False, inplace=True),
    "silu_": lambda x, y: torch.nn.functional.silu(x, inplace=True),
    "mish_": lambda x, y: torch.nn.functional.mish(x, inplace=True),
    "hardsigmoid_": lambda x, y: torch.nn.functional.hardsigmoid(x, inplace=True),
    "selu_": lambda x, y: torch.nn.functional.selu(x, inplace=True),
    "square_": lambda x, y: x.square_(),
    "sgn_": lambda x, y: x.sgn_(),
    "floor_divide_": lambda x, y: x.floor_divide_(2.0),
    "clamp_tensor": lambda x, y: x.clamp_(min=y),
    "addmm_": lambda x, y: x.view(2, 2).addmm_(y.view(2, 2), y.view(2, 2), beta=0.5),
    "sinc_": lambda x, y: x.sinc_(),
    "ldexp_": lambda x, y: x.ldexp_(torch.tensor([1, 2, 0, 1])),
    "xlogy_t": lambda x, y: x.abs().xlogy_(y.abs()),
    "index_add_": lambda x, y: x.index_add_(0, torch.tensor([1, 2]), y[:2], alpha=2),
    "index_copy_": lambda x, y: x.index_copy_(0, torch.tensor([1, 2]), y[:2]),
    "masked_scatter_": lambda x, y: x.masked_scatter_(y > 0, y),
    "put_": lambda x, y: x.put_(torch.tensor([1]), y[:1]),
    "cumsum_": lambda x, y: x.cumsum_(0),
    "mvlgamma_": lambda x, y: x.abs().add_(2).mvlgamma_(1),
    "logit_eps": lambda x, y: x.sigmoid().logit_(1e-6),
    "hardshrink": lambda x, y: x.copy_(torch.nn.functional.hardshrink(x)),
    "softshrink": lambda x, y: x.copy_(torch.nn.functional.softshrink(x)),
    "nan_to_num_args": lambda x, y: x.nan_to_num_(nan=0.0, posinf=1.0, neginf=-1.0),
    "clamp_min_max": lambda x, y: x.clamp_(-0.5, 0.5),
    "frac_": lambda x, y: x.frac_(),
    "trunc_": lambda x, y: x.trunc_(),
    "deg2rad_": lambda x, y: x.deg2rad_(),
    "exp2_": lambda x, y: x.exp2_(),
    "erfinv_": lambda x, y: x.tanh().erfinv_(),
    "i0_": lambda x, y: x.i0_(),
    "digamma_": lambda x, y: x.abs().add_(1).digamma_(),
    "true_divide_": lambda x, y: x.true_divide_(3),
    "bitwise_none": lambda x, y: x.neg_(),
    "sigmoid_": lambda x, y: x.sigmoid_(),
    "hypot_": lambda x, y: x.hypot_(y),
    "igamma_": lambda x, y: x.abs().igamma_(y.abs()),
    "nextafter_": lambda x, y: x.nextafter_(y),
    "logical_not_": lambda x, y: x.copy_(x.logical_not()),
    "where_scalar": lambda x, y: x.copy_(torch.where(y > 0, 1.0, x)),
    "scatter_value": lambda x, y: x.scatter_(0, torch.tensor([1]), 2.0),
    "scatter_reduce_": lambda x, y: x.scatter_reduce_(0, torch.tensor([1, 1]), y[:2], "amax"),
    "index_put_acc": lambda x, y: x.index_put_((torch.tensor([1, 1]),), y[:2], accumulate=True),
    "renorm": lambda x, y: x.copy_(x.view(2, 2).renorm(2, 0, 1.0).view(4)),
}

# refused, each for a reason of its own (not the constant class)
REFUSED = {
    "copysign_": "torch decomposes copysign with a number only into prims",
    "fill_diagonal_": "torch's functionalization cannot write through an as_strided view of a view",
    "rrelu_eval": "rrelu's lowering reads data (the count of non-positive elements), which a program cannot hold",
}


class Writes(torch.nn.Module):
    def __init__(self, write):
        super().__init__()
        self.write = write

    def forward(self, x, y):
        x = x * 1
        self.write(x, y)
        return x


@pytest.mark.parametrize("name", sorted(WRITES))
def test_in_place_op_under_core_aten(name):
    model = Writes(WRITES[name])
    torch.manual_seed(0)
    args = (torch.randn(4), torch.randn(4))
    if name in REFUSED:
        with pytest.raises(pf.ExportError):
            pf.export(model, args, target=pf.OpSet.core_aten())
        return
    ep = pf.export(model, args, target=pf.OpSet.core_aten())
    report = pf.verify(ep, model, args)
    assert report.ok, report
