"""Writes to user inputs that share memory (``f(x, x)``, ``f(x, x[1:])``): carried through a
synthetic base (program/aliased_inputs.py), each program replayed against eager with the
caller's aliasing (outputs, written-back inputs, gradients)."""

import pytest
import torch
from torch import nn

import predispatch_func as pf
from tests.support.expect_refusal import refused
from tests.support.oracle import export_checked


def _r(*shape):
    return torch.randn(*shape)


# --- generator: alias shapes x how the model writes and reads them ----------------------------

def _same_twice(base):
    return base, base


def _view_and_base(base):
    return base, base[1:]


def _base_and_view(base):
    return base[2:], base


def _overlapping_views(base):
    return base[:4], base[2:]


def _strided_views(base):
    return base[::2], base[:5]


def _transposed_twice(base):
    b = base.view(2, 3)
    return b, b.t()


ALIAS_SHAPES = {
    "same_tensor_twice": (6, _same_twice),
    "a_view_and_its_base": (6, _view_and_base),
    "its_base_and_a_view": (6, _base_and_view),
    "two_overlapping_views": (6, _overlapping_views),
    "strided_views": (6, _strided_views),
    "transposed_view": (6, _transposed_twice),
}


class WriteFirstReadSecond(nn.Module):
    def forward(self, a, b):
        a.mul_(2)
        return b * 3


class WriteSecondReadBoth(nn.Module):
    def forward(self, a, b):
        b.add_(1)
        return a.sum() + b.sum()


class WriteBothReturnOne(nn.Module):
    def forward(self, a, b):
        a.add_(1)
        b.mul_(2)
        return a


class WriteUnderNoGrad(nn.Module):
    def forward(self, a, b):
        with torch.no_grad():
            a.add_(1)
        return (b * b).sum()


class WriteThroughSlice(nn.Module):
    def forward(self, a, b):
        a.reshape(-1)[0:1].fill_(5.0)
        return b.exp()


BODIES = {cls.__name__: cls for cls in (WriteFirstReadSecond, WriteSecondReadBoth, WriteBothReturnOne,
                                         WriteUnderNoGrad, WriteThroughSlice)}


@pytest.mark.parametrize("shape", sorted(ALIAS_SHAPES))
@pytest.mark.parametrize("body", sorted(BODIES))
@pytest.mark.parametrize("with_grad", [False, True], ids=["plain", "grad"])
def test_write_through_one_aliased_input_read_through_another(shape, body, with_grad):
    """verify replays with the caller's aliasing and float inputs requiring grad (an activation's
    views); here also by hand: outputs, the shared memory after the call, the gradient reaching it."""
    numel, make = ALIAS_SHAPES[shape]
    base = _r(numel)
    if with_grad:  # exported over an activation that requires grad (export_checked deep-copies leaves only)
        ep = pf.export(BODIES[body](), make(base.requires_grad_().clone()))
        pf.verify(ep, BODIES[body](), make(base.detach().clone()), raise_on_failure=True)
    else:
        ep = export_checked(BODIES[body](), make(base))
    results = []
    for fn in (BODIES[body](), ep.module()):
        leaf = base.detach().clone().requires_grad_()
        memory = leaf.clone()
        out = fn(*make(memory))
        (out * torch.arange(out.numel()).view(out.shape)).sum().backward()
        results.append((out.detach(), memory.detach(), leaf.grad))
    torch.testing.assert_close(results[1], results[0])


def test_same_tensor_twice_is_one_placeholder_read():
    class M(nn.Module):
        def forward(self, x, y):
            x.add_(1)
            return y * 2

    x = _r(3)
    ep = export_checked(M(), (x, x))
    assert [(s.kind.name, s.target) for s in ep.graph_signature.output_specs][:2] == [
        ("USER_INPUT_MUTATION", "x"), ("USER_INPUT_MUTATION", "y")]
    assert "as_strided_scatter" not in ep.graph_module.code  # one layout: no synthetic base


