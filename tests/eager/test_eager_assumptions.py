"""What ``pf.eager`` assumes about torch, each checked so a torch release that changes it fails here.

* CPU flash attention's decomposition returns the attention weights where the
  kernel returns the logsumexp its backward reads (why it is decomposed above
  autograd, ``above_autograd.WHY``);
* ``_weight_norm_interface_backward`` has no ATen decomposition (likewise);
* ``new_empty_strided`` has no ATen-level decomposition (why the shared table restates it,
  as it does ``var_mean.correction``);
* a Python-only PrivateUse1 backend can be set up (the test backend);
* a Python fallback on the spare key gets ``(keyset, op, *args)``, can send the op on below the
  key (``tc.fall_through_spare_key``) and can register the op's own kernel there while it runs
  (how a keyed session registers each op when it first meets it, ``session_key``).
"""

import subprocess
import sys

import pytest
import torch

import predispatch_func as pf
from predispatch_func import _torch_compat as tc
from predispatch_func.eager import above_autograd, extra_decompositions  # noqa: F401
from predispatch_func.opsets.lowering import core_decompositions
from tests.support.torch_release import torch_limit, torch_release

aten = torch.ops.aten


def test_cpu_flash_attention_decomposition_returns_other_second_output():
    q = torch.randn(1, 2, 4, 8)
    kernel = aten._scaled_dot_product_flash_attention_for_cpu.default
    out, logsumexp = kernel(q, q, q)
    dec_out, dec_second = {**tc.aten_decomposition_table(), **tc.core_aten_decomposition_table()}[kernel](q, q, q)
    torch.testing.assert_close(dec_out, out)
    assert dec_second.shape != logsumexp.shape or not torch.allclose(dec_second, logsumexp)
    assert kernel in extra_decompositions.CORRECTED  # ours returns the logsumexp
    assert core_decompositions()[kernel] is extra_decompositions.CORRECTED[kernel]  # export lowers with it too


def test_cpu_flash_attention_backward_has_no_decomposition():
    backward = aten._scaled_dot_product_flash_attention_for_cpu_backward.default
    assert backward not in {**tc.aten_decomposition_table(), **tc.core_aten_decomposition_table()}, \
        "torch now decomposes it: compare with ours"
    assert not tc.has_composite_implicit_kernel(backward)
    assert backward in extra_decompositions.CORRECTED


def test_weight_norm_backward_has_no_decomposition():
    assert aten._weight_norm_interface_backward.default not in core_decompositions()
    assert not tc.has_composite_implicit_kernel(aten._weight_norm_interface_backward.default)
    assert aten._weight_norm_interface.default in core_decompositions()


def test_extra_decompositions_are_still_missing_from_torch():
    for op in extra_decompositions.TABLE:
        assert op not in core_decompositions(), f"torch now decomposes {op}: drop ours"


def test_extra_decompositions_equal_eager():
    x = torch.randn(3, 5, dtype=torch.float64)
    made = core_decompositions()[aten.new_empty_strided.default](x, (2, 3), (1, 2))
    assert (made.shape, made.stride(), made.dtype) == ((2, 3), (1, 2), x.dtype)
    for rows, accumulate in (([2, 0], False), ([0, 2, 2], True)):
        indices, values = [torch.tensor(rows)], torch.randn(len(rows), 5, dtype=torch.float64)
        expected = aten._index_put_impl.default(x, indices, values, accumulate)
        got = extra_decompositions.TABLE[aten._index_put_impl.default](x, indices, values, accumulate)
        torch.testing.assert_close(got, expected)


def test_index_put_impl_kernel_calls_its_in_place_form():
    # why ours is needed: torch's kernel of the functional op is a composite calling _index_put_impl_
    assert tc.has_composite_explicit_kernel(aten._index_put_impl.default)
    assert aten._index_put_impl.default not in core_decompositions()


def test_python_privateuse1_backend_setup_exists():
    from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

    assert callable(_setup_privateuseone_for_python_backend)


