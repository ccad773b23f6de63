"""Drift tests: each function of ``_torch_compat/reimplemented.py`` that restates torch code,
run next to torch's own path on the same inputs and compared.

A failure here means the installed torch no longer does what our restatement
does: read torch's change and update the restatement (or the probe that picks
between releases), never the expected value.
"""

from __future__ import annotations

import contextlib
import re
import unittest.mock

import pytest
import torch
from expecttest import TestCase

import predispatch_func as pf
from predispatch_func import _torch_compat as tc

A = torch.ops.aten


# --- functionalize_kept_op ------------------------------------------------------------------


class TestStraightFunctionalization(TestCase):
    """``functionalize_kept_op`` restates ``FunctionalTensorMode.__torch_dispatch__`` for the
    aten ops our mode keeps (unwrap, C++ functionalization with views reapplied, wrap,
    the in-place view's metadata, aliasing correction), and ``goes_straight_to_functionalization``
    /``only_functionalized_tensor_types`` say when torch's generic dispatch would do nothing
    more. Pins: every edge case gives the very program torch's dispatch gives."""

    def test_every_edge_case_exports_the_same_program_through_torchs_dispatch(self):
        from predispatch_func.errors import ExportError
        from predispatch_func.graphs import all_graph_modules
        from tests.support.cases_core import CASES, build

        def program(name: str, pre_dispatch: bool) -> str:
            model, args, kwargs = build(name)
            try:
                ep = pf.export(model, args, kwargs, pre_dispatch=pre_dispatch)
            except ExportError as exc:
                return f"refused: {exc}"
            return "\n".join([str(ep.graph_signature)] + [f"{path}:\n{gm.code}" for path, gm in all_graph_modules(ep.graph_module)])

        compared = 0
        for name in sorted(CASES):
            for pre_dispatch in (True, False):
                fast = program(name, pre_dispatch)
                with unittest.mock.patch.object(tc, "goes_straight_to_functionalization", lambda op: False):
                    torchs = program(name, pre_dispatch)
                self.assertEqual(fast, torchs, f"{name} (pre_dispatch={pre_dispatch})")
                compared += not fast.startswith("refused")
        self.assertGreater(compared, 100)


# --- torch_export_keeps ---------------------------------------------------------------------


def _r(*shape):
    return torch.randn(*shape)


# op -> (tensor inputs, how forward calls the op on them)
KEEPS_CASES = {
    A.linear.default: ((_r(2, 3), _r(4, 3), _r(4)), lambda x, w, b: A.linear.default(x, w, b)),
    A.layer_norm.default: ((_r(2, 3),), lambda x: A.layer_norm.default(x, [3])),
    A.group_norm.default: ((_r(2, 4, 3),), lambda x: A.group_norm.default(x, 2)),
    A.matmul.default: ((_r(2, 3), _r(3, 4)), lambda a, b: A.matmul.default(a, b)),
    A.einsum.default: ((_r(2, 3),), lambda x: A.einsum.default("ij->ji", [x])),
    A.type_as.default: ((_r(2, 3), _r(2, 3).double()), lambda x, y: A.type_as.default(x, y)),
    A.sum_to_size.default: ((_r(2, 3),), lambda x: A.sum_to_size.default(x, [1, 3])),
    A.dropout.default: ((_r(2, 3),), lambda x: A.dropout.default(x, 0.5, False)),
    A.flatten.using_ints: ((_r(2, 3, 4),), lambda x: A.flatten.using_ints(x)),
    A.reshape.default: ((_r(2, 3),), lambda x: A.reshape.default(x, [3, 2])),
    A.unflatten.int: ((_r(6),), lambda x: A.unflatten.int(x, 0, [2, 3])),
    A.contiguous.default: ((_r(3, 2),), lambda x: A.contiguous.default(x.t())),
    A.to.dtype: ((_r(2, 3),), lambda x: A.to.dtype(x, torch.float64)),
    A.conv2d.default: ((_r(1, 1, 4, 4), _r(1, 1, 3, 3)), lambda x, w: A.conv2d.default(x, w)),
    A.scaled_dot_product_attention.default: ((_r(1, 2, 4, 8), _r(1, 2, 4, 8), _r(1, 2, 4, 8)),
                                             lambda q, k, v: A.scaled_dot_product_attention.default(q, k, v)),
    A.softmax.int: ((_r(2, 3),), lambda x: A.softmax.int(x, 0)),
    A.native_batch_norm.default: ((_r(2, 3), _r(3), _r(3), _r(3), _r(3).abs()),
                                  lambda x, w, b, m, v: A.native_batch_norm.default(x, w, b, m, v, False, 0.1, 1e-5)),
    A.instance_norm.default: ((_r(2, 3, 4),),
                              lambda x: A.instance_norm.default(x, None, None, None, None, True, 0.1, 1e-5, False)),
    A.pad.default: ((_r(2, 3),), lambda x: A.pad.default(x, [1, 1])),
    A.cosine_similarity.default: ((_r(2, 3), _r(2, 3)), lambda a, b: A.cosine_similarity.default(a, b)),
    A.bilinear.default: ((_r(2, 3), _r(2, 4), _r(5, 3, 4), _r(5)), lambda a, b, w, c: A.bilinear.default(a, b, w, c)),
    A.cross_entropy_loss.default: ((_r(2, 3), torch.tensor([0, 2])), lambda x, t: A.cross_entropy_loss.default(x, t)),
    A.rms_norm.default: ((_r(2, 3),), lambda x: A.rms_norm.default(x, [3])),
    A.relu.default: ((_r(2, 3),), lambda x: A.relu.default(x)),  # kernels: always kept
    A.addmm.default: ((_r(2, 4), _r(2, 3), _r(3, 4)), lambda a, b, c: A.addmm.default(a, b, c)),
}


class _Calls(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *tensors):
        out = self.fn(*tensors)
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)


@pytest.mark.parametrize("op", list(KEEPS_CASES), ids=str)
def test_torch_export_keeps_says_what_torchs_functional_pre_dispatch_export_keeps(op):
    """``torch_export_keeps`` restates the keep-or-decompose decision of torch's functional
    pre-dispatch export (FunctionalTensorMode with export=True: ``_can_decompose_fast``,
    the maybe_aliasing_or_mutating tag, native_batch_norm's forced decomposition). Pins:
    for these composites and kernels, ``op`` is a node of ``aot_export_module(pre_dispatch=True)``'s
    graph exactly when we say torch keeps it (the audit table's ``torch_keeps`` column)."""
    tensors, fn = KEEPS_CASES[op]
    gm, _ = tc.torch_aot_export_module(_Calls(fn), tensors)
    torch_kept = any(n.target is op for n in gm.graph.nodes)
    assert tc.torch_export_keeps(op) == torch_kept


def test_the_keeps_cases_cover_both_answers():
    answers = [tc.torch_export_keeps(op) for op in KEEPS_CASES]
    assert answers.count(True) >= 5 and answers.count(False) >= 5


# --- stack_trace_anchors, uninteresting_stack_files ------------------------------------------


def _relu_in_a_helper(t):  # not a forward frame: fx drops it
    return torch.nn.functional.relu(t)


class _Inner(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x):
        return _relu_in_a_helper(self.lin(x)).sin()


