"""torch's higher-order ops in the IR: each stays one HOP call whose bodies obey the
contract (no mutable node, regions outlined inside), nested with our regions in
both directions, replayed against the reference with gradients (``export_checked``)."""

import pytest
import torch
from expecttest import TestCase

import predispatch_func as pf
from predispatch_func.errors import UnsupportedError
from tests.support.reference import export_checked, graph_code
from tests.support.torch_release import torch_limit

# torch 2.11 and 2.12's invoke_subgraph asserts "fake_mode should be enabled for HOPs" when
# traced under our functional pre-dispatch stack (not examined further: whether torch's
# dispatch or ours leaves its fake mode out)
INVOKE_SUBGRAPH_NEEDS_2_13 = torch_limit("invoke_subgraph asserts 'fake_mode should be enabled for HOPs'",
                                         raises=AssertionError, lifted_in=(2, 13))

TORCH_AUTOCAST_IN_BODY = ("torch's functionalization of a HOP body loses an autocast region inside it "
                          "(aot_export_module(pre_dispatch=True) fails the same way)")


def hop_names(ep):
    from predispatch_func.graphs import all_graph_modules
    return sorted({"higher_order." + n.target.name() for _, gm in all_graph_modules(ep.graph_module) for n in gm.graph.nodes
                   if n.op == "call_function" and isinstance(n.target, torch._ops.HigherOrderOperator)})


class CondWithParameters(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda t: self.lin(t).relu(), lambda t: t.cos() * 2, (x,))