def test_unwritten_aliased_views_are_traced_apart():
    """No write, no synthetic base: the program reads each input as it is and runs on any aliasing."""
    class M(nn.Module):
        def forward(self, a, b):
            return a[1:] * b

    x = _r(6)
    ep = export_checked(M(), (x, x[1:]))
    assert "zeros" not in ep.graph_module.code
    a, b = _r(6), _r(5)
    torch.testing.assert_close(ep.module()(a, b), a[1:] * b)


def test_program_refuses_other_aliasing_at_run_time():
    x = _r(6)
    ep = pf.export(WriteFirstReadSecond(), (x, x[1:]))
    with pytest.raises(RuntimeError, match=r"exported with inputs a, b sharing memory[\s\S]*do not share memory"):
        ep.module()(_r(6), _r(5))
    with pytest.raises(RuntimeError, match=r"exported with inputs a, b sharing memory"):
        ep.module()(x, x[2:])


def test_aliased_inputs_in_a_pytree_and_a_kwarg():
    class M(nn.Module):
        def forward(self, pair, *, scale):
            pair[0][:2].mul_(scale[0])
            return pair[1] + 1

    x = _r(4)
    export_checked(M(), ((x, x[1:3]),), {"scale": x[3:]})


def test_parameter_passed_as_an_aliased_input_is_refused():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(_r(3))

        def forward(self, x):
            with torch.no_grad():
                x.add_(1)
            return x * self.w

    m = M()
    with refused(pf.Refusal.WRITE_TO_ALIASED_INPUTS, r"'w', 'x'[\s\S]*parameter, buffer or constant"):
        pf.export(m, (m.w,))


def test_aliased_inputs_of_different_dtypes_are_refused():
    class M(nn.Module):
        def forward(self, a, b):
            a.add_(1)
            return b + 1

    x = _r(4)
    with refused(pf.Refusal.WRITE_TO_ALIASED_INPUTS, r"'a', 'b'[\s\S]*different dtypes"):
        pf.export(M(), (x, x.view(torch.int32)))


def test_torch_as_strided_scatter_gradient_of_self_is_wrong():
    """Why a synthetic base is read through narrow/view/select/permute and never ``as_strided``:
    functionalization writes through an ``as_strided`` view with ``as_strided_scatter``, whose
    gradient for ``self`` torch computes with the mask inverted (2.11 to 2.15). When this fails,
    torch fixed it and ``aliased_inputs.view_plan`` may read any layout with ``as_strided``."""
    a = torch.randn(6, dtype=torch.double, requires_grad=True)
    b = torch.randn(5, dtype=torch.double, requires_grad=True)
    assert not torch.autograd.gradcheck(lambda a, b: torch.as_strided_scatter(a, b, [5], [1], 1), (a, b),
                                        raise_exception=False)


@pytest.mark.parametrize("geometry", [((6,), (1,), 0), ((3,), (2,), 1), ((2, 3), (3, 1), 0), ((3, 2), (1, 3), 0),
                                      ((2, 1, 2), (4, 1, 1), 1), ((0,), (1,), 2)])
def test_view_plan_reads_the_layout_it_was_given(geometry):
    from predispatch_func.program.aliased_inputs import read_view, view_plan

    sizes, strides, offset = geometry
    memory = torch.arange(16.0)
    expected = memory.as_strided(sizes, strides, offset)
    got = read_view(memory, view_plan(geometry))
    assert got.shape == expected.shape and torch.equal(got, expected)
    assert got.untyped_storage().data_ptr() == memory.untyped_storage().data_ptr()


def test_view_plan_refuses_strides_that_do_not_nest():
    from predispatch_func.program.aliased_inputs import view_plan

    assert view_plan(((2, 2), (3, 2), 0)) is None
    assert view_plan(((4,), (0,), 0)) is None