class _Outer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = _Inner()
        self.seq = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Tanh())

    def forward(self, x):
        y = self.inner(x)
        z = self.seq(y)
        return torch.nn.functional.layer_norm(z.cos() * 2, [3])


def _traces(ep) -> list[tuple[str, str]]:
    return [(str(n.target), n.meta.get("stack_trace")) for n in ep.graph.nodes if n.op == "call_function"]


def test_stack_traces_are_the_ones_torch_export_records():
    """``stack_trace_anchors`` and ``uninteresting_stack_files`` restate which frames fx's tracer
    keeps in a node's ``stack_trace`` (``forward`` frames and torch's registered anchors, less
    torch's uninteresting files, named by path), and
    ``passes/node_meta.py`` formats them as fx does. Pins: on a functional model (same nodes
    in both programs) every node's stack_trace equals the one ``torch.export.export`` records."""
    x = torch.randn(2, 3)
    torch.manual_seed(0)
    ours = _traces(pf.export(_Outer(), (x,)))
    torch.manual_seed(0)
    torchs = _traces(torch.export.export(_Outer(), (x,)))
    assert [t for t, _ in ours] == [t for t, _ in torchs]
    assert all(trace for _, trace in ours)
    assert ours == torchs


def test_the_uninteresting_files_named_by_path_are_torchs():
    """``uninteresting_stack_files`` names torch's set by path, without importing the modules
    torch imports to compute it. Pins: every file torch names is named, and the only extra
    ones are dynamo's polyfill modules (taken by folder; dynamo alone runs them)."""
    import os

    ours, torchs = tc.uninteresting_stack_files(), tc.torchs_uninteresting_stack_files()
    assert torchs <= ours, sorted(torchs - ours)
    polyfills = os.path.join(os.path.dirname(torch.__file__), "_dynamo", "polyfills")
    assert all(os.path.dirname(f) == polyfills for f in ours - torchs), sorted(ours - torchs)
    assert all(os.path.exists(f) for f in ours if f != "<string>")


# --- recompute_unbacked_bindings ------------------------------------------------------------


class _GathersNonzero(torch.nn.Module):
    def forward(self, x):
        return x[x.nonzero()[:, 0]].sum(0) + x.shape[0]


def test_torchs_unbacked_binding_pass_has_nothing_to_do_without_unbacked_symbols():
    """``recompute_unbacked_bindings`` skips torch's pass (and the import of its module) where
    the trace made no unbacked symbol and no node has a binding. Pins: torch's pass then
    leaves every node's meta as it was (dynamic sizes, backed symbols, included), and on a
    trace with unbacked symbols our programs keep the bindings torch.export's keep."""
    from torch.export._trace import _replace_unbacked_bindings

    ep = pf.export(_Outer(), (torch.randn(4, 3),), dynamic_shapes=({0: torch.export.Dim("b", max=64)},))
    gm = ep.graph_module
    before = [(n.name, sorted(n.meta), n.meta.get("unbacked_bindings")) for n in gm.graph.nodes]
    assert not any(bindings for _, _, bindings in before)
    _replace_unbacked_bindings(gm)
    assert [(n.name, sorted(n.meta), n.meta.get("unbacked_bindings")) for n in gm.graph.nodes] == before

    def bound(program):
        return sorted(str(n.target) for n in program.graph.nodes if n.meta.get("unbacked_bindings"))

    x = torch.tensor([1.0, 0.0, 2.0, 3.0])
    ours = pf.export(_GathersNonzero(), (x,))
    assert bound(ours) and bound(ours) == bound(torch.export.export(_GathersNonzero(), (x,)))
    assert torch.equal(ours.module()(x), _GathersNonzero()(x))


# --- record_grad_marker, record_hop_call ----------------------------------------------------


def _structure(gm: torch.fx.GraphModule) -> list[tuple]:
    """Nodes as (op, target, args with nodes by position, meta keys, val's shapes): what a
    consumer reads, without the names a recorder chose for get_attr submodules."""
    index = {n: i for i, n in enumerate(gm.graph.nodes)}

    def arg(a):
        if isinstance(a, torch.fx.Node):
            return ("node", index[a])
        if isinstance(a, (tuple, list)):
            return type(a)(arg(b) for b in a)
        return a

    def shapes(v):
        if isinstance(v, torch.Tensor):
            return tuple(v.shape), v.dtype
        if isinstance(v, (tuple, list)):
            return tuple(shapes(u) for u in v)
        return v

    return [(n.op, "attr" if n.op == "get_attr" else n.target, arg(n.args), arg(n.kwargs), sorted(n.meta),
             shapes(n.meta.get("val"))) for n in gm.graph.nodes]


def test_grad_marker_is_the_node_torchs_pre_dispatch_tracer_records():
    """``record_grad_marker`` restates the node torch's pre-dispatch tracer records for a
    grad-mode change (``torch._C._set_grad_enabled(b)``, val None). Pins: a ``no_grad`` block
    traced by torch and our two markers around the same op give the same nodes."""
    def torchs(x):
        with torch.no_grad():
            y = x * 2
        return y + 1

    def ours(x):
        tc.record_grad_marker(False)
        y = x * 2
        tc.record_grad_marker(True)
        return y + 1

    x = torch.randn(3)
    expected = tc.make_fx(torchs, pre_dispatch=True)(x)
    got = tc.make_fx(ours, pre_dispatch=True)(x)
    assert sum(n.target is tc.SET_GRAD_ENABLED for n in expected.graph.nodes) == 2
    assert _structure(got) == _structure(expected)


def test_hop_call_is_the_node_torchs_proxy_rule_records():
    """``record_hop_call`` restates what torch's HOP proxy rules do (register each subgraph
    on the tracer's root, a get_attr per subgraph, the call node, results tracked as its
    items). Pins: for ``invoke_subgraph`` (subgraph, identifier, *operands: our layout), the
    nodes equal those torch's own rule records, submodule names aside."""
    from torch._higher_order_ops.invoke_subgraph import invoke_subgraph

    body = torch.fx.symbolic_trace(lambda a: (a.sin() * 2,))

    def torchs(x):
        return invoke_subgraph(body, "sub", x)[0] + 1

    def ours(x):
        tracer = tc.current_proxy_tracer()
        with tc.disable_proxy_modes_tracing():  # as at our call sites: below the proxy mode
            result = body(x)[0]
            tc.record_hop_call(invoke_subgraph, [("subgraph", body)], ("sub",), [x], [result], tracer=tracer)
        return result + 1

    x = torch.randn(3)
    expected = tc.make_fx(torchs, pre_dispatch=True)(x)
    got = tc.make_fx(ours, pre_dispatch=True)(x)
    assert _structure(got) == _structure(expected)
    [attr] = [n for n in got.graph.nodes if n.op == "get_attr"]
    assert getattr(got, attr.target) is not None


# --- record_flat_apply -----------------------------------------------------------------------


class _BuildsATwoTensor(torch.nn.Module):
    """torch.export records the build only for a model that holds a TwoTensor (it patches the
    attribute reads of the subclass types it finds in the state and inputs): the buffer."""

    def __init__(self):
        super().__init__()
        from torch.testing._internal.two_tensor import TwoTensor

        self.buf = torch.nn.Buffer(TwoTensor(torch.ones(3), torch.ones(3)))

    def forward(self, x):
        from torch.testing._internal.two_tensor import TwoTensor

        return (TwoTensor(x, x * 2) + self.buf).b


