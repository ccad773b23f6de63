"""Writes to user inputs that share memory (``f(x, x)``, ``f(x, x[1:])``): carried through a
synthetic base (program/aliased_inputs.py), each program replayed against eager with the
caller's aliasing (outputs, written-back inputs, gradients)."""

import pytest
import torch
from expecttest import TestCase
from torch import nn

import predispatch_func as pf
from tests.support.conformance_judge import assert_ok
from tests.support.expect_refusal import refused
from tests.support.reference import export_checked


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


class TransposesOneAliasWritesTheOther(nn.Module):
    """PyTorch's test_input_mutation_aliases_bases_out_of_order, in our words: b and d alias and
    b is written, d relaid; a and c alias, unwritten."""
    def forward(self, a, b, c, d):
        b.add_(1)
        d.t_()
        return a + c + d, b.view(-1)


@pytest.mark.parametrize("with_grad", [False, True], ids=["plain", "grad"])
def test_layout_change_of_one_alias_while_another_is_written(with_grad):
    base1, base2 = _r(2, 2), _r(2, 2)

    def make(b1, b2):
        x1, x2 = b1.add(1), b2.add(1)
        return x1.view(-1), x2.view(-1), x1.view(-1), x2.view(-1)

    if with_grad:
        base1.requires_grad_(), base2.requires_grad_()
    ep = pf.export(TransposesOneAliasWritesTheOther(), make(base1, base2))
    results = []
    for fn in (TransposesOneAliasWritesTheOther(), ep.module()):
        leaves = base1.detach().clone().requires_grad_(), base2.detach().clone().requires_grad_()
        inputs = make(*leaves)
        out = fn(*inputs)
        sum(o.sum() * (k + 1) for k, o in enumerate(out)).backward()
        results.append((out, [(t.shape, t.stride(), t.detach()) for t in inputs], [leaf.grad for leaf in leaves]))
    torch.testing.assert_close(results[1], results[0])


# --- PyTorch's AOTAutograd cases for aliased inputs (test/functorch/test_aotdispatch.py), in our
# words: the same models and input layouts, each replayed against eager with and without grad -----

LEAVES: list[torch.Tensor] = []  # the leaves the last inputs were made from


def _activation(shape, req_grad):
    """A non-leaf, as the originals make them, so the model may write it in place."""
    leaf = torch.ones(*shape, requires_grad=req_grad)
    LEAVES.append(leaf)
    return leaf.add(1)


class AddToFirstReturnSum(nn.Module):  # test_input_mutation_aliases_other_input{,2}
    def forward(self, a, b):
        a.add_(1)
        return a + b


class AddToFirstReturnViewOfSecond(nn.Module):  # test_input_mutation_aliases_and_output_alias
    def forward(self, a, b):
        a.add_(1)
        return b.view(b.shape)


class MulThirdReturnViewOfIt(nn.Module):  # test_input_aliased_with_mutation_output_alias
    def forward(self, a, b, c):
        c.mul_(2)
        return b.add(1), c.view(-1)


class TransposeFirstOnly(nn.Module):  # test_input_metadata_mutation_aliases
    def forward(self, a, b):
        a.t_()
        return a + b


class MulFirstNoneRequireGrad(nn.Module):  # test_input_mutation_aliases_and_none_require_gradients
    def forward(self, a, b, c):
        a.mul_(2)
        return b + 1, c + 1


class AliasEverything(nn.Module):  # test_input_mutation_alias_everything
    def forward(self, a, b, c):
        c.mul_(2)
        b.t_()
        tmp = a + c
        out1 = tmp.view(-1)
        return out1, b.t(), out1.unsqueeze(0)


class TransposeBothArguments(nn.Module):  # test_dupe_arg_torture
    def forward(self, x, y):
        x.t_()
        y.t_()
        return x + y


class WriteFirstReturnThird(nn.Module):  # test_dupe_arg_returned_as_output
    def forward(self, a, b, a_):
        a[0].add_(1)
        return a_


def _same_row_twice(g):
    x = _activation((4, 2), g)
    return x[0], x[0]


def _row_and_its_base(g):
    x = _activation((2, 2), g)
    return x[0], x


def _flat_views_twice(g):
    x = _activation((2, 2), g)
    return x.view(-1), x.view(-1)


def _flat_views_around_another(g):
    x, y = _activation((2, 2), g), _activation((2, 2), g)
    return x.view(-1), y, x.view(-1)


def _none_require_grad(g):
    x = torch.ones(2, 2).add(1)
    c = torch.ones(2, 2, requires_grad=g)
    LEAVES.append(c)
    return x.view(-1), x.view(-1), c


def _everything(g):
    x, y = _activation((2, 2), g), _activation((2, 2), g)
    return x.view(-1), y, x.view(-1)


def _one_tensor_twice(g):
    leaf = torch.randn(3, 3, requires_grad=g)
    LEAVES.append(leaf)
    x = leaf.clone()
    return x, x


def _first_and_third_one_tensor(g):
    a = torch.ones(2)
    return a, torch.ones(2), a


