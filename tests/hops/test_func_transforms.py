"""``torch.func`` transforms inside forward (``torch.vmap``, ``grad``, ``vjp``, ``jvp``,
``jacrev``, ``jacfwd``, ``hessian``; ``create_block_mask`` calls vmap): traced below
autograd for the length of each transform (trace/extensions/func_transforms.py), each program
replayed against the reference over calls, with gradients through the transform.
"""

import pytest
import torch
from expecttest import TestCase
from torch import nn

import predispatch_func as pf
from tests.support.expect_refusal import refused
from tests.support.reference import export_checked, graph_code, replay_calls
from tests.support.torch_release import torch_limit

# torch 2.11 fails vmap inside a HOP body with an internal assert ("!dynamicLayerStack.empty()
# INTERNAL ASSERT FAILED") raised while unwinding, in place of the text we translate: the export
# still fails, as an ExportError naming the op and line, not the FUNC_TRANSFORM_IN_HOP_BODY refusal
VMAP_IN_HOP_BODY_ASSERTS_ON_2_11 = torch_limit(
    "vmap inside a HOP body ends in torch's internal DynamicLayer assert", lifted_in=(2, 12))


def checked(model, args, **kwargs):
    ep = export_checked(model, args, **kwargs)
    replay_calls(ep, model, args, calls=2, grads=kwargs.get("check_grads", True))
    return ep


class VmapWithParameter(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(3))

    def forward(self, x):
        return torch.vmap(lambda row: (row.sin() * self.w).sum())(x) * 2


class VmapOfSubmodule(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 2)

    def forward(self, x):
        return torch.vmap(self.lin)(x).relu()


class VmapWritesItsInput(nn.Module):
    def forward(self, x):
        torch.vmap(lambda row: row.mul_(2))(x)
        return x + 1


class VmapWritesBuffer(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("acc", torch.zeros(4, 3))

    def forward(self, x):
        torch.vmap(lambda a, row: a.add_(row))(self.acc, x)
        return self.acc * 1


class NoGradInsideVmap(nn.Module):
    def forward(self, x):
        def f(row):
            with torch.no_grad():
                doubled = row * 2
            return doubled + row
        return torch.vmap(f)(x)


class VmapUnderNoGrad(nn.Module):
    def forward(self, x):
        with torch.no_grad():
            y = torch.vmap(lambda row: row * 2)(x)
        return y + x


class VmapDrawsRandom(nn.Module):
    def __init__(self, randomness):
        super().__init__()
        self.randomness = randomness

    def forward(self, x):
        return torch.vmap(lambda row: row + torch.rand(3), randomness=self.randomness)(x)


class ReseedThenVmapDraws(nn.Module):
    def forward(self, x):
        with torch.random.fork_rng():  # the reseed is undone: only the draw after it tells
            torch.manual_seed(0)
            return torch.vmap(lambda row: row + torch.rand(3), randomness="different")(x)


class NestedVmapWithDims(nn.Module):
    def forward(self, x, y):
        outer = torch.func.vmap(torch.func.vmap(lambda a: a.cos() * a))(x)
        return outer, torch.vmap(lambda a, b: torch.outer(a, b), in_dims=(1, None), out_dims=2)(x[0], y)


class VmapInsideFunction(nn.Module):
    def forward(self, x):
        class Triple(torch.autograd.Function):
            @staticmethod
            def forward(ctx, a):
                return torch.vmap(lambda row: row * 3)(a)

            @staticmethod
            def backward(ctx, grad):
                return grad * 5  # its own backward, not autograd of forward
        return Triple.apply(x)


class GradOfParameterisedLoss(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(3))

    def forward(self, x):  # the gradient of forward's output reaches w twice: second order
        return torch.func.grad(lambda a: (a.sin() * self.w).sum())(x) * self.w


class Transform(nn.Module):
    def __init__(self, name):
        super().__init__()
        self.name = name

    def forward(self, x):
        f = lambda a: a.sin() * a  # noqa: E731
        if self.name == "vjp":
            out, vjp_fn = torch.func.vjp(f, x)
            return out + vjp_fn(torch.ones_like(out))[0]  # its backward runs after the level closed
        if self.name == "jvp":
            return torch.func.jvp(f, (x,), (torch.ones_like(x),))[1]
        if self.name in ("grad", "hessian"):
            return getattr(torch.func, self.name)(lambda a: f(a).sum())(x)
        return getattr(torch.func, self.name)(f)(x)


class BlockMaskFromDocuments(nn.Module):
    """Document masking, as LLM codebases write it: the mask_mod indexes a tensor of the call."""

    def forward(self, q, k, v, document):
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        def same_document(b, h, q_idx, kv_idx):
            return (document[q_idx] == document[kv_idx]) & (q_idx >= kv_idx)

        mask = create_block_mask(same_document, None, None, q.shape[-2], k.shape[-2], device="cpu")
        return flex_attention(q, k, v, block_mask=mask)


class VmapInsideCond(nn.Module):
    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda t: torch.vmap(lambda r: r.sin())(t), lambda t: t.cos(), (x,))


