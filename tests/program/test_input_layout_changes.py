"""In-place layout changes of inputs and buffers (``t_``, ``unsqueeze_``, ``as_strided_``,
``resize_``, ...): a static new layout is carried, ``ep.module()`` giving the input eager's
layout before writing it back; a symbolic new layout has no write-back and is refused."""

import os

import pytest
import torch
import torch.nn.functional as F
from expecttest import TestCase
from torch import nn

import predispatch_func as pf
from tests.support.conformance_judge import assert_ok
from tests.support.expect_refusal import at_line, refused


class TestMetadataMutationOfInputs(TestCase):
    """Static layout changes are carried (below); a symbolic
    new layout has no write-back."""

    def test_t_inplace_on_dynamic_input_is_refused(self):
        class M(nn.Module):
            def forward(self, x):
                x.t_()
                return x + 1

        with refused(pf.Refusal.INPUT_METADATA_MUTATION, r"in-place metadata[\s\S]*aten\.t_\.default[\s\S]*"
                                    + at_line(__file__, r"x\.t_\(\)")):
            pf.export(M(), (torch.randn(2, 3),), dynamic_shapes=({0: torch.export.Dim("a"), 1: torch.export.Dim("b")},))

    def test_unsqueeze_inplace_on_dynamic_input_is_refused(self):
        class M(nn.Module):
            def forward(self, x):
                y = x * 2
                x.unsqueeze_(0)
                return y

        with refused(pf.Refusal.INPUT_METADATA_MUTATION, r"aten\.unsqueeze_\.default[\s\S]*"
                                    + at_line(__file__, r"x\.unsqueeze_\(0\)")):
            pf.export(M(), (torch.randn(3),), dynamic_shapes=({0: torch.export.Dim("n")},))


class RandnIntoOut(torch.nn.Module):
    def forward(self, x, o):
        torch.randn(3, 4, out=o)
        return o * x


class Dropout3dUnbatched(torch.nn.Module):
    def forward(self, x):
        return F.dropout3d(x, 0.5, training=True, inplace=True) * 2


class TransposeOneD(torch.nn.Module):
    def forward(self, x):
        x.t_()
        x.mul_(2)
        return x + 1


class UnsqueezeInput(torch.nn.Module):
    def forward(self, x):
        x.unsqueeze_(0)
        return x * 2


@pytest.mark.parametrize("model, args", [
    (RandnIntoOut(), (torch.randn(3, 4), torch.zeros(3, 4))),
    (Dropout3dUnbatched(), (torch.randn(2, 3, 4, 5),)),
    (TransposeOneD(), (torch.randn(5),)),
], ids=["randn_out_same_shape", "dropout3d_unbatched", "t_of_1d"])
def test_in_place_view_op_that_leaves_the_input_layout_exports(model, args):
    """In-place view ops on an input are refused only if the input's layout differs
    at the end (these were refused although nothing changes)."""
    assert_ok(model, args)


_RELAYOUTS = {  # name -> (in-place view op and then a write, input)
    "t_": (lambda x: x.t_().mul_(2), torch.randn(3, 4)),
    "transpose_": (lambda x: x.transpose_(0, 2), torch.randn(2, 3, 4)),
    "swapdims_": (lambda x: x.swapdims_(0, 1).add_(1), torch.randn(2, 3)),
    "squeeze_": (lambda x: x.squeeze_(), torch.randn(1, 3, 1, 2)),
    "unsqueeze_": (lambda x: x.unsqueeze_(1), torch.randn(3, 2)),
    "as_strided_": (lambda x: x.as_strided_((2, 2), (1, 3), 1), torch.randn(3, 3)),
    "resize_shrink": (lambda x: x.resize_(2, 3), torch.randn(4, 3)),
    "t_twice_then_unsqueeze_": (lambda x: x.t_().t_().unsqueeze_(0), torch.randn(3, 4)),
}


class RelayoutInput(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x, y):
        self.fn(x)
        return x * 2, y + 1


class RelayoutBuffer(RelayoutInput):
    def __init__(self, fn, buf):
        super().__init__(fn)
        self.register_buffer("buf", buf)

    def forward(self, y):
        self.fn(self.buf)
        return self.buf * y.sum()


def _layout(t: torch.Tensor) -> tuple:
    return tuple(t.shape), t.stride(), t.storage_offset(), t.untyped_storage().nbytes()


@pytest.mark.parametrize("name", sorted(_RELAYOUTS))
def test_in_place_layout_change_of_an_input_is_carried(name):
    """``x.t_()``, ``squeeze_``, ``as_strided_``, ``resize_`` ... on an input: the new value
    is a mutation output and ``ep.module()`` gives the input eager's layout (sizes,
    strides, offset, storage size) before writing it back (was refused)."""
    import predispatch_func as pf

    fn, x = _RELAYOUTS[name]
    model = RelayoutInput(fn)
    grad_ok = not name.startswith("resize")  # eager cannot resize a tensor that requires grad
    assert_ok(model, (x, torch.randn(3)), check_grads=grad_ok)
    eager_x, program_x = x.clone(), x.clone()
    program = pf.export(model, (x, torch.randn(3))).module()
    y = torch.randn(3)
    expected = model(eager_x, y)
    got = program(program_x, y)
    assert _layout(program_x) == _layout(eager_x)
    assert torch.equal(program_x, eager_x) and torch.equal(got[0], expected[0])
    with pytest.raises((RuntimeError, AssertionError), match="changes the layout|Guard failed"):
        program(program_x, y)  # the program was computed for the exported layout


@pytest.mark.parametrize("name", sorted(_RELAYOUTS))
def test_in_place_layout_change_of_a_buffer_is_carried(name):
    import predispatch_func as pf

    fn, x = _RELAYOUTS[name]
    model = RelayoutBuffer(fn, x.clone())
    assert_ok(model, (torch.randn(3),))
    program = pf.export(model, (torch.randn(3),)).module()
    y = torch.randn(3)
    eager = RelayoutBuffer(fn, x.clone())
    expected, got = eager(y), program(y)
    assert _layout(program.buf) == _layout(eager.buf)
    assert torch.equal(got, expected)
    with pytest.raises(RuntimeError, match="changes the layout of an input or buffer in place"):
        program(y)


def test_in_place_layout_change_to_a_symbolic_layout_is_refused():
    import predispatch_func as pf

    x = torch.randn(5, 3)
    with pytest.raises(pf.UnsupportedError, match="symbolic layout") as info:
        pf.export(UnsqueezeInput(), (x,), dynamic_shapes=({0: torch.export.Dim("n")},))
    assert "unsqueeze_" in str(info.value) and os.path.basename(__file__) in str(info.value)
    assert info.value.kind is pf.Refusal.INPUT_METADATA_MUTATION