def _flat_apply_calls(gm: torch.fx.GraphModule) -> list[tuple]:
    """Each flat_apply node of ``gm``: (its first two arguments' kinds and what they hold, the
    number of operands, what its function builds from (x, 2 * x))."""
    from torch._higher_order_ops.flat_apply import _ConstantFunction, flat_apply

    found = []
    for node in gm.graph.nodes:
        if node.target is not flat_apply:
            continue
        func_ref, spec_ref, *operands = node.args
        func_spec, in_spec = getattr(gm, func_ref.target), getattr(gm, spec_ref.target)
        func = torch.utils._pytree._retrieve_constant(func_spec)
        x = torch.randn(3)
        built = flat_apply(func_spec, in_spec, x, x * 2)
        found.append((func_ref.op, spec_ref.op, isinstance(func, _ConstantFunction),
                      in_spec == torch.utils._pytree.tree_flatten(((x, x), {}))[1], len(operands),
                      type(built).__name__, torch.equal(built.a, x) and torch.equal(built.b, x * 2)))
    return found


def test_flat_apply_is_the_node_torch_export_records_for_a_subclass_built_in_forward():
    """``record_flat_apply`` restates ``torch._export.wrappers._emit_flat_apply_call``: a
    ``flat_apply`` whose first two arguments are get_attr nodes of a ``_ConstantFunction`` spec and
    of the arguments' spec ``((operands...), {})``, the operands after them. Ours calls the
    subclass's ``__tensor_unflatten__``, torch's its constructor: both build the same TwoTensor."""
    x = torch.randn(3)
    theirs = _flat_apply_calls(torch.export.export(_BuildsATwoTensor(), (x,)).graph_module)
    ours = _flat_apply_calls(pf.export(_BuildsATwoTensor(), (x,)).graph_module)
    assert ours == theirs == [("get_attr", "get_attr", True, True, 2, "TwoTensor", True)]


# --- fake_with_dynamic_dims -----------------------------------------------------------------


class _TwoInputs(torch.nn.Module):
    def forward(self, x, pair):
        return x.sum(0) + pair["a"] * pair["b"].mean()


def test_dynamic_dim_guards_name_the_users_arguments_as_torch_export_does():
    """``fake_with_dynamic_dims`` names each dynamic input ``flat_args[i]``, the source torch's
    unlifting rewrites into the user's argument path when it turns shape guards into
    ``ep.module()``'s runtime checks. Pins: for inputs outside the exported ranges, our
    program's check fails with torch.export's very message (``x.size()[0] <= 10``)."""
    n = torch.export.Dim("n", min=2, max=10)
    m = torch.export.Dim("m", min=2, max=8)
    args = (torch.randn(4, 3), {"a": torch.randn(3), "b": torch.randn(5)})
    spec = ({0: n}, {"a": None, "b": {0: m}})
    bad_calls = [
        (torch.randn(11, 3), {"a": torch.randn(3), "b": torch.randn(5)}),
        (torch.randn(4, 5), {"a": torch.randn(3), "b": torch.randn(5)}),
        (torch.randn(4, 3), {"a": torch.randn(3), "b": torch.randn(9)}),
    ]

    def messages(program):
        found = []
        for call in bad_calls:
            with pytest.raises(Exception) as info:  # noqa: B017  (torch's type may change; its text is compared)
                program(*call)
            found.append(str(info.value).splitlines()[0])
        return found

    ours = messages(pf.export(_TwoInputs(), args, dynamic_shapes=spec).module())
    torchs = messages(torch.export.export(_TwoInputs(), args, dynamic_shapes=spec).module())
    assert ours == torchs
    assert "x.size()[0]" in ours[0] and "flat_args" not in " ".join(ours)


# --- last_recorded_node, erase_if_last_recorded, redirect_traced_tensor ---------------------


def test_last_recorded_node_is_the_last_node_of_torchs_tracer_graph():
    """``last_recorded_node`` reads the tracer graph's sentinel (``graph._root.prev``) and
    ``erase_if_last_recorded`` erases only a node nothing came after. Pins: fx's graph keeps
    its nodes as a list closed by ``_root``, in the order torch's pre-dispatch tracer records."""
    seen = {}

    def f(x):
        y = x * 2
        seen["after_mul"] = tc.last_recorded_node()
        marker = tc.record_grad_marker(False)
        seen["erased"] = tc.erase_if_last_recorded(marker)
        marker = tc.record_grad_marker(False)
        z = y + 1
        seen["kept"] = tc.erase_if_last_recorded(marker)
        return z

    gm = tc.make_fx(f, pre_dispatch=True)(torch.randn(3))
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    assert seen["after_mul"] is calls[0] and calls[0].target is A.mul.Tensor
    assert seen["erased"] is True and seen["kept"] is False
    assert [n.target for n in calls] == [A.mul.Tensor, tc.SET_GRAD_ENABLED, A.add.Tensor]
    assert tc.last_recorded_node() is None  # outside a trace


def test_redirected_tensor_is_read_through_the_given_node():
    """``redirect_traced_tensor`` rewrites the tracer's ``tensor_tracker`` entry
    (``_ProxyTensor``). Pins: an op reading the tensor afterwards records the node given,
    as torch's tracer records a tensor it tracks."""
    def f(x):
        y = x * 2
        tc.redirect_traced_tensor(x, tc.proxy_node_of(y))
        return x + 1

    gm = tc.make_fx(f, pre_dispatch=True)(torch.randn(3))
    mul, add = [n for n in gm.graph.nodes if n.op == "call_function"]
    assert add.target is A.add.Tensor and add.args[0] is mul


# --- flex_attention_joint_graph -------------------------------------------------------------


def test_flex_attention_joint_graph_is_the_one_torchs_flex_attention_autograd_builds():
    """``flex_attention_joint_graph`` restates the example values torch's flex_attention
    autograd hands ``create_fw_bw_graph`` (a 0-d float that requires grad, four 0-d ints).
    Pins: torch's flex_attention HOP run eagerly on inputs that require grad and our function
    build their joint graphs from the same example values, and get the same graph."""
    import importlib

    from torch.nn.attention.flex_attention import create_block_mask

    flex_module = importlib.import_module("torch._higher_order_ops.flex_attention")  # the HOP shadows it
    calls = []
    original = flex_module.create_fw_bw_graph

    def recording(score_mod, index_values, other_buffers):
        fw, joint = original(score_mod, index_values, other_buffers)
        calls.append(([(tuple(v.shape), v.dtype, v.requires_grad) for v in index_values], joint.code))
        return fw, joint

    def score_mod(s, b, h, qi, ki):
        return s * 0.5 + (qi - ki)

    q, k, v = (torch.randn(1, 2, 128, 16, requires_grad=True) for _ in range(3))
    mask = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, 128, 128, device="cpu")
    with unittest.mock.patch.object(flex_module, "create_fw_bw_graph", recording):
        # the HOP itself: torch.nn.attention's wrapper refuses backward on CPU before it
        flex_module.flex_attention(q, k, v, score_mod, mask.as_tuple(), 0.25, {})
        torchs = calls[-1]
        tc.flex_attention_joint_graph(score_mod, q.detach(), ())
        ours = calls[-1]
    assert len(calls) == 2
    assert ours == torchs