class CondInsideNoGrad(torch.nn.Module):
    """torch.export drops the region here and gets gradients eager does not have."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x):
        with torch.no_grad():
            y = torch.cond(x.sum() > 0, lambda t: self.lin(t), lambda t: t * 2, (x,))
        return y * x + self.lin(x)


class NoGradInsideCondBranch(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x):
        def true_fn(t):
            with torch.no_grad():
                frozen = self.lin(t)
            return frozen * t + self.lin(t)

        return torch.cond(x.mean() > -10, true_fn, lambda t: t.sin(), (x,))


class RegionsInsideCondBranches(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x):
        def true_fn(t):
            with torch.no_grad():
                frozen = self.lin(t)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                mixed = self.lin(t)
            return frozen * t + mixed.float()

        def false_fn(t):
            return t.sin()

        return torch.cond(x.mean() > -10, true_fn, false_fn, (x,))


class CondInsideAutocast(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = torch.cond(x.sum() > 0, lambda t: self.lin(t), lambda t: self.lin(t * 2), (x,))
        return y.float()


class CondWithInPlaceOnIntermediate(torch.nn.Module):
    def forward(self, x):
        def true_fn(t):
            u = t.clone()
            u.add_(1)  # in-place on a branch-local tensor: functionalized
            return u

        return torch.cond(x.sum() > 0, true_fn, lambda t: t - 1, (x,))


class CondWritesOperand(torch.nn.Module):
    def forward(self, x):
        def true_fn(t):
            t.add_(1)
            return t.clone()

        return torch.cond(x.sum() > 0, true_fn, lambda t: t.clone(), (x,))


class CondBodyGraphBreak(torch.nn.Module):
    def forward(self, x):
        def true_fn(t):
            torch._dynamo.graph_break()
            return t.clone()

        return torch.cond(x.sum() > 0, true_fn, lambda t: t.clone(), (x,))


class NestedCond(torch.nn.Module):
    def forward(self, x, y):
        def outer_true(a, b):
            return torch.cond(b.sum() > 0, lambda p, q: p * q, lambda p, q: p + q, (a, b))

        return torch.cond(x.sum() > 0, outer_true, lambda a, b: a - b, (x, y))


class WhileLoop(torch.nn.Module):
    def forward(self, x):
        from torch._higher_order_ops.while_loop import while_loop

        def cond_fn(i, v):
            return i < 3

        def body_fn(i, v):
            return i + 1, v.sin() * 2

        return while_loop(cond_fn, body_fn, (torch.zeros((), dtype=torch.int64), x))


class Map(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, xs):
        from torch._higher_order_ops.map import map as hop_map

        return hop_map(lambda x: self.lin(x).tanh(), xs)


class OutsideState(torch.nn.Module):
    """A module the model closes over, not one of its submodules: its tensors are real."""

    def __init__(self):
        super().__init__()
        self.param = torch.nn.Parameter(torch.tensor(5.0), requires_grad=False)
        self.scale = torch.nn.Parameter(torch.randn(3))
        self.buffer = torch.nn.Buffer(torch.tensor(6.0) + 1)


def hops_over_outside_state():
    outside = OutsideState()

    def body(x):
        z = x * outside.scale + outside.param + outside.buffer
        z.add_(4)
        return z

    from torch._higher_order_ops.map import map as hop_map
    from torch._higher_order_ops.scan import scan

    class MapOverIt(torch.nn.Module):
        def forward(self, xs):
            return hop_map(body, xs)

    class CondOverIt(torch.nn.Module):
        def forward(self, xs):
            return torch.cond(xs.sum() > 0, body, lambda t: t * outside.scale, (xs,))

    class ScanOverIt(torch.nn.Module):
        def forward(self, xs):
            return scan(lambda carry, x: (carry + body(x), carry.clone()), torch.zeros(3), xs)

    return {"map": MapOverIt(), "cond": CondOverIt(), "scan": ScanOverIt()}


class Scan(torch.nn.Module):
    def forward(self, init, xs):
        from torch._higher_order_ops.scan import scan

        def combine(carry, x):
            new = carry * 0.5 + x.sin()
            return new, new * 2

        return scan(combine, init, xs)


class RegionInsideScan(torch.nn.Module):
    def forward(self, init, xs):
        from torch._higher_order_ops.scan import scan

        def combine(carry, x):
            with torch.no_grad():
                scale = x.abs().mean()
            new = carry + x * scale
            return new, new.clone()

        return scan(combine, init, xs)


class AssociativeScan(torch.nn.Module):
    def forward(self, xs):
        from torch._higher_order_ops.associative_scan import associative_scan

        return associative_scan(lambda a, b: a + b, xs, dim=0, combine_mode="generic")


class FlexAttention(torch.nn.Module):
    def forward(self, q, k, v):
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        def causal(b, h, q_idx, kv_idx):
            return q_idx >= kv_idx

        mask = create_block_mask(causal, None, None, q.shape[-2], k.shape[-2], device="cpu")
        return flex_attention(q, k, v, score_mod=lambda s, b, h, qi, ki: s * 0.5, block_mask=mask)


class OutDtype(torch.nn.Module):
    def forward(self, a, b):
        from torch._higher_order_ops.out_dtype import out_dtype

        return out_dtype(torch.ops.aten.mm.default, torch.int32, a, b)


class InvokeSubgraph(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x):
        from torch._higher_order_ops.invoke_subgraph import mark_compile_region

        @mark_compile_region
        def block(t):
            return self.lin(t).sin()

        return block(block(x))


class DoubleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g * 2


class FunctionInsideCond(torch.nn.Module):
    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda t: DoubleGrad.apply(t), lambda t: t.sin(), (x,))


class CondInsideFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return torch.cond(x.sum() > 0, lambda t: t * 2, lambda t: t * 3, (x,))

    @staticmethod
    def backward(ctx, g):
        return g * 10


class HopsTest(TestCase):
    def setUp(self):
        torch.manual_seed(0)
        self.x = torch.randn(2, 3)

    def test_cond_is_one_call_with_both_branches(self):
        for x in (self.x.abs(), -self.x.abs()):
            ep = export_checked(CondWithParameters(), (x,))
            self.assertEqual(hop_names(ep), ["higher_order.cond"])

    def test_cond_inside_no_grad_gets_eagers_gradients(self):
        ep = export_checked(CondInsideNoGrad(), (self.x,))
        self.assertIn("pf_grad_region(False", graph_code(ep))

    @torch_limit(TORCH_AUTOCAST_IN_BODY, raises=UnsupportedError)
    def test_regions_inside_cond_branches(self):
        ep = export_checked(RegionsInsideCondBranches(), (self.x,))
        code = graph_code(ep)
        self.assertIn("pf_grad_region(False", code)
        self.assertIn("pf_autocast_region('cpu', torch.bfloat16", code)

    def test_no_grad_inside_cond_branch(self):
        ep = export_checked(NoGradInsideCondBranch(), (self.x,))
        self.assertIn("pf_grad_region(False", graph_code(ep))

    def test_cond_inside_autocast(self):
        export_checked(CondInsideAutocast(), (self.x,))

    def test_cond_branch_in_place_on_its_own_tensor(self):
        export_checked(CondWithInPlaceOnIntermediate(), (self.x,))

    def test_cond_writing_its_operand_is_refused(self):
        with self.assertRaises(UnsupportedError) as caught:
            pf.export(CondWritesOperand(), (self.x,))
        self.assertIn("torch refuses a HOP body that writes its operands", str(caught.exception))
        self.assertIs(caught.exception.kind, pf.Refusal.HOP_BODY_WRITES_OPERANDS)
        self.assertIn("test_torch_hops.py", str(caught.exception))

    def test_cond_body_torch_cannot_capture_for_another_reason_is_not_called_a_write(self):
        """torch raises the same UncapturedHigherOrderOpError for a graph break in the body:
        an export error with torch's reason, not HOP_BODY_WRITES_OPERANDS."""
        with self.assertRaises(pf.ExportError) as caught:
            pf.export(CondBodyGraphBreak(), (self.x,))
        self.assertNotIsInstance(caught.exception, UnsupportedError)
        self.assertIn("UncapturedHigherOrderOpError", str(caught.exception))
        self.assertIn("test_torch_hops.py", str(caught.exception))

    def test_nested_cond(self):
        export_checked(NestedCond(), (self.x, torch.randn(2, 3)))

    def test_while_loop(self):
        ep = export_checked(WhileLoop(), (self.x,), check_grads=False)
        self.assertEqual(hop_names(ep), ["higher_order.while_loop"])

    def test_map(self):
        export_checked(Map(), (torch.randn(4, 2, 3),))

    def test_hops_over_tensors_of_a_module_the_model_closes_over(self):
        # a real Parameter among a HOP's operands: torch's functionalization rule declined it
        # ("no implementation found for map_impl"); torch.export takes it as a constant
        for hop, model in zip(("map_impl", "cond", "scan"), hops_over_outside_state().values()):
            with self.subTest(hop=hop):
                ep = export_checked(model, (torch.randn(4, 3),))
                self.assertEqual(hop_names(ep), [f"higher_order.{hop}"])

    def test_scan(self):
        export_checked(Scan(), (torch.randn(3), torch.randn(5, 3)))

    def test_region_inside_scan(self):
        ep = export_checked(RegionInsideScan(), (torch.randn(3), torch.randn(5, 3)))
        self.assertIn("pf_grad_region(False", graph_code(ep))

    def test_associative_scan(self):  # its generic mode calls torch.vmap (trace/extensions/func_transforms.py)
        export_checked(AssociativeScan(), (torch.randn(5, 3),))

    def test_flex_attention_with_block_mask_made_outside_forward(self):
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        class Flex(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.mask = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, 128, 128,
                                              device="cpu")

            def forward(self, q, k, v):
                return flex_attention(q, k, v, score_mod=lambda s, b, h, qi, ki: s * 0.5,
                                      block_mask=self.mask)

        q, k, v = (torch.randn(1, 2, 128, 16) for _ in range(3))
        ep = export_checked(Flex(), (q, k, v), check_grads=False)
        self.assertIn("higher_order.flex_attention", hop_names(ep))

    def test_flex_attention_whose_mask_mod_indexes_a_captured_tensor(self):
        # torch runs mask_mod's indexing as its ModIndex autograd.Function inside the HOP's own
        # trace of the mask, below functionalization: torch's Function there, not ours
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        document = torch.arange(128) // 40

        class DocumentMasked(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.mask = create_block_mask(
                    lambda b, h, qi, ki: (document[qi] == document[ki]) & (qi >= ki), None, None, 128, 128,
                    device="cpu")

            def forward(self, q, k, v):
                return flex_attention(q, k, v, block_mask=self.mask)

        q, k, v = (torch.randn(1, 2, 128, 16) for _ in range(3))
        ep = export_checked(DocumentMasked(), (q, k, v), check_grads=False)
        self.assertIn("higher_order.flex_attention", hop_names(ep))

    def test_flex_attention_with_block_mask_made_in_forward(self):
        q, k, v = (torch.randn(1, 2, 128, 16) for _ in range(3))
        ep = export_checked(FlexAttention(), (q, k, v), check_grads=False)
        self.assertIn("higher_order.flex_attention", hop_names(ep))

    def test_out_dtype(self):
        a = torch.randint(-8, 8, (3, 4), dtype=torch.int8)
        b = torch.randint(-8, 8, (4, 2), dtype=torch.int8)
        ep = export_checked(OutDtype(), (a, b))
        self.assertEqual(hop_names(ep), ["higher_order.out_dtype"])

    @INVOKE_SUBGRAPH_NEEDS_2_13
    def test_invoke_subgraph(self):
        export_checked(InvokeSubgraph(), (self.x,))

    def test_function_inside_cond_branch_is_refused(self):
        """torch's dynamo capture of the branch inlines the Function's forward (no operand
        requires grad at capture): its backward would be silently lost."""
        with self.assertRaises(UnsupportedError) as caught:
            pf.export(FunctionInsideCond(), (self.x,))
        self.assertIn("autograd.Function DoubleGrad is called inside the body", str(caught.exception))

    def test_cond_inside_function_forward(self):
        """On torch 2.11 dynamo's capture of the branch failed its own guard on the caller's
        tracer's ``torch_fn_counts`` ('Guard failed on the same frame it was created'): the body's
        trace no longer sees the caller's torch-function modes (trace/environment.py)."""
        class M(torch.nn.Module):
            def forward(self, x):
                return CondInsideFunction.apply(x)
        export_checked(M(), (self.x,))

    def test_hop_nodes_point_at_the_users_line(self):
        """torch calls a HOP from the graph dynamo generated for it (``<eval_with_key>``);
        the node's stack_trace ends at the user's line instead, as for every other node."""
        from predispatch_func.graphs import all_graph_modules

        cases = [(CondWithParameters(), (self.x,)), (WhileLoop(), (self.x,)),
                 (Scan(), (torch.randn(3), torch.randn(5, 3)))]
        for model, args in cases:
            ep = pf.export(model, args)
            for where, gm in all_graph_modules(ep.graph_module):
                for node in gm.graph.nodes:
                    if node.op != "call_function":
                        continue
                    with self.subTest(model=type(model).__name__, node=f"{where}.{node.name}"):
                        trace = node.meta.get("stack_trace") or ""
                        self.assertNotIn("<eval_with_key>", trace)
                        innermost = [line for line in trace.splitlines() if line.strip().startswith("File")][-1]
                        self.assertIn("test_torch_hops.py", innermost)


# --- results of a HOP or an autograd.Function are observed like an op's (trace/stack.py) ------------------


_OPAQUE_CALLS = {
    "cond": lambda x: torch.cond(x.sum() > 0, lambda t: t.cos() * 2, lambda t: t.exp() * 0.1, (x,)),
    "map": lambda x: torch._higher_order_ops.map(lambda t: t.sin() * 2, x),
    "scan": lambda x: torch._higher_order_ops.scan(lambda c, t: (c + t, (c * t).clone()), x[0] * 0, x)[1],
    "autograd.Function": lambda x: DoubleGrad.apply(x),
    "while_loop": lambda x: torch._higher_order_ops.while_loop(
        lambda i, t: i < 3, lambda i, t: (i + 1, t.cos() * 2), (torch.zeros((), dtype=torch.int64), x))[1],
}


class _WritesAResultThroughData(torch.nn.Module):
    """Eager: the write changes the value, the result keeps its autograd history."""

    def __init__(self, kind):
        super().__init__()
        self.kind = kind

    def forward(self, x):
        v = _OPAQUE_CALLS[self.kind](x)
        v.data.mul_(-2.0)
        return v


class _BranchesOnRequiresGradOfAResult(torch.nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.kind = kind

    def forward(self, x):
        v = _OPAQUE_CALLS[self.kind](x)
        return v * 2 if v.requires_grad else v * 3


@pytest.mark.parametrize("kind", list(_OPAQUE_CALLS))
@pytest.mark.parametrize("model_cls", [_WritesAResultThroughData, _BranchesOnRequiresGradOfAResult])
def test_results_of_hops_and_functions_keep_eager_autograd_identity(model_cls, kind):
    # found by the hops fuzzer (seed 6): the program's output lost requires_grad after `v.data` was
    # written, and a branch on `v.requires_grad` traced the path eager does not take
    model, args = model_cls(kind), (torch.randn(3, 2, requires_grad=True),)
    ep = export_checked(model, args)
    export_checked(ep.module(), args)  # re-traced: a Function's call is traced again (retrace_call)


class _WritesAnOperandAfterTheHop(torch.nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.kind = kind

    def forward(self, x):
        v = x - 2
        out = _OPAQUE_CALLS[self.kind](v)
        v.copy_(x * 10)
        return out


@pytest.mark.parametrize("kind", ["scan", "while_loop"])
def test_an_in_place_write_to_an_operand_whose_backward_torch_does_not_version_check_is_refused(kind):
    # found by the hops fuzzer (seed 7): eager's while_loop/scan backward read the written
    # value (no version check); the program's read the value the call was given
    with pytest.raises(UnsupportedError, match=r"higher_order\." + kind) as info:
        pf.export(_WritesAnOperandAfterTheHop(kind), (torch.randn(3, 2, dtype=torch.float64, requires_grad=True),))
    assert info.value.kind is pf.Refusal.WRITE_AFTER_UNCHECKED_HOP_READ


def test_torchs_while_loop_and_scan_backward_still_read_a_written_operand():
    """The refusal above rests on this torch 2.13 behaviour: when this fails, torch checks
    versions there (as cond and map do) and the refusal can go."""
    for kind in ("scan", "while_loop"):
        grads = []
        for scale in (1.0, 10.0):
            x = torch.linspace(-1, 1, 6, dtype=torch.float64).reshape(3, 2).requires_grad_()
            v = x - 2
            out = _OPAQUE_CALLS[kind](v)
            v.copy_(x * scale)
            out.sum().backward()
            grads.append(x.grad)
        assert not torch.allclose(grads[0], grads[1]), kind


TORCH_WHILE_LOOP_RESULT_AS_OPERAND = (
    "torch's capture of a HOP's operands (dynamo) fails on a while_loop result computed with grad "
    "on (a slice of the stacked iterations: its storage offset holds the unbacked trip count); "
    "torch.export fails too")


class _WhileLoopResultIntoHop(torch.nn.Module):
    def __init__(self, next_hop, clone=False):
        super().__init__()
        self.next_hop, self.clone = next_hop, clone

    def forward(self, x):
        _, v = torch._higher_order_ops.while_loop(lambda i, t: i < 2, lambda i, t: (i + 1, t.sin() * 1.5),
                                                  (torch.zeros((), dtype=torch.int64), x))
        v = v.clone() if self.clone else v
        if self.next_hop == "cond":
            return torch.cond(v.sum() > 0, lambda t: t.cos(), lambda t: t * 2, (v,))
        return torch._higher_order_ops.map(lambda t: t.sin(), v)


# torch 2.11 and 2.12 fail the capture of the next HOP earlier, on a guard on the unbacked trip
# count ("Could not guard on data-dependent expression 6*u0 - 6"): still refused, naming the
# line, but as DATA_DEPENDENT_BRANCH and without the clone() advice
WHILE_LOOP_OPERAND_GUARDED_BEFORE_2_13 = torch_limit(
    "a while_loop result passed to another HOP fails torch's capture on a data-dependent guard "
    "before the text we translate", lifted_in=(2, 13))


@WHILE_LOOP_OPERAND_GUARDED_BEFORE_2_13
@pytest.mark.parametrize("next_hop", ["cond", "map"])
def test_a_while_loop_result_with_grad_passed_to_a_hop_is_refused_naming_the_line(next_hop):
    # found by the hops fuzzer (seed 8)
    x = torch.randn(3, 2, requires_grad=True)
    with pytest.raises(UnsupportedError, match=r"\.clone\(\)[\s\S]*in forward") as info:
        pf.export(_WhileLoopResultIntoHop(next_hop), (x,))
    assert info.value.kind is pf.Refusal.HOP_OPERAND_OF_WHILE_LOOP
    with pytest.raises(Exception, match="not supported between instances of 'NoneType' and 'int'"):
        torch.export.export(_WhileLoopResultIntoHop(next_hop), (x,))
    export_checked(_WhileLoopResultIntoHop(next_hop, clone=True), (x,))  # the workaround the refusal names
    export_checked(_WhileLoopResultIntoHop(next_hop), (x.detach(),))  # without grad: no stacked iterations


@torch_limit(TORCH_WHILE_LOOP_RESULT_AS_OPERAND, raises=UnsupportedError)
def test_a_while_loop_result_with_grad_as_a_cond_operand():
    export_checked(_WhileLoopResultIntoHop("cond"), (torch.randn(3, 2, requires_grad=True),))