def _x(*shape):
    return torch.randn(*shape, requires_grad=True)


class FuncTransformsTest(TestCase):
    def test_vmap_becomes_plain_ops_of_the_batch(self):
        ep = checked(VmapWithParameter(), (_x(4, 3),))
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, p_w, x):
    sin = torch.ops.aten.sin.default(x);  x = None
    mul = torch.ops.aten.mul.Tensor(sin, p_w);  sin = p_w = None
    sum_1 = torch.ops.aten.sum.dim_IntList(mul, [1]);  mul = None
    mul_1 = torch.ops.aten.mul.Tensor(sum_1, 2);  sum_1 = None
    return (mul_1,)""")

    def test_vmap_of_submodule(self):
        checked(VmapOfSubmodule(), (_x(4, 3),))

    def test_vmap_writing_its_input_is_a_mutation_of_the_input(self):
        ep = checked(VmapWritesItsInput(), (torch.randn(4, 3),))
        self.assertEqual([s.kind.name for s in ep.graph_signature.output_specs][:1], ["USER_INPUT_MUTATION"])

    def test_vmap_writing_a_buffer(self):
        ep = checked(VmapWritesBuffer(), (torch.randn(4, 3),))
        self.assertIn("BUFFER_MUTATION", [s.kind.name for s in ep.graph_signature.output_specs])

    def test_grad_mode_inside_or_around_vmap_stays_a_region(self):
        for model in (NoGradInsideVmap(), VmapUnderNoGrad()):
            ep = checked(model, (_x(4, 3),))
            self.assertIn("pf_grad_region(False", graph_code(ep))

    def test_random_draws_inside_vmap(self):
        for randomness in ("different", "same"):
            checked(VmapDrawsRandom(randomness), (torch.randn(4, 3),))

    def test_draw_inside_vmap_after_a_reseed_in_forward_is_refused(self):
        with refused(pf.Refusal.RNG_STATE_SET):
            pf.export(ReseedThenVmapDraws(), (torch.randn(4, 3),))

    def test_nested_vmap_and_in_out_dims(self):
        checked(NestedVmapWithDims(), (_x(2, 4, 3), _x(5)))

    def test_vmap_inside_autograd_function_keeps_its_backward(self):
        checked(VmapInsideFunction(), (_x(4, 3),))

    def test_grad_transform_with_gradients_through_it(self):
        checked(GradOfParameterisedLoss(), (_x(3),))

    def test_flex_attention_mask_indexing_a_tensor_of_the_call(self):
        q, k, v = (torch.randn(1, 2, 128, 16) for _ in range(3))
        checked(BlockMaskFromDocuments(), (q, k, v, torch.arange(128) // 40), check_grads=False)

    @VMAP_IN_HOP_BODY_ASSERTS_ON_2_11
    def test_vmap_inside_a_hop_body_is_refused_and_torch_still_captures_it_after(self):
        with refused(pf.Refusal.FUNC_TRANSFORM_IN_HOP_BODY, r"outside the HOP"):
            pf.export(VmapInsideCond(), (torch.randn(4, 3),))
        # dynamo knows functorch's level context managers by identity: ours never leak into it
        x = torch.randn(4, 3)
        ep = torch.export.export(VmapInsideCond(), (x,))
        self.assertTrue(torch.allclose(ep.module()(x), VmapInsideCond()(x)))


@pytest.mark.parametrize("name", ["grad", "vjp", "jvp", "jacrev", "jacfwd", "hessian"])
def test_func_transform(name):
    checked(Transform(name), (_x(3),))