def test_symbolic_int_input_is_the_one_torch_export_makes():
    """``symbolic_int`` (a Python int input under Dim.DYNAMIC) restates how torch.export makes
    such an input symbolic: the same SymIntArgument in the signature, the same unbounded range,
    and ``ep.module()`` taking every int torch's program takes."""
    from torch.export import Dim

    class ScaleByInt(torch.nn.Module):
        def forward(self, x, n):
            return x * n

    model, x = ScaleByInt(), torch.randn(3)
    ours = pf.export(model, (x, 4), dynamic_shapes=(None, Dim.DYNAMIC))
    theirs = torch.export.export(model, (x, 4), dynamic_shapes=(None, Dim.DYNAMIC))
    for ep in (ours, theirs):
        assert type(ep.graph_signature.input_specs[-1].arg).__name__ == "SymIntArgument"
    assert [(r.lower, r.upper) for r in ours.range_constraints.values()] == \
        [(r.lower, r.upper) for r in theirs.range_constraints.values()]
    for n in (0, 1, 5, 1000):
        torch.testing.assert_close(ours.module()(x, n), theirs.module()(x, n))
    with pytest.raises(pf.UnsupportedError, match="named Dim"):  # torch.export refuses these too
        pf.export(model, (x, 4), dynamic_shapes=(None, Dim("n")))


# --- fake_of_plain_state --------------------------------------------------------------------


def _plain_states() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    frozen = torch.nn.Parameter(torch.randn(3, 4, generator=g), requires_grad=False)
    return {
        "parameter": torch.nn.Parameter(torch.randn(3, 4, generator=g)),
        "frozen parameter": frozen,
        "channels-last parameter": torch.nn.Parameter(
            torch.randn(2, 3, 4, 5, generator=g).to(memory_format=torch.channels_last)),
        "column-major buffer": torch.empty_strided((5, 3), (1, 5)).copy_(torch.randn(5, 3, generator=g)),
        "int64 buffer": torch.arange(6),
        "bool buffer": torch.ones(2, 2, dtype=torch.bool),
        "bfloat16 buffer": torch.randn(4, generator=g).bfloat16(),
        "0-dim buffer": torch.tensor(3.0),
        "empty buffer": torch.empty(0, 3),
    }


def _not_plain_states() -> dict[str, torch.Tensor]:
    base = torch.randn(4, 4)
    with_grad = torch.nn.Parameter(torch.randn(2))
    with_grad.grad = torch.ones(2)
    with torch.inference_mode():
        inference = torch.randn(2)
    return {
        "view": base[1],
        "slice at an offset": base[1:].clone()[1:],
        "expanded": torch.randn(1, 3).expand(2, 3),
        "with a gradient": with_grad,
        "conj bit": torch.randn(2, dtype=torch.complex64).conj(),
        "inference tensor": inference,
        "nn.Buffer": torch.nn.Buffer(torch.randn(2)),
        "non-leaf": torch.randn(2, requires_grad=True) * 2,
        "meta": torch.empty(2, device="meta"),
        "sparse": torch.randn(2, 2).to_sparse(),
    }


def _described(fake: torch.Tensor) -> dict:
    return {"type": type(fake), "shape": fake.shape, "stride": fake.stride(), "offset": fake.storage_offset(),
            "dtype": fake.dtype, "device": fake.device, "fake device": fake.fake_device,
            "requires_grad": fake.requires_grad, "is_leaf": fake.is_leaf,
            "parameter": isinstance(fake, torch.nn.Parameter), "attributes": sorted(vars(fake)),
            "storage bytes": fake.untyped_storage().nbytes(), "keys": str(torch._C._dispatch_keys(fake)),
            "constant": fake.constant}


def _fake_mode():
    return tc.FakeTensorMode(shape_env=tc.ShapeEnv(), allow_non_fake_inputs=True)


@pytest.mark.parametrize("name", list(_plain_states()))
def test_plain_state_is_faked_as_torchs_from_tensor_fakes_it(name):
    t = _plain_states()[name]
    ours_mode, torchs_mode = _fake_mode(), _fake_mode()
    ours = tc.fake_of_plain_state(ours_mode, t)
    assert ours is not None, "a plain tensor took torch's path"
    assert _described(ours) == _described(torchs_mode.from_tensor(t, static_shapes=True))
    # the memos: torch's converter finds our fake for the tensor and builds its views on our storage
    assert ours_mode.from_tensor(t, static_shapes=True) is ours
    if t.dim() and t.numel():
        view = ours_mode.from_tensor(t[0], static_shapes=True)
        assert view.untyped_storage()._cdata == ours.untyped_storage()._cdata
        assert _described(view) == _described(torchs_mode.from_tensor(t[0], static_shapes=True))


@pytest.mark.parametrize("name", ["parameter", "frozen parameter", "int64 buffer"])
def test_plain_state_is_faked_as_torch_fakes_it_under_no_grad_and_left_to_torch_under_inference_mode(name):
    t = _plain_states()[name]
    with torch.no_grad():
        ours = tc.fake_of_plain_state(_fake_mode(), t)
        assert ours is not None and _described(ours) == _described(_fake_mode().from_tensor(t, static_shapes=True))
    with torch.inference_mode():
        assert tc.fake_of_plain_state(_fake_mode(), t) is None


@pytest.mark.parametrize("name", list(_not_plain_states()))
def test_any_other_tensor_is_left_to_torchs_from_tensor(name):
    assert tc.fake_of_plain_state(_fake_mode(), _not_plain_states()[name]) is None


def test_a_tensor_sharing_a_faked_storage_is_left_to_torch_which_shares_it():
    mode, storage_owner = _fake_mode(), torch.randn(6)
    sharer = torch.empty(0).set_(storage_owner.untyped_storage(), 0, (6,), (1,))
    fake = tc.fake_of_plain_state(mode, storage_owner)
    assert fake is not None and tc.fake_of_plain_state(mode, sharer) is None
    assert mode.from_tensor(sharer, static_shapes=True).untyped_storage()._cdata == fake.untyped_storage()._cdata


