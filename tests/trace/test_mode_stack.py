"""The tracing mode stack: torch's higher-order ops dispatch through our functional mode.

HOP dispatch finds the active mode's rule by its exact type; our mode shares
FunctionalTensorMode's rules, so ``torch.cond`` reaches torch's
functionalization rule for cond. (Every torch HOP: tests/hops/test_torch_hops.py.)
"""

import unittest.mock

import torch
from expecttest import TestCase

from tests.support.reference import export_checked, graph_code


class CondOnTensorPredicate(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda x: self.lin(x).sin(), lambda x: x.cos() * 2, (x,))


class TestTorchHopsDispatchThroughOurMode(TestCase):
    def test_cond_with_tensor_predicate_replays_against_eager_on_both_branches(self):
        for x in (torch.ones(3), -torch.ones(3)):
            ep = export_checked(CondOnTensorPredicate(), (x,))
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, p_lin_weight, p_lin_bias, x):
    sum_1 = torch.ops.aten.sum.default(x)
    gt = torch.ops.aten.gt.Scalar(sum_1, 0);  sum_1 = None
    true_graph_0 = self.true_graph_0
    false_graph_0 = self.false_graph_0
    cond = torch.ops.higher_order.cond(gt, true_graph_0, false_graph_0, (x, p_lin_bias, p_lin_weight));  gt = true_graph_0 = false_graph_0 = x = p_lin_bias = p_lin_weight = None
    getitem = cond[0];  cond = None
    return (getitem,)

# true_graph_0
def forward(self, arg0_1, arg1_1, arg2_1):
    linear = torch.ops.aten.linear.default(arg0_1, arg2_1, arg1_1);  arg0_1 = arg2_1 = arg1_1 = None
    sin = torch.ops.aten.sin.default(linear);  linear = None
    return (sin,)

# false_graph_0
def forward(self, arg0_1, arg1_1, arg2_1):
    cos = torch.ops.aten.cos.default(arg0_1);  arg0_1 = None
    mul = torch.ops.aten.mul.Tensor(cos, 2);  cos = None
    return (mul,)""")


class TestPerOpShortcuts(TestCase):
    """The per-op paths read schemas once per op and flatten arguments without torch's
    pytree (trace/observers.py): they must give what a walk of the schema and pytree give."""

    def test_written_tensors_match_the_schema_of_in_place_and_out_overloads(self):
        from predispatch_func import _torch_compat as tc
        from predispatch_func.trace.observers import written_tensors

        checked = 0
        for name in ("add_", "copy_", "add", "_native_batch_norm_legit", "_foreach_add_", "index_put_",
                     "resize_", "bernoulli_", "addmm", "sort", "max_pool2d_with_indices"):
            packet = getattr(torch.ops.aten, name)
            for overload in packet.overloads():
                op = getattr(packet, overload)
                schema = tc.schema_of(op)
                # one distinct marker per argument, positional ones positionally, keyword-only by name
                markers = {a.name: object() for a in schema.arguments}
                positional = tuple(markers[a.name] for a in schema.arguments if not a.kwarg_only)
                keyword = {a.name: markers[a.name] for a in schema.arguments if a.kwarg_only}
                expected = [markers[a.name] for a in schema.arguments
                            if a.alias_info is not None and a.alias_info.is_write]
                with unittest.mock.patch.object(tc, "FunctionalTensor", object):
                    self.assertEqual(written_tensors(op, positional, keyword), expected, str(op))
                checked += 1
        self.assertGreater(checked, 30)

    def test_leaves_of_op_arguments_and_results_match_pytree(self):
        from predispatch_func import _torch_compat as tc
        from predispatch_func.trace.observers import _leaves

        t, u = torch.ones(1), torch.zeros(2)
        for value in [t, None, 3, (t, [u, t], None), ([t], ([u], (t,)), 2.0), (), [[], [t]],
                      torch.Size([2, 3]), (t, torch.return_types.max((t, u)))]:
            self.assertEqual([id(x) for x in _leaves(value)], [id(x) for x in tc.pytree.tree_leaves(value)])
