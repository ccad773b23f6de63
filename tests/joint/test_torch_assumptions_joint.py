"""What the joint trace assumes of torch (predispatch_func/_torch_compat/autograd_tracing.py), pinned."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from predispatch_func import _torch_compat as tc


class _Args(TorchDispatchMode):
    def __init__(self, op):
        super().__init__()
        self.op, self.seen = op, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is self.op:
            self.seen.append(args)
        return func(*args, **(kwargs or {}))


def test_the_engine_hands_backward_a_new_object_for_a_saved_tensor_with_history():
    """Why tc.untracked_arguments_resolved exists: a proxy mode tracking by object misses it."""
    x = torch.randn(3, requires_grad=True)
    packed = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t, lambda t: t):
        y = x * 2
        z = y.exp()  # saves its result z (history: ExpBackward)
    mode = _Args(torch.ops.aten.mul.Tensor)
    with mode:
        z.sum().backward()
    saved = [a for args in mode.seen for a in args if isinstance(a, torch.Tensor) and a.shape == z.shape
             and a.untyped_storage().data_ptr() == z.untyped_storage().data_ptr()]
    assert saved and all(a is not z for a in saved)
    assert any(p is z for p in packed)


def test_only_torchs_modes_may_sit_on_the_pre_dispatch_stack():
    """Why the patch replaces the proxy mode's dispatch instead of stacking a mode of ours."""
    class Mine(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self._dispatch_key = torch._C.DispatchKey.PreDispatch

    def f(x):
        with Mine():
            return x + 1
    with pytest.raises(AssertionError, match="mode must be"):
        tc.make_fx(f, pre_dispatch=True)(torch.randn(2))


def test_untracked_arguments_resolved_restores_torchs_methods_when_the_body_raises():
    from torch.fx.experimental.proxy_tensor import ProxyTorchDispatchMode, PythonKeyTracer

    dispatch, unwrap = ProxyTorchDispatchMode.__torch_dispatch__, PythonKeyTracer.unwrap_proxy

    class Mode:
        tracer = object()

    with pytest.raises(ZeroDivisionError):
        with tc.untracked_arguments_resolved(Mode(), lambda t: None):
            assert ProxyTorchDispatchMode.__torch_dispatch__ is not dispatch
            assert PythonKeyTracer.unwrap_proxy is not unwrap
            raise ZeroDivisionError
    assert ProxyTorchDispatchMode.__torch_dispatch__ is dispatch and PythonKeyTracer.unwrap_proxy is unwrap


def test_recorded_below_autograd_sees_autocast_casts_and_composite_decompositions():
    def f(x, w):
        with tc.recorded_below_autograd(tc.pre_dispatch_proxy_mode().tracer), \
                torch.autocast("cpu", dtype=torch.bfloat16):
            torch.nn.functional.layer_norm(x @ w, (3,))
        return x

    gm = tc.make_fx(f, pre_dispatch=True)(torch.randn(2, 3), torch.randn(3, 3))
    targets = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
    assert "aten._to_copy.default" in targets and "aten.native_layer_norm.default" in targets
    assert "aten.layer_norm.default" not in targets


def _scan_body_joint_graph(pre_dispatch: bool) -> torch.fx.GraphModule:
    """The joint graph scan's autograd kernel builds of a body (``create_partitioned_graph``),
    built while an outer make_fx runs, as inside export_joint's trace."""
    from torch._higher_order_ops.partitioner import HopGraphMinCutPartitioner
    from torch.fx.experimental.proxy_tensor import make_fx

    built = []

    def body(carry, row, w):
        new = carry * 0.5 + (row * w[0]).tanh()  # tanh saves its result for the backward
        return [new, new.clone()]

    def outer(x, w):
        with tc.disable_proxy_modes_tracing():
            built.append(HopGraphMinCutPartitioner.create_partitioned_graph(body, (x[0] * 0, x[0], w)))
        return x * 2

    make_fx(outer, tracing_mode="fake", pre_dispatch=pre_dispatch)(torch.randn(3, 4), torch.randn(4, 4, requires_grad=True))
    return built[0].bw_gm


def _constants(gm: torch.fx.GraphModule) -> list[str]:
    return [n.name for n in gm.graph.nodes if n.op == "get_attr" and isinstance(getattr(gm, n.target), torch.Tensor)]


def test_a_hop_body_joint_graph_built_under_a_pre_dispatch_trace_loses_its_saved_values():
    """Why tc.hop_joint_graphs_traced_apart exists: re-entering the running pre-dispatch trace,
    the body's saved tanh comes out a constant (after autograd it is right). A torch that fixes
    this fails here: the workaround can go."""
    assert _constants(_scan_body_joint_graph(pre_dispatch=True))
    assert not _constants(_scan_body_joint_graph(pre_dispatch=False))


def test_torch_2_11_and_2_12_set_the_hop_partitioners_logger_to_debug_and_exports_keep_it_quiet(capfd):
    """Why tc.hop_partitioner_quiet exists (a torch that stops doing it fails the first assert:
    drop the workaround), and that exporting a scan with grad prints none of its graphs."""
    import logging

    import torch._higher_order_ops.partitioner  # noqa: F401  (sets the level on import)

    import predispatch_func as pf
    from tests.joint.cases import CASES
    from tests.support.torch_release import torch_release

    level = logging.getLogger("torch._higher_order_ops.partitioner").level
    assert (level == logging.DEBUG) == (torch_release() < (2, 13))
    model, args, kwargs, _ = CASES["scan_in_training"].build()
    capfd.readouterr()
    pf.export_joint(model, args, kwargs)
    assert "min_cut_partition" not in capfd.readouterr().err
    assert logging.getLogger("torch._higher_order_ops.partitioner").level == level  # restored


def test_autograd_nodes_an_op_makes_are_numbered_between_the_counter_before_and_after():
    """What joint/step_meta.py's ForwardOrigins reads: each autograd node takes the thread's next
    sequence number, so the nodes one op made lie in [before, after); and a pre-hook on an
    autograd node runs before the engine dispatches that node's backward ops."""
    x = torch.randn(3, 4, requires_grad=True)
    w = torch.randn(5, 4, requires_grad=True)
    before = tc.autograd_sequence_nr()
    y = torch.nn.functional.linear(x, w)  # CompositeImplicit: t and mm, two autograd nodes
    after = tc.autograd_sequence_nr()
    assert after - before == 2
    assert before <= tc.sequence_nr_of(y.grad_fn) < after
    transpose = y.grad_fn.next_functions[1][0]
    assert before <= tc.sequence_nr_of(transpose) < after
    z = y.sin().sum()
    assert tc.sequence_nr_of(z.grad_fn) >= after
    mode = _Args(torch.ops.aten.mm.default)
    mm_calls_at_prehook = []
    y.grad_fn.register_prehook(lambda grad_outputs: mm_calls_at_prehook.append(len(mode.seen)))
    with mode:
        z.backward()
    assert mm_calls_at_prehook == [0] and len(mode.seen) == 2  # the node's two mm ran after its pre-hook


def test_torchs_lstm_decomposition_takes_onednns_inference_layer_when_only_the_weights_require_grad():
    """Why tc.rnn_decompositions_as_eager exists: torch picks oneDNN's layer by the input's
    requires_grad alone and runs it with ``train=False`` (no workspace for its backward). A torch
    that checks the weights too fails the first assert: drop the patch."""
    import inspect

    from torch._decomp import decompositions

    from predispatch_func import _torch_compat as tc

    if not torch._C._get_mkldnn_enabled():
        pytest.skip("this torch has oneDNN off: the decomposition never takes its layer")
    lstm = torch.nn.LSTM(4, 6)
    x, hx = torch.randn(5, 2, 4), (torch.zeros(1, 2, 6), torch.zeros(1, 2, 6))
    params = [list(lstm.parameters())]
    assert decompositions.select_one_layer_lstm_function(x, hx, params) is decompositions.mkldnn_one_layer_lstm
    assert "train = False" in inspect.getsource(decompositions.mkldnn_one_layer_lstm)
    with tc.rnn_decompositions_as_eager():
        assert decompositions.select_one_layer_lstm_function(x, hx, params) is decompositions.one_layer_lstm
        with torch.no_grad():  # inference keeps torch's choice
            assert decompositions.select_one_layer_lstm_function(x, hx, params) is decompositions.mkldnn_one_layer_lstm
    assert decompositions.select_one_layer_lstm_function(x, hx, params) is decompositions.mkldnn_one_layer_lstm


def test_torchs_rnn_decomposition_applies_no_dropout_between_layers():
    """Why tc.rnn_decompositions_as_eager drops between layers itself: torch's ``_rnn_helper`` zeroes
    the dropout on every layer. A torch that fixes it fails here, and the patch's own check of the
    helper (``_rnn_helper_drops_nothing``) then leaves it alone: drop that part of the patch."""
    from predispatch_func._torch_compat.patches import _rnn_helper_drops_nothing

    assert _rnn_helper_drops_nothing()