class _SharesItsState(torch.nn.Module):
    """One parameter under two names, a buffer viewing a parameter, an input viewing a
    parameter: state whose fakes must alias as the tensors do."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(4, 4))
        self.tied = self.weight
        self.register_buffer("row", self.weight.detach()[0])
        self.register_buffer("steps", torch.zeros(()))

    def forward(self, x, w):
        self.steps.add_(1)
        return x @ self.tied + self.row * w.sum() + self.steps


def _state_programs():
    from tests.models.corpus import build as build_corpus
    from tests.support.cases_core import CASES, build

    for name in sorted(CASES):
        model, args, kwargs = build(name)
        if isinstance(model, torch.nn.Module) and [*model.parameters(), *model.buffers()]:
            yield name, lambda name=name: build(name)
    for name in ("small_cnn", "bart"):
        yield name, lambda name=name: build_corpus(name)

    def shares():
        torch.manual_seed(0)
        model = _SharesItsState()
        return model, (torch.randn(3, 4), model.weight.detach()[1]), {}
    yield "shares its state", shares


def test_every_program_with_state_is_the_one_torchs_from_tensor_gives():
    from predispatch_func.errors import ExportError
    from predispatch_func.graphs import all_graph_modules

    def program(build) -> str:
        model, args, kwargs = build()
        try:
            ep = pf.export(model, args, kwargs)
        except ExportError as exc:
            return f"refused: {exc}"
        return "\n".join([str(ep.graph_signature)] + [f"{path}:\n{gm.code}" for path, gm in
                                                      all_graph_modules(ep.graph_module)])

    compared = 0
    for name, build in _state_programs():
        ours = program(build)
        with unittest.mock.patch.object(tc, "fake_of_plain_state", lambda mode, t: None):
            torchs = program(build)
        assert ours == torchs, name
        compared += not ours.startswith("refused")
    assert compared >= 18


def test_state_sharing_storage_exports_and_replays_against_eager():
    from tests.support.reference import export_checked

    torch.manual_seed(0)
    model = _SharesItsState()
    export_checked(model, (torch.randn(3, 4), model.weight.detach()[1]))


def test_only_the_user_inputs_of_a_model_with_plain_state_take_torchs_from_tensor():
    converted = []
    real = tc.FakeTensorMode.from_tensor

    def counting(self, t, **kwargs):
        converted.append(tuple(t.shape))
        return real(self, t, **kwargs)

    model = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.BatchNorm1d(5))
    with unittest.mock.patch.object(tc.FakeTensorMode, "from_tensor", counting):
        pf.export(model, (torch.randn(3, 4),))
    assert converted == [(3, 4)]


# --- tensor_meta: static_tensor_metadata against torch's _extract_tensor_metadata -----------


def _strided_layouts():
    """Every shape of up to five dims with sizes 0-3 (up to three dims) or 1-2, each laid out
    contiguous, in every dim order (up to four dims), channels-last where it applies, with a
    dim expanded (stride 0) and with every stride doubled (a strided slice)."""
    import itertools

    def orders(ndim):
        return itertools.permutations(range(ndim)) if ndim <= 4 else [tuple(range(ndim)), (0, 2, 3, 4, 1),
                                                                      (4, 3, 2, 1, 0)]

    for ndim in range(6):
        for shape in itertools.product(range(4) if ndim <= 3 else range(1, 3), repeat=ndim):
            for order in orders(ndim):  # order[0] outermost
                stride, step = [0] * ndim, 1
                for dim in reversed(order):
                    stride[dim], step = step, step * max(shape[dim], 1)
                yield shape, tuple(stride)
                yield shape, tuple(2 * s for s in stride)
                for dim in range(ndim):
                    yield shape, tuple(0 if d == dim else s for d, s in enumerate(stride))


def test_static_tensor_metadata_is_torchs_on_every_small_strided_layout():
    from torch.fx.passes.shape_prop import _extract_tensor_metadata

    mode, compared, formats = _fake_mode(), 0, set()
    for shape, stride in _strided_layouts():
        real = torch.empty_strided(shape, stride)
        for t in (real, mode.from_tensor(real, static_shapes=True)):
            ours = tc.static_tensor_metadata(t)
            assert ours == _extract_tensor_metadata(t), (shape, stride)
            formats.add(ours.memory_format)
            compared += 1
    assert formats == {torch.contiguous_format, torch.channels_last, torch.channels_last_3d, None}
    assert compared > 10_000


@pytest.mark.parametrize(("dtype", "requires_grad"), [
    (torch.float16, False), (torch.float16, True), (torch.complex64, False), (torch.complex64, True),
    (torch.bool, False), (torch.int64, False)])  # only float and complex tensors require grad
def test_static_tensor_metadata_is_torchs_for_each_dtype_and_grad_flag(dtype, requires_grad):
    from torch.fx.passes.shape_prop import _extract_tensor_metadata

    t = torch.zeros(2, 3, 4, 5, dtype=dtype).to(memory_format=torch.channels_last).requires_grad_(requires_grad)
    for value in (t, _fake_mode().from_tensor(t, static_shapes=True)):
        assert tc.static_tensor_metadata(value) == _extract_tensor_metadata(value)


def test_static_tensor_metadata_leaves_sparse_quantized_and_symbolic_tensors_to_torch():
    from torch.fx.experimental.symbolic_shapes import DimDynamic, StatelessSymbolicContext

    mode = _fake_mode()
    symbolic = mode.from_tensor(torch.randn(3, 4), symbolic_context=StatelessSymbolicContext(
        dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.STATIC]))
    quantized = torch.quantize_per_tensor(torch.randn(2, 2), 0.1, 0, torch.quint8)
    for t in (torch.randn(2, 2).to_sparse(), torch.randn(2, 2).to_sparse_csr(), quantized, symbolic):
        assert tc.static_tensor_metadata(t) is None


def _torchs_tensor_metadata(fast):
    """In place of ``tc.tensor_metadata_recorded_through``: torch's own ``tensor_meta`` throughout."""
    return contextlib.nullcontext()


def _meta_of_every_node(ep) -> list:
    from predispatch_func.graphs import all_graph_modules

    return [(path, node.name, node.meta.get("tensor_meta")) for path, gm in all_graph_modules(ep.graph_module)
            for node in gm.graph.nodes]


def test_every_catalogue_program_records_the_tensor_meta_torchs_tracer_records():
    from predispatch_func.errors import ExportError
    from tests.support.cases_core import CASES, build

    compared = 0
    for name in sorted(CASES):
        programs = []
        for patch in (tc.tensor_metadata_recorded_through, _torchs_tensor_metadata):
            model, args, kwargs = build(name)
            with unittest.mock.patch.object(tc, "tensor_metadata_recorded_through", patch):
                try:
                    programs.append(_meta_of_every_node(pf.export(model, args, kwargs)))
                except ExportError as exc:
                    programs.append(f"refused: {exc}")
        assert programs[0] == programs[1], name
        compared += isinstance(programs[0], list)
    assert compared >= 50


def test_a_program_with_dynamic_dims_records_torchs_tensor_meta():
    class Model(torch.nn.Module):
        def forward(self, x):
            return (x.t() @ x).relu().unsqueeze(0).expand(2, -1, -1)

    x = torch.randn(5, 3)
    shapes = {"x": {0: torch.export.Dim("n", min=2)}}
    fast = pf.export(Model(), (x,), dynamic_shapes=shapes)
    with unittest.mock.patch.object(tc, "tensor_metadata_recorded_through", _torchs_tensor_metadata):
        torchs = pf.export(Model(), (x,), dynamic_shapes=shapes)
    assert str(_meta_of_every_node(fast)) == str(_meta_of_every_node(torchs))
    assert any(isinstance(s, torch.SymInt) for _, _, meta in _meta_of_every_node(fast) if meta for s in meta.shape)


# --- meta["val"]: node_values_unsnapshotted against torch's snapshot_fake ----------------------


def _described_values(ep) -> list:
    """Every node's ``meta["val"]`` as metadata, and which values share a storage (by first use)."""
    from predispatch_func.graphs import all_graph_modules

    storages: dict = {}

    def one(v):
        if isinstance(v, (list, tuple)):
            return type(v).__name__, [one(x) for x in v]
        if not isinstance(v, torch.Tensor):
            return repr(v)
        key = v.untyped_storage()._cdata if v.layout is torch.strided else id(v)
        return (type(v).__name__, str(v.shape), v.stride() if v.layout is torch.strided else None,
                v.storage_offset() if v.layout is torch.strided else None, v.dtype, str(v.device), v.requires_grad,
                v.is_leaf, getattr(v, "constant", None) is not None, storages.setdefault(key, len(storages)))
    return [(path, node.name, one(node.meta.get("val"))) for path, gm in all_graph_modules(ep.graph_module)
            for node in gm.graph.nodes]