def test_our_flash_attention_decomposition_returns_the_kernels_logsumexp():
    kernel = aten._scaled_dot_product_flash_attention_for_cpu.default
    ours = extra_decompositions.CORRECTED[kernel]
    q, k = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 6, 8)
    mask = torch.zeros(5, 6).masked_fill(torch.rand(5, 6) > 0.7, float("-inf"))
    mask[:, 0] = 0.0
    heads_second = torch.randn(2, 5, 4, 8).transpose(1, 2)  # as transformers lays the query out
    for kwargs in ({}, {"is_causal": True}, {"attn_mask": mask}, {"attn_mask": torch.randn(5, 6), "scale": 0.3},
                   {"query": heads_second}):
        causal = kwargs.pop("is_causal", False)
        q = kwargs.pop("query", q)
        expected = kernel(q, k, k, 0.0, causal, **kwargs)
        got = ours(q, k, k, 0.0, causal, **kwargs)
        torch.testing.assert_close(got, expected)
        assert got[1].stride() == expected[1].stride() and got[0].stride() == expected[0].stride()


def test_our_flash_attention_backward_equals_the_kernels():
    kernel = aten._scaled_dot_product_flash_attention_for_cpu_backward.default
    ours = extra_decompositions.CORRECTED[kernel]
    forward = aten._scaled_dot_product_flash_attention_for_cpu.default
    q, k, v = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 6, 8), torch.randn(2, 2, 6, 8)
    mask = torch.zeros(5, 6).masked_fill(torch.rand(5, 6) > 0.7, float("-inf"))
    mask[:, 0] = 0.0
    for kwargs in ({}, {"is_causal": True}, {"attn_mask": mask}, {"attn_mask": torch.randn(5, 6), "scale": 0.3}):
        causal = kwargs.pop("is_causal", False)
        out, logsumexp = forward(q, k, v, 0.0, causal, **kwargs)
        grad = torch.randn_like(out)
        expected = kernel(grad, q, k, v, out, logsumexp, 0.0, causal, **kwargs)
        got = ours(grad, q, k, v, out, logsumexp, 0.0, causal, **kwargs)
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


@torch_limit("torch 2.11 and 2.12 put the 'Fake' key just above the Python key (13 and 12; 2.13 swapped "
             "them): a keyed session's kernels then run before torch_dispatch modes and subclasses see the op",
             raises=AssertionError, lifted_in=(2, 13))
def test_spare_dispatch_key_sits_between_the_python_key_and_the_backends_and_is_unused():
    # keyed sessions own it (eager/session_key.py): it must stay below autograd and the Python key,
    # above the dense backends, and torch must register nothing on it
    key = torch._C._parse_dispatch_key(tc.SPARE_KEY)
    assert torch._C._dispatch_key_name(key) == tc.SPARE_KEY
    order = int(key)
    assert int(torch._C.DispatchKey.Dense) < order < int(torch._C.DispatchKey.Python)
    assert order < int(torch._C.DispatchKey.ADInplaceOrView) < int(torch._C.DispatchKey.AutogradFunctionality)
    # in a fresh process (ours stay registered in this one): torch itself puts nothing there
    code = "import torch; print(len(torch._C._dispatch_get_registrations_for_dispatch_key('Fake')))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "0"


def test_an_ops_entry_point_is_what_calling_the_op_runs():
    # the compiled replay (eager/replay.py) calls tc.entry_point(op) where fx's code calls op
    x, y = torch.randn(3), torch.randn(3)
    add = torch.ops.aten.add.Tensor
    assert torch.equal(tc.entry_point(add)(x, y, alpha=2), add(x, y, alpha=2))
    values, indices = tc.entry_point(torch.ops.aten.max.dim)(x.reshape(1, 3), 1)
    assert torch.equal(values, x.max().reshape(1)) and indices.dtype == torch.int64