PORTED = {
    "input_mutation_aliases_other_input": (AddToFirstReturnSum, _same_row_twice),
    "input_mutation_aliases_other_input2": (AddToFirstReturnSum, _row_and_its_base),
    "input_mutation_aliases_and_output_alias": (AddToFirstReturnViewOfSecond, _flat_views_twice),
    "input_aliased_with_mutation_output_alias": (MulThirdReturnViewOfIt, _flat_views_around_another),
    "input_metadata_mutation_aliases": (TransposeFirstOnly, _flat_views_twice),
    "input_mutation_aliases_and_none_require_gradients": (MulFirstNoneRequireGrad, _none_require_grad),
    "input_mutation_alias_everything": (AliasEverything, _everything),
    "dupe_arg_torture": (TransposeBothArguments, _one_tensor_twice),
    "dupe_arg_returned_as_output": (WriteFirstReturnThird, _first_and_third_one_tensor),
}


@pytest.mark.parametrize("name", sorted(PORTED))
@pytest.mark.parametrize("req_grad", [False, True], ids=["plain", "grad"])
def test_ported_aot_autograd_aliased_input_case(name, req_grad):
    """Outputs (values, sizes, strides), inputs after the call and the gradients reaching the
    tensors the inputs were made from, program against eager, on fresh inputs made alike."""
    model_cls, make = PORTED[name]
    torch.manual_seed(0)
    ep = pf.export(model_cls(), make(req_grad))
    results = []
    for fn in (model_cls(), ep.module()):
        torch.manual_seed(1)
        LEAVES.clear()
        inputs = make(req_grad)
        out = fn(*inputs)
        outs = out if isinstance(out, tuple) else (out,)
        differentiable = [(o * (k + 1)).sum() for k, o in enumerate(outs) if o.requires_grad]
        leaves = [leaf for leaf in LEAVES if leaf.requires_grad]
        grads = torch.autograd.grad(sum(differentiable), leaves, allow_unused=True) if differentiable else ()
        results.append(([(o.shape, o.stride(), o.detach()) for o in outs],
                        [(t.shape, t.stride(), t.detach()) for t in inputs], grads))
    torch.testing.assert_close(results[1], results[0])


def test_program_for_one_tensor_twice_refuses_two_tensors_over_one_memory():
    """``x.t_(); y.t_()`` transposes one tensor twice when both are one object: another program
    than for two tensors over one memory, so the runtime check tells them apart."""
    x = torch.randn(3, 3).clone()
    ep = pf.export(TransposeBothArguments(), (x, x))
    z = torch.randn(3, 3)
    torch.testing.assert_close(ep.module()(z, z), 2 * z)
    with pytest.raises(RuntimeError, match="one tensor passed twice differs from two"):
        ep.module()(z, z.view(3, 3))


class TestWritesThroughAliasedInputs(TestCase):
    """Carried through a synthetic base (above); refused where the
    members cannot share one base."""

    def test_write_to_input_aliased_with_another_dtype_is_refused(self):
        class M(nn.Module):
            def forward(self, x, y):
                x.add_(1)
                return y * 2

        x = torch.randn(3)
        with refused(pf.Refusal.WRITE_TO_ALIASED_INPUTS, r"writes to inputs 'x', 'y', which share memory"):
            pf.export(M(), (x, x.view(torch.int32)))

    def test_replay_keeps_an_input_passed_twice_aliased(self):
        """The verifier must see the caller's aliasing: a program exported for distinct
        inputs differs from eager when both arguments are one tensor, and verify says so."""
        class M(nn.Module):
            def forward(self, x, y):
                x.add_(1)
                return y * 2

        ep = pf.export(M(), (torch.randn(3), torch.randn(3)))
        self.assertTrue(pf.verify(ep, M(), (torch.randn(3), torch.randn(3))).ok)
        t = torch.randn(3)
        report = pf.verify(ep, M(), (t, t))
        self.assertFalse(report.ok)
        self.assertIn("output: values differ", str(report))

    def test_replay_keeps_overlapping_views_aliased(self):
        """As above, for two views of one tensor (verify copies their memory once)."""
        class M(nn.Module):
            def forward(self, x, y):
                y.mul_(2)
                return x.sum()

        ep = pf.export(M(), (torch.randn(4), torch.randn(2)))
        t = torch.randn(4)
        report = pf.verify(ep, M(), (t, t[2:]))
        self.assertFalse(report.ok)
        self.assertIn("output: values differ", str(report))


class WritesTwoInputs(torch.nn.Module):
    def forward(self, x, y):
        x.add_(1)
        y.mul_(2)
        return x + y


def test_writes_to_disjoint_pieces_of_one_storage_export():
    """Inputs over one storage that do not overlap are independent (was refused)."""
    import predispatch_func as pf

    base = torch.randn(8)
    assert_ok(WritesTwoInputs(), (base[:4], base[4:]))
    eager_base = torch.randn(8)
    program_base = eager_base.clone()
    program = pf.export(WritesTwoInputs(), (base[:4], base[4:])).module()
    expected = WritesTwoInputs()(eager_base[:4], eager_base[4:])
    assert torch.equal(program(program_base[:4], program_base[4:]), expected)
    assert torch.equal(program_base, eager_base)


def test_writes_to_overlapping_inputs_export():
    """Carried through a synthetic base (was refused; the tests above)."""
    import predispatch_func as pf

    base = torch.randn(8)
    assert_ok(WritesTwoInputs(), (base[:5], base[3:]))
    eager_base = torch.randn(8)
    program_base = eager_base.clone()
    program = pf.export(WritesTwoInputs(), (base[:5], base[3:])).module()
    expected = WritesTwoInputs()(eager_base[:5], eager_base[3:])
    assert torch.equal(program(program_base[:5], program_base[3:]), expected)
    assert torch.equal(program_base, eager_base)