def _torchs_node_values():
    """In place of ``tc.node_values_unsnapshotted``: torch's detached copies throughout."""
    return contextlib.nullcontext()


def _value_programs():
    from tests.support.cases_core import CASES, build
    from tests.support.hop_db_cases import exportdb_cases, hop_db_cases

    for name in sorted(CASES):
        yield name, lambda name=name: build(name)
    for name, model, args, skip in [*hop_db_cases(1), *exportdb_cases()]:
        if skip is None:
            yield name, lambda model=model, args=args: (model, args, {})


def test_every_program_records_the_node_values_torchs_snapshots_record():
    from predispatch_func.errors import ExportError

    compared = 0
    for name, build in _value_programs():
        programs = []
        for patch in (tc.node_values_unsnapshotted, _torchs_node_values):
            model, args, kwargs = build()
            with unittest.mock.patch.object(tc, "node_values_unsnapshotted", patch):
                try:
                    ep = pf.export(model, args, kwargs)
                    programs.append((ep.graph_module.code, _described_values(ep)))
                except ExportError as exc:
                    programs.append(f"refused: {exc}")
        assert programs[0] == programs[1], name
        compared += not isinstance(programs[0], str)
    assert compared >= 80


def _as_the_trace_nests_them():
    """The two proxy_call patches as trace_functional enters them: the direct recorder first,
    so node_values_unsnapshotted's write guard runs before every call, recorded directly or not."""
    stack = contextlib.ExitStack()
    stack.enter_context(tc.op_calls_recorded_through(tc.record_op_call))
    stack.enter_context(tc.node_values_unsnapshotted())
    return stack


@pytest.mark.parametrize("patch", [tc.node_values_unsnapshotted, _as_the_trace_nests_them],
                         ids=["node-values", "with-the-direct-recorder"])
def test_a_tensor_written_after_its_node_is_recorded_gets_torchs_copy_first(patch):
    """Below functionalization no op writes a traced tensor; make_fx without functionalization
    does: the node that made ``y`` keeps ``y``'s metadata from before ``t_()`` and ``unsqueeze_``."""
    def f(x):
        y = x * 2
        a, b = y.split(2)
        y.t_()
        a.unsqueeze_(0)
        return y + 1, a

    recorded, record = [], tc.record_op_call

    def counted(*args):
        out = record(*args)
        recorded.append(out is not tc.NOT_RECORDED)
        return out

    def values(patch):
        with unittest.mock.patch.object(tc, "record_op_call", counted), patch():
            gm = tc.make_fx(f, tracing_mode="fake", pre_dispatch=True)(torch.randn(4, 3))
        return [(n.name, str(n.meta["val"]) if not isinstance(n.meta.get("val"), (list, tuple))
                 else [str(v) for v in n.meta["val"]]) for n in gm.graph.nodes if "val" in n.meta]

    ours = values(patch)
    assert ours == values(_torchs_node_values)
    assert ("mul", "FakeTensor(..., size=(4, 3))") in ours
    if patch is _as_the_trace_nests_them:  # the writes themselves were recorded directly
        assert len(recorded) >= 4 and all(recorded), recorded


# --- op calls: record_op_call against fx's proxy_call ------------------------------------------

# an object's address or id, generated code's number
_ADDRESS = re.compile(r" at 0x[0-9a-f]+|(?<=graph_id=)\d+|(?<=<eval_with_key>\.)\d+")


def _described_nodes(ep) -> list:
    """Every node of every graph module: name, kind, target, arguments, and each meta entry
    (``val`` as :func:`_described_values` describes it, ``seq_nr`` as its rank in the
    program, the others by repr without object addresses and generated code's numbers)."""
    from predispatch_func.graphs import all_graph_modules

    values = {(path, name): value for path, name, value in _described_values(ep)}
    nodes = [(path, node) for path, gm in all_graph_modules(ep.graph_module) for node in gm.graph.nodes]
    ranks = {s: i for i, s in enumerate(sorted({n.meta["seq_nr"] for _, n in nodes if "seq_nr" in n.meta}))}

    def entry(path, node, key, value):
        if key == "val":
            return values[(path, node.name)]
        return ranks[value] if key == "seq_nr" else _ADDRESS.sub("", repr(value))
    return [(path, node.name, node.op, str(node.target), str(node.args), str(node.kwargs),
             [(key, entry(path, node, key, value)) for key, value in sorted(node.meta.items())])
            for path, node in nodes]


def _torchs_op_calls(direct):
    """In place of ``tc.op_calls_recorded_through``: torch's ``proxy_call`` for every call."""
    return contextlib.nullcontext()


def _recorded_both_ways(build, export=pf.export, below_autograd_only=False) -> tuple[list, int, int]:
    """The program ``export(*build())`` records with ``record_op_call`` and with torch's
    ``proxy_call`` alone (or the refusal each gave); how many op calls ``record_op_call``
    recorded itself, of how many (with ``below_autograd_only``: of the calls of a proxy mode
    below autograd, ``pre_dispatch=False``)."""
    from predispatch_func.errors import ExportError

    counts, record = [0, 0], tc.record_op_call

    def counted(mode, func, pre_dispatch, *rest):
        out = record(mode, func, pre_dispatch, *rest)
        if not (below_autograd_only and pre_dispatch):
            counts[0] += out is not tc.NOT_RECORDED
            counts[1] += 1
        return out
    programs = []
    # the first export fills the process's trace-time caches: a check run on a miss between two
    # nodes takes an autograd sequence number, and a node's seq_nr would tell a cold export
    for patch in (_torchs_op_calls, tc.op_calls_recorded_through, _torchs_op_calls):
        built = build()
        with unittest.mock.patch.object(tc, "op_calls_recorded_through", patch), \
                unittest.mock.patch.object(tc, "record_op_call", counted):
            try:
                ep = export(*built)
                programs.append([(path, gm.code) for path, gm in _graph_modules(ep)] + _described_nodes(ep))
            except ExportError as exc:
                programs.append(f"refused: {exc}")
    return programs[1:], *counts


def _graph_modules(ep):
    from predispatch_func.graphs import all_graph_modules

    return all_graph_modules(ep.graph_module)


def test_every_program_records_the_nodes_torchs_proxy_call_records():
    compared = direct = calls = 0
    for name, build in _value_programs():
        programs, recorded, called = _recorded_both_ways(build)
        assert programs[0] == programs[1], name
        compared += not isinstance(programs[0], str)
        direct, calls = direct + recorded, calls + called
    assert compared >= 80
    assert direct >= 0.6 * calls, (direct, calls)  # the common call is recorded directly


@pytest.mark.parametrize("name", ["small_cnn", *(pytest.param(n, marks=pytest.mark.deep) for n in ("bert", "llama", "t5"))])
def test_corpus_models_record_the_nodes_torchs_proxy_call_records(name):
    from tests.models import corpus

    for train in (False, True):
        programs, recorded, called = _recorded_both_ways(lambda train=train: corpus.build(name, train=train))
        assert not isinstance(programs[0], str), programs[0]
        assert programs[0] == programs[1], (name, train)
        assert recorded >= 0.8 * called, (name, train, recorded, called)


