"""Buffers written in forward (counters, accumulators, EMAs, a non-persistent cache through a
view, a buffer reassigned) and BatchNorm's running statistics: each a ``BUFFER_MUTATION`` with
its final value, written back by ``ep.module()``, gradients through the replay."""

import torch
from expecttest import TestCase

import predispatch_func as pf
from tests.support.cases_core import build
from tests.support.reference import export_case, graph_code, mutations

_BN_BUFFERS = ["running_mean", "running_var", "num_batches_tracked"]


class TestBufferMutations(TestCase):
    def test_buffer_counter(self):
        ep = export_case("buffer_counter")
        self.assertEqual(mutations(ep), [("BUFFER_MUTATION", "calls")])
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, b_calls, x):
    add = torch.ops.aten.add.Tensor(b_calls, 1);  b_calls = None
    mul = torch.ops.aten.mul.Tensor(x, add);  x = None
    return (add, mul)""")

    def test_buffer_accumulator(self):
        ep = export_case("buffer_accumulator")
        self.assertEqual(mutations(ep), [("BUFFER_MUTATION", "total")])
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, b_total, x):
    detach = torch.ops.aten.detach.default(x)
    add = torch.ops.aten.add.Tensor(b_total, detach);  b_total = detach = None
    mul = torch.ops.aten.mul.Tensor(x, add);  x = None
    return (add, mul)""")

    def test_non_persistent_buffer_mutated_through_view(self):
        ep = export_case("non_persistent_buffer_mutated_through_view")
        self.assertEqual(mutations(ep), [("BUFFER_MUTATION", "cache")])
        self.assertEqual(list(ep.graph_signature.non_persistent_buffers), ["cache"])
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, b_cache, x):
    detach = torch.ops.aten.detach.default(x)
    clone = torch.ops.aten.clone.default(detach);  detach = None
    select_scatter = torch.ops.aten.select_scatter.default(b_cache, clone, 0, 0);  b_cache = clone = None
    sum_1 = torch.ops.aten.sum.dim_IntList(select_scatter, [0])
    add = torch.ops.aten.add.Tensor(sum_1, x);  sum_1 = x = None
    return (select_scatter, add)""")

    def test_buffer_ema_with_lerp(self):
        ep = export_case("buffer_ema_with_lerp")
        self.assertEqual(mutations(ep), [("BUFFER_MUTATION", "ema")])
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, p_lin_weight, p_lin_bias, b_ema, x):
    linear = torch.ops.aten.linear.default(x, p_lin_weight, p_lin_bias);  x = p_lin_weight = p_lin_bias = None
    detach = torch.ops.aten.detach.default(linear)
    mean = torch.ops.aten.mean.dim(detach, [0]);  detach = None
    lerp = torch.ops.aten.lerp.Scalar(b_ema, mean, 0.1);  b_ema = mean = None
    sub = torch.ops.aten.sub.Tensor(linear, lerp);  linear = None
    return (lerp, sub)""")

    def test_buffer_reassigned_in_forward(self):
        ep = export_case("buffer_reassigned_in_forward")
        self.assertEqual(mutations(ep), [("BUFFER_MUTATION", "seen")])
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, b_seen, x):
    detach = torch.ops.aten.detach.default(x)
    add = torch.ops.aten.add.Tensor(b_seen, detach);  b_seen = detach = None
    mul = torch.ops.aten.mul.Tensor(x, add);  x = None
    return (add, mul)""")


class TestBatchNorm(TestCase):
    def test_batchnorm_train(self):
        ep = export_case("batchnorm_train")
        self.assertEqual(mutations(ep), [("BUFFER_MUTATION", b) for b in _BN_BUFFERS])
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, p_weight, p_bias, b_running_mean, b_running_var, b_num_batches_tracked, input_1):
    add = torch.ops.aten.add.Tensor(b_num_batches_tracked, 1);  b_num_batches_tracked = None
    clone_default = torch.ops.aten.clone.default(b_running_mean);  b_running_mean = None
    clone_default_1 = torch.ops.aten.clone.default(b_running_var);  b_running_var = None
    _native_batch_norm_legit_functional = torch.ops.aten._native_batch_norm_legit_functional.default(input_1, p_weight, p_bias, clone_default, clone_default_1, True, 0.1, 1e-05);  input_1 = p_weight = p_bias = clone_default = clone_default_1 = None
    getitem = _native_batch_norm_legit_functional[0]
    getitem_3 = _native_batch_norm_legit_functional[3]
    getitem_4 = _native_batch_norm_legit_functional[4];  _native_batch_norm_legit_functional = None
    return (getitem_3, getitem_4, add, getitem)""")

    def test_batchnorm_train_backward_after_replay(self):
        """The replayed program writes the running stats back, then backward still runs."""
        model, (x,), _ = build("batchnorm_train")
        program = pf.export(model, (x,)).module()
        before = program.running_mean.clone()
        x = x.clone().requires_grad_()
        program(x).pow(2).sum().backward()
        self.assertFalse(torch.equal(program.running_mean, before))
        self.assertIsNotNone(x.grad)
        self.assertIsNotNone(program.weight.grad)

    def test_batchnorm_called_twice_train(self):
        """Two updates of the same running stats; the second reads the first's result."""
        ep = export_case("batchnorm_called_twice_train")
        self.assertEqual(mutations(ep), [("BUFFER_MUTATION", f"bn.{b}") for b in _BN_BUFFERS])
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, p_bn_weight, p_bn_bias, b_bn_running_mean, b_bn_running_var, b_bn_num_batches_tracked, x):
    add = torch.ops.aten.add.Tensor(b_bn_num_batches_tracked, 1);  b_bn_num_batches_tracked = None
    clone_default = torch.ops.aten.clone.default(b_bn_running_mean);  b_bn_running_mean = None
    clone_default_1 = torch.ops.aten.clone.default(b_bn_running_var);  b_bn_running_var = None
    _native_batch_norm_legit_functional = torch.ops.aten._native_batch_norm_legit_functional.default(x, p_bn_weight, p_bn_bias, clone_default, clone_default_1, True, 0.1, 1e-05);  x = clone_default = clone_default_1 = None
    getitem = _native_batch_norm_legit_functional[0]
    getitem_3 = _native_batch_norm_legit_functional[3]
    getitem_4 = _native_batch_norm_legit_functional[4];  _native_batch_norm_legit_functional = None
    mul = torch.ops.aten.mul.Tensor(getitem, 2);  getitem = None
    add_1 = torch.ops.aten.add.Tensor(add, 1);  add = None
    _native_batch_norm_legit_functional_1 = torch.ops.aten._native_batch_norm_legit_functional.default(mul, p_bn_weight, p_bn_bias, getitem_3, getitem_4, True, 0.1, 1e-05);  mul = p_bn_weight = p_bn_bias = getitem_3 = getitem_4 = None
    getitem_5 = _native_batch_norm_legit_functional_1[0]
    getitem_8 = _native_batch_norm_legit_functional_1[3]
    getitem_9 = _native_batch_norm_legit_functional_1[4];  _native_batch_norm_legit_functional_1 = None
    return (getitem_8, getitem_9, add_1, getitem_5)""")

    def test_batchnorm_eval(self):
        ep = export_case("batchnorm_eval")
        self.assertEqual(mutations(ep), [])
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, p_weight, p_bias, b_running_mean, b_running_var, b_num_batches_tracked, input_1):
    batch_norm = torch.ops.aten.batch_norm.default(input_1, p_weight, p_bias, b_running_mean, b_running_var, False, 0.1, 1e-05, True);  input_1 = p_weight = p_bias = b_running_mean = b_running_var = None
    return (batch_norm,)""")

    def test_conv_batchnorm2d_train(self):
        ep = export_case("conv_batchnorm2d_train")
        self.assertEqual(mutations(ep), [("BUFFER_MUTATION", f"1.{b}") for b in _BN_BUFFERS])
        self.assertExpectedInline(graph_code(ep), """\
def forward(self, p__0_weight, p__0_bias, p__1_weight, p__1_bias, b__1_running_mean, b__1_running_var, b__1_num_batches_tracked, input_1):
    conv2d = torch.ops.aten.conv2d.default(input_1, p__0_weight, p__0_bias);  input_1 = p__0_weight = p__0_bias = None
    add = torch.ops.aten.add.Tensor(b__1_num_batches_tracked, 1);  b__1_num_batches_tracked = None
    clone_default = torch.ops.aten.clone.default(b__1_running_mean);  b__1_running_mean = None
    clone_default_1 = torch.ops.aten.clone.default(b__1_running_var);  b__1_running_var = None
    _native_batch_norm_legit_functional = torch.ops.aten._native_batch_norm_legit_functional.default(conv2d, p__1_weight, p__1_bias, clone_default, clone_default_1, True, 0.1, 1e-05);  conv2d = p__1_weight = p__1_bias = clone_default = clone_default_1 = None
    getitem = _native_batch_norm_legit_functional[0]
    getitem_3 = _native_batch_norm_legit_functional[3]
    getitem_4 = _native_batch_norm_legit_functional[4];  _native_batch_norm_legit_functional = None
    return (getitem_3, getitem_4, add, getitem)""")