def _native_kernel_samples():
    x, w, b = torch.randn(3, 4), torch.randn(4), torch.randn(4)
    out, mean, rstd = aten.native_layer_norm.default(x, [4], w, b, 1e-5)
    image = torch.randn(1, 2, 4, 4)
    pooled, indices = aten.max_pool2d_with_indices.default(image, [2, 2])
    return {
        "aten::sum.dim_IntList": lambda: aten.sum.dim_IntList(x, [0]),
        "aten::mean.dim": lambda: aten.mean.dim(x, [0]),
        "aten::amax": lambda: aten.amax.default(x, [0]),
        "aten::amin": lambda: aten.amin.default(x, [0]),
        "aten::native_layer_norm_backward": lambda: aten.native_layer_norm_backward.default(
            torch.ones_like(out), x, [4], mean, rstd, w, b, [True, True, True]),
        "aten::embedding_dense_backward": lambda: aten.embedding_dense_backward.default(
            torch.randn(3, 5), torch.tensor([0, 2, 2]), 10, -1, False),
        "aten::max_pool2d_with_indices_backward": lambda: aten.max_pool2d_with_indices_backward.default(
            torch.ones_like(pooled), image, [2, 2], [2, 2], [0, 0], [1, 1], False, indices),
        "aten::avg_pool2d_backward": lambda: aten.avg_pool2d_backward.default(
            torch.ones(1, 2, 2, 2), image, [2, 2], [2, 2], [0, 0], False, True, None),
        "aten::relu": lambda: aten.relu.default(x),
        "aten::histc": lambda: aten.histc.default(x, 5),
    }


def test_native_kernels_that_call_outside_core_aten_still_do():
    # session_key.NATIVE_KERNEL_CALLS: these run with the key off because their CPU kernels
    # call these ops; a torch whose kernel stops calling one fails here (drop it from the table)
    from predispatch_func.eager.session_key import NATIVE_KERNEL_CALLS

    samples = _native_kernel_samples()
    assert samples.keys() == NATIVE_KERNEL_CALLS.keys()
    for name, inner in NATIVE_KERNEL_CALLS.items():
        with torch.profiler.profile() as profile:
            samples[name]()
        called = {event.name for event in profile.events()}
        for op in inner:
            assert op.split(".")[0] in called, (name, op, sorted(called))


def test_a_python_fallback_on_the_spare_key_falls_through_and_registers_while_dispatching():
    from predispatch_func.eager import session_key

    session_key.release()  # a session's own fallback would hold the key
    met: list = []
    fallback = torch.library.Library("_", "IMPL")
    per_op = torch.library.Library("aten", "IMPL")

    def first_meeting(keyset, op, *args, **kwargs):
        met.append(op)
        if op is aten.sin.default:  # from now on sin falls through in C++
            per_op.impl("sin", torch.library.fallthrough_kernel, tc.SPARE_KEY)
        return tc.fall_through_spare_key(op, keyset, args, kwargs)

    fallback.fallback(first_meeting, tc.SPARE_KEY, with_keyset=True)
    try:
        x = torch.randn(5, requires_grad=True)
        with tc.including_spare_key():
            first, second = x.sin(), x.sin()
            first.sum().backward()
        assert met.count(aten.sin.default) == 1  # registered by the first call, skipped by the second
        assert aten.cos.default in met  # sin's backward, through the key as well
        assert torch.equal(first, x.detach().sin()) and torch.equal(second, first)
        torch.testing.assert_close(x.grad, x.detach().cos())
    finally:
        per_op._destroy()
        fallback._destroy()


@torch_limit("torch 2.11 and 2.12 put the spare key above the Python key, and a Python fallback there, "
             "called while a TorchDispatchMode is active, fails an internal assert (python_dispatch.cpp: "
             "'func != nullptr'): keyed sessions register every kernel up front there "
             "(tc.PYTHON_FALLBACK_ON_SPARE_KEY)", raises=RuntimeError, lifted_in=(2, 13))