def test_programs_below_autograd_record_the_nodes_torchs_proxy_call_records():
    """``pre_dispatch=False``: the proxy mode sits below autograd, where torch's proxy_call may
    decompose a CompositeImplicitAutograd op; record_op_call records the other calls itself."""
    from tests.support.cases_core import CASES, build

    compared = direct = calls = 0
    for name in sorted(CASES):
        programs, recorded, called = _recorded_both_ways(
            lambda name=name: build(name), export=lambda m, a, k: pf.export(m, a, k, pre_dispatch=False),
            below_autograd_only=True)
        assert programs[0] == programs[1], name
        compared += not isinstance(programs[0], str)
        direct, calls = direct + recorded, calls + called
    assert compared >= 50
    assert direct >= 0.8 * calls, (direct, calls)


@pytest.mark.parametrize("name", ["joint_cases", "small_cnn", "distilbert"])
def test_joint_programs_record_the_nodes_torchs_proxy_call_records(name):
    """The joint trace records the forward and the backward with record_op_call, and the
    values the backward recomputes below autograd (joint/saved_values.py) too."""
    from scripts.joint_corpus import first_float_loss
    from tests.joint.cases import _ON_211
    from tests.joint.cases import CASES as JOINT_CASES
    from tests.models import corpus

    def joint_export(model, args, kwargs, loss_fn):
        return pf.export_joint(model, args, kwargs, loss_fn=loss_fn)

    if name == "joint_cases":
        builds = [case.build for case in JOINT_CASES.values()]
    else:
        builds = [lambda: (*corpus.build(name, train=True), first_float_loss)]
    compared = direct = calls = 0
    for build in builds:
        programs, recorded, called = _recorded_both_ways(build, export=joint_export, below_autograd_only=True)
        assert programs[0] == programs[1], name
        compared += not isinstance(programs[0], str)
        direct, calls = direct + recorded, calls + called
    # every program compared (torch 2.11 refuses activation_checkpoint: tests/joint/cases.py's CASE_MARKS)
    assert compared >= len(builds) - (name == "joint_cases" and _ON_211), programs[0]
    assert calls > 0 and direct >= 0.8 * calls, (direct, calls)  # the recomputations are recorded directly


def _directly_recorded(model, args) -> list[str]:
    recorded, record = [], tc.record_op_call

    def counted(mode, func, *rest):
        out = record(mode, func, *rest)
        if out is not tc.NOT_RECORDED:
            recorded.append(str(func))
        return out
    with unittest.mock.patch.object(tc, "record_op_call", counted):
        pf.export(model, args)
    return recorded


@pytest.mark.skipif(not hasattr(torch.compiler.config, "compile_on_one_rank"),
                    reason="this torch has no compile-on-one-rank device rewriting")
def test_a_device_argument_is_left_to_torch_where_compile_on_one_rank_may_rewrite_it():
    class Model(torch.nn.Module):
        def forward(self, x):
            return x + torch.arange(3, device=x.device)

    assert "aten.arange.default" in _directly_recorded(Model(), (torch.randn(3),))
    with torch.compiler.config.patch(compile_on_one_rank=True):
        assert "aten.arange.default" not in _directly_recorded(Model(), (torch.randn(3),))


def _overlap_pairs():
    """(destination, input) pairs over one storage: shifted, transposed, strided, the same tensor,
    the same memory through other strides, disjoint halves, an expanded read."""
    base = torch.arange(16.0)
    square = base.view(4, 4)
    return {
        "shifted": (base[1:9], base[0:8]),
        "transposed": (square, square.t()),
        "strided read": (base[:4], base[::4]),
        "itself": (base, base),
        "same view twice": (square[:2], square[:2]),
        "disjoint halves": (base[:8], base[8:]),
        "expanded read": (base[:4], base[:1].expand(4)),
        "2-d shifted rows": (square[1:3], square[0:2]),
    }


@pytest.mark.parametrize("name", list(_overlap_pairs()))
def test_partially_overlapping_says_what_eagers_kernels_refuse(name):
    destination, source = _overlap_pairs()[name]
    try:
        destination.add_(source)
        refused = False
    except RuntimeError as exc:
        assert "some elements of the input tensor and the written-to tensor" in str(exc)
        refused = True
    destination, source = _overlap_pairs()[name]
    assert tc.partially_overlapping(destination, source) == refused


class _Wrapper(torch.Tensor):
    """A wrapper subclass as backends written in Python make them: no data of its own."""

    @staticmethod
    def __new__(cls, value):
        out = torch.Tensor._make_wrapper_subclass(cls, value.size(), dtype=value.dtype, device=value.device)
        out.value = value
        return out

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        unwrap = lambda t: t.value if isinstance(t, _Wrapper) else t  # noqa: E731
        return func(*torch.utils._pytree.tree_map(unwrap, args), **torch.utils._pytree.tree_map(unwrap, kwargs or {}))


def test_memory_is_torchs_only_where_the_data_pointer_reads():
    """The overlap checks (pf.eager's and its C++ kernel's) read data pointers only where
    tc.memory_is_torchs says so: a wrapper subclass's storage raises on it."""
    plain, wrapper = torch.zeros(3), _Wrapper(torch.zeros(3))
    assert tc.memory_is_torchs(plain) and plain.untyped_storage().data_ptr() == plain.data_ptr()
    assert not tc.memory_is_torchs(wrapper)
    with pytest.raises(RuntimeError, match="invalid python storage"):
        wrapper.untyped_storage().data_ptr()
    with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
        fake = mode.from_tensor(plain)
    assert not tc.memory_is_torchs(fake)


# --- stack capture only under a recordable frame ------------------------------------------------


def _captured_both_ways(build, export=pf.export) -> tuple[list, int]:
    """The program ``export(*build())`` records with ``stack_capture_only_under_a_recordable_frame``
    and with fx capturing every node's stack (first, and dropped: it fills the process's caches,
    as above), described node by node; and how many captures the patch skipped."""
    from predispatch_func._torch_compat import patches
    from predispatch_func.errors import ExportError

    skipped = [0]
    looks = patches._a_recordable_frame_on_the_stack

    def counted(frame, anchors):
        found = looks(frame, anchors)
        skipped[0] += not found
        return found
    programs = []
    for variant in (contextlib.nullcontext, tc.stack_capture_only_under_a_recordable_frame, contextlib.nullcontext):
        with unittest.mock.patch.object(tc, "stack_capture_only_under_a_recordable_frame", variant), \
                unittest.mock.patch.object(patches, "_a_recordable_frame_on_the_stack", counted):
            try:
                programs.append(_described_nodes(export(*build())))
            except ExportError as exc:
                programs.append(f"refused: {exc}")
    return programs[1:], skipped[0]


@pytest.mark.deep  # three exports of every catalogue program: the default suite keeps small_cnn's below
def test_every_program_records_the_stack_traces_fxs_full_capture_records():
    """Skipping fx's capture where no frame its filter keeps is on the stack changes no node's
    metadata (stack traces above all), in the forward programs and their bodies."""
    compared = skipped = 0
    for name, build in _value_programs():
        programs, skips = _captured_both_ways(build)
        assert programs[0] == programs[1], name
        compared += not isinstance(programs[0], str)
        skipped += skips
    assert compared >= 80
    assert skipped >= 5 * compared, skipped  # the placeholders and outputs of each graph at least