def test_a_python_fallback_on_the_spare_key_serves_calls_under_a_dispatch_mode():
    from predispatch_func.eager import session_key

    assert tc.PYTHON_FALLBACK_ON_SPARE_KEY == (torch_release() >= (2, 13))
    session_key.release()
    fallback = torch.library.Library("_", "IMPL")
    fallback.fallback(lambda keyset, op, *args, **kwargs: tc.fall_through_spare_key(op, keyset, args, kwargs),
                      tc.SPARE_KEY, with_keyset=True)

    class Forwarding(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    try:
        x = torch.randn(3)
        with tc.including_spare_key(), Forwarding():
            assert torch.equal(x.neg(), -x)
    finally:
        fallback._destroy()


def _composite_kernel_samples():
    x, destination, table, indices = torch.randn(2, 3), torch.empty(2, 3), torch.randn(10, 4), torch.tensor([1, 2])
    return {
        "aten::copy_": lambda: aten.copy_.default(destination, x),
        "aten::clone": lambda: aten.clone.default(x),
        "aten::_to_copy": lambda: aten._to_copy.default(x, dtype=torch.float64),
        "aten::embedding": lambda: aten.embedding.default(table, indices),
        **{f"aten::{name}.Scalar": (lambda op: lambda: op(x, 2.0))(getattr(aten, name).Scalar)
           for name in ("add", "sub", "mul", "div")},
    }


# what a composite kernel may call besides its list: CompositeImplicitAutograd ops that
# decompose into listed ones (``to``), and views made in metadata
_DECOMPOSED_OR_VIEWS = {"aten::to", "aten::select", "aten::as_strided"}


def test_composite_kernels_that_fall_through_call_only_their_listed_ops():
    # session_key.COMPOSITE_KERNEL_CALLS: these fall through with the key on because their
    # composite kernels call only the listed ops; a torch whose kernel calls another fails here
    from predispatch_func.eager.session_key import COMPOSITE_KERNEL_CALLS

    samples = _composite_kernel_samples()
    assert samples.keys() == COMPOSITE_KERNEL_CALLS.keys()
    for name, inner in COMPOSITE_KERNEL_CALLS.items():
        op = tc.resolve_overload(*name.split("::", 1))
        assert not tc.backend_has_kernel(op, "CPU") and tc.has_composite_explicit_kernel(op), name
        samples[name]()
        with torch.profiler.profile() as profile:
            samples[name]()
        called = {event.name for event in profile.events() if event.name.startswith("aten::")}
        allowed = {name.split(".")[0]} | {op.split(".")[0] for op in inner} | _DECOMPOSED_OR_VIEWS
        assert called <= allowed, (name, sorted(called - allowed))


def _served_by_composite_samples():
    x = torch.randn(2, 3)
    return {
        "aten::empty_like": lambda: aten.empty_like.default(x),
        "aten::new_empty": lambda: aten.new_empty.default(x, [4]),
        "aten::stack": lambda: aten.stack.default([x, x], 1),
    }


def test_composite_kernels_that_serve_ops_outside_the_target_call_only_their_listed_ops():
    # plans.SERVED_BY_COMPOSITE_KERNEL: these ops outside Core ATen run by their composite kernel
    # (no trip into Python on the key) because it calls only the listed ops; a torch whose kernel
    # calls another op, or gives the op a CPU kernel of its own, fails here
    from predispatch_func.eager.plans import SERVED_BY_COMPOSITE_KERNEL

    samples = _served_by_composite_samples()
    assert samples.keys() == SERVED_BY_COMPOSITE_KERNEL.keys()
    core = {op.name() for op in pf.OpSet.core_aten()}
    for name, inner in SERVED_BY_COMPOSITE_KERNEL.items():
        op = tc.resolve_overload(*(name if "." in name else f"{name}.default").split("::", 1))
        assert op is not None and op.name() not in core, name
        assert not tc.backend_has_kernel(op, "CPU") and tc.has_composite_explicit_kernel(op), name
        assert set(inner) <= core, name  # what it calls is Core ATen's
        samples[name]()
        with torch.profiler.profile() as profile:
            samples[name]()
        called = {event.name for event in profile.events() if event.name.startswith("aten::")}
        allowed = {name} | {n.split(".")[0] for n in inner} | _DECOMPOSED_OR_VIEWS
        assert called <= allowed, (name, sorted(called - allowed))


def test_batch_norm_runs_the_kernel_of_the_core_op_it_is_lowered_to():
    """``SAME_KERNEL``: in a session, ``native_batch_norm`` is one ``_native_batch_norm_legit`` call
    whose results (and running statistics written) are eager's bit for bit, in training and not,
    with statistics and without; one statistic alone is refused as eager's kernel refuses it."""
    assert aten.native_batch_norm.default in extra_decompositions.SAME_KERNEL
    session = pf.eager.on(pf.OpSet.core_aten())
    for training, with_stats in ((True, True), (False, True), (True, False)):
        x, weight, bias = torch.randn(4, 3, 5, 5), torch.randn(3), torch.randn(3)
        stats = [torch.randn(3), torch.rand(3) + 0.5] if with_stats else [None, None]
        theirs = [s.clone() if s is not None else None for s in stats]
        expected = aten.native_batch_norm.default(x, weight, bias, *theirs, training, 0.1, 1e-5)
        with session:
            got = aten.native_batch_norm.default(x, weight, bias, *stats, training, 0.1, 1e-5)
        assert all(torch.equal(a, b) for a, b in zip(expected, got)), (training, with_stats)
        assert all(a is b is None or torch.equal(a, b) for a, b in zip(theirs, stats)), (training, with_stats)
    kernels = [k for k in pf.eager.mode.kernels_for(pf.OpSet.core_aten()).kernels_of(
        aten.native_batch_norm.default).values()]
    assert kernels and all(len(k.ops) == 1 and "_native_batch_norm_legit" in str(k.ops[0]) for k in kernels)
    for refused in (session, None):
        with session if refused else torch.no_grad():
            try:
                aten.native_batch_norm.default(torch.randn(2, 3), None, None, torch.zeros(3), None, True, 0.1, 1e-5)
            except ValueError as e:  # eager's kernel raises a ValueError
                assert "both be None or neither" in str(e)
            else:
                raise AssertionError("one running statistic alone was accepted")


def test_sdpas_composite_kernel_is_cpp_only():
    # native/math_attention.cpp calls sdpa's CompositeImplicitAutograd kernel through the
    # dispatcher, where the Python kernel calls ``OpOverload.decompose``, which would prefer a
    # Python kernel registered for that key: a torch that adds one fails here (call it instead)
    sdpa = torch.ops.aten.scaled_dot_product_attention.default
    assert torch._C.DispatchKey.CompositeImplicitAutograd not in sdpa.py_kernels
    assert torch._C._dispatch_has_kernel_for_dispatch_key(sdpa.name(), "CompositeImplicitAutograd")


# in-place ops that change self's shape by what they are (views, metadata, resizing)
_RESHAPING_IN_PLACE = frozenset({"as_strided", "resize_", "squeeze", "t", "transpose", "unsqueeze"})


@pytest.mark.deep
def test_the_in_place_ops_whose_eager_kernel_grows_self_are_the_ones_named():
    """``mode.GROWS_SELF``: an in-place op through its twin whose result does not fit ``self`` is
    refused (eager's TensorIterator check), except where eager's kernel grows ``self``
    (``addbmm_``: its out= form writing into self). Every in-place op_db variant run in eager on
    its samples: those that grow ``self`` are the named ones and the ops that reshape by what they
    are. A torch release growing another (or no longer ``addbmm_``) fails here."""
    import warnings

    from torch.testing._internal.common_methods_invocations import op_db

    from predispatch_func.eager.mode import GROWS_SELF

    grows = set()
    for info in op_db:
        if info.inplace_variant is None or info.name in _RESHAPING_IN_PLACE:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                samples = list(info.sample_inputs("cpu", torch.float64))
            except Exception:  # noqa: BLE001, S112  (an OpInfo without float64 samples)
                continue
            for sample in samples[:12]:
                if not isinstance(sample.input, torch.Tensor):
                    continue
                x = sample.input.clone()
                shape = x.shape
                try:
                    info.inplace_variant(x, *sample.args, **sample.kwargs)
                except Exception:  # noqa: BLE001, S112  (eager refuses it: so does the session)
                    continue
                if x.shape != shape:
                    grows.add(f"aten::{info.name}_")
                    break
    assert grows == set(GROWS_SELF)