@pytest.mark.parametrize("name", ["small_cnn", *(pytest.param(n, marks=pytest.mark.deep) for n in ("bert", "t5"))])
def test_corpus_and_joint_programs_record_the_stack_traces_fxs_full_capture_records(name):
    from tests.fuzz.harness import fuzz_loss
    from tests.models import corpus

    for export in (pf.export, lambda m, a, k: pf.export_joint(m, a, k, loss_fn=fuzz_loss)):
        programs, skipped = _captured_both_ways(lambda: corpus.build(name, train=True), export=export)
        assert not isinstance(programs[0], str), programs[0]
        assert programs[0] == programs[1], name
        assert skipped >= 5, skipped


def test_fxs_stack_filter_keeps_nothing_without_a_forward_frame():
    """The assumption the patch rests on: fx's tracer records a stack trace for a node made under a
    ``forward`` frame and none for one made with no frame its filter keeps; the patch skips only
    the capture of the second."""
    calls = []

    def made_here(tracer):
        return tracer.create_node("call_function", torch.add, (1, 2), {})

    def forward(tracer):
        return made_here(tracer)

    for patched in (False, True):
        tracer = torch.fx.proxy.GraphAppendingTracer(torch.fx.Graph())
        tracer.record_stack_traces = True
        with tc.stack_capture_only_under_a_recordable_frame() if patched else contextlib.nullcontext():
            calls.append((bool(made_here(tracer).stack_trace), bool(forward(tracer).stack_trace)))
    assert calls == [(False, True), (False, True)], calls


def test_a_tracer_with_its_own_stack_filter_is_left_alone():
    class KeepingAll(torch.fx.proxy.GraphAppendingTracer):
        def _filter_traceback_frames(self, summary):
            return summary

    tracer = KeepingAll(torch.fx.Graph())
    tracer.record_stack_traces = True
    with tc.stack_capture_only_under_a_recordable_frame():
        node = tracer.create_node("call_function", torch.add, (1, 2), {})
    assert node.stack_trace and "test_a_tracer_with_its_own_stack_filter_is_left_alone" in node.stack_trace


# --- module methods left unpatched -------------------------------------------------------------


def _exported_both_ways(build, export=pf.export) -> list:
    """The program ``export(*build())`` records with ``module_methods_left_unpatched`` and with fx
    patching ``nn.Module.__call__`` and ``__getattr__`` as it does (first, and dropped: it fills the
    process's caches, as above), described node by node."""
    from predispatch_func.errors import ExportError

    programs = []
    for variant in (contextlib.nullcontext, tc.module_methods_left_unpatched, contextlib.nullcontext):
        with unittest.mock.patch.object(tc, "module_methods_left_unpatched", variant):
            try:
                programs.append(_described_nodes(export(*build())))
            except ExportError as exc:
                programs.append(f"refused: {exc}")
    return programs[1:]


@pytest.mark.deep  # three exports of every catalogue program
def test_every_program_is_the_one_traced_with_fxs_module_patches():
    """make_fx's tracer passes module calls and attribute reads through: leaving fx's patches of
    ``nn.Module`` out changes no node of any program, forward or body."""
    compared = 0
    for name, build in _value_programs():
        programs = _exported_both_ways(build)
        assert programs[0] == programs[1], name
        compared += not isinstance(programs[0], str)
    assert compared >= 80


@pytest.mark.parametrize("name", ["small_cnn", *(pytest.param(n, marks=pytest.mark.deep) for n in ("bert", "t5"))])
def test_corpus_and_joint_programs_are_the_ones_traced_with_fxs_module_patches(name):
    from tests.fuzz.harness import fuzz_loss
    from tests.models import corpus

    for export in (pf.export, lambda m, a, k: pf.export_joint(m, a, k, loss_fn=fuzz_loss)):
        programs = _exported_both_ways(lambda: corpus.build(name, train=True), export=export)
        assert not isinstance(programs[0], str), programs[0]
        assert programs[0] == programs[1], name


class _Gelu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * torch.sigmoid(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        s = torch.sigmoid(x)
        return grad * (s + x * s * (1 - s))


class _HookedBlocks(torch.nn.Module):
    """Submodules reached through ``__getattr__`` and ``__call__``, hooks, a custom Function's bodies."""

    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([torch.nn.Linear(4, 4) for _ in range(2)])
        self.norm = torch.nn.LayerNorm(4)
        self.blocks[0].register_forward_hook(lambda m, i, o: o * 2)
        self.norm.register_forward_pre_hook(lambda m, i: (i[0] + 1,))

    def forward(self, x):
        for block in self.blocks:
            x = _Gelu.apply(block(x))
        return self.norm(x) + self.blocks[1].bias


def _first_difference(a, b) -> str:
    if isinstance(a, str) or isinstance(b, str) or len(a) != len(b):
        return f"{str(a)[:500]}\n---\n{str(b)[:500]}"
    return next((f"{x}\n---\n{y}" for x, y in zip(a, b) if x != y), "")


def test_hooks_submodules_and_function_bodies_trace_alike_without_fxs_module_patches():
    programs = _exported_both_ways(lambda: (_HookedBlocks(), (torch.randn(3, 4),), {}))
    assert not isinstance(programs[0], str), programs[0]
    assert programs[0] == programs[1], _first_difference(*programs)
    joint = _exported_both_ways(lambda: (_HookedBlocks(), (torch.randn(3, 4),), {}),
                                export=lambda m, a, k: pf.export_joint(m, a, k, loss_fn=lambda out: out.sum()))
    assert joint[0] == joint[1], _first_difference(*joint)


def test_make_fxs_tracer_passes_module_calls_and_attributes_through():
    """What the patch rests on: make_fx's tracer's ``call_module`` calls ``forward`` with the
    arguments and returns its result, its ``getattr`` returns the value, it autowraps nothing, and
    fx's module wrappers close over it (how the patch finds the tracer)."""
    from torch.fx.experimental.proxy_tensor import PythonKeyTracer, make_fx

    from predispatch_func._torch_compat import patches

    tracer = PythonKeyTracer()
    seen = []
    result = tracer.call_module(torch.nn.Identity(), lambda *a, **k: seen.append((a, k)) or "out", (1,), {"k": 2})
    assert (result, seen) == ("out", [((1,), {"k": 2})])
    value = object()
    assert tracer.getattr("weight", value, {}) is value
    assert not tracer._autowrap_function_ids

    during = []

    def traced(x):
        during.append((torch.nn.Module.__dict__["__call__"], torch.nn.Module.__dict__["__getattr__"]))
        return x + 1

    plain = (torch.nn.Module.__dict__["__call__"], torch.nn.Module.__dict__["__getattr__"])
    make_fx(traced)(torch.randn(2))
    with tc.module_methods_left_unpatched():
        make_fx(traced)(torch.randn(2))
    assert during[0] != plain and all(patches._passes_modules_through(f) for f in during[0])
    assert during[1] == plain


def test_a_tracer_that_makes_modules_leaves_is_still_patched():
    """fx's own symbolic trace (a leaf module is a ``call_module`` node) is left to fx's patches."""
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU())
    with tc.module_methods_left_unpatched():
        gm = torch.fx.symbolic_trace(model)
    assert [n.op for n in gm.graph.nodes] == ["placeholder", "call_module", "call_module", "output"]
