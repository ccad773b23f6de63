"""``pf.eager.on(target)``: eager execution on an op set, judged against plain eager.

Each case runs the same code plainly and under the mode and compares values,
in-place effects (the caller's tensor, its views, its version counter),
gradients and RNG use; the mode's stats show the op really was decomposed.
"""

import pytest
import torch
import torch.nn.functional as F

import predispatch_func as pf

aten = torch.ops.aten
CORE = pf.OpSet.core_aten()


def _core_without(*names: str) -> pf.OpSet:
    return CORE.difference(*names)


def test_functional_op_outside_target_is_decomposed_and_equal():
    x = torch.randn(4, 5)
    with pf.eager.on(CORE) as session:
        got = torch.logit(x.sigmoid(), eps=1e-3)
    torch.testing.assert_close(got, torch.logit(x.sigmoid(), eps=1e-3))
    assert aten.logit.default in session.stats.decomposed
    assert aten.logit.default not in session.stats.reached
    assert all(op in CORE or op in pf.eager.RUNTIME_FLOOR for op in session.stats.reached)


def test_in_place_outside_target_writes_the_callers_tensor_and_its_views():
    target = _core_without("aten.add_.Tensor")  # core has no in-place ops; be explicit
    base, ref = torch.zeros(3, 4), torch.zeros(3, 4)
    view, ref_view = base[1], ref[1]
    before = base._version
    with pf.eager.on(target) as session:
        returned = view.add_(torch.ones(4))
    ref_view.add_(torch.ones(4))
    assert returned is view
    assert torch.equal(base, ref) and torch.equal(view, ref_view)
    assert base._version - before == 1 == ref._version
    assert view._version == ref_view._version
    assert aten.add_.Tensor in session.stats.decomposed


def test_out_variant_resizes_and_writes_like_eager():
    a, b = torch.randn(3), torch.randn(3)
    out, ref = torch.empty(0), torch.empty(0)
    with pf.eager.on(CORE) as session:
        returned = torch.mul(a, b, out=out)
    torch.mul(a, b, out=ref)
    assert returned is out and torch.equal(out, ref) and out.shape == ref.shape
    assert aten.mul.out in session.stats.decomposed


def test_in_place_view_op_changes_geometry_in_place():
    x, ref = torch.randn(2, 3), None
    ref = x.clone()
    y = x
    with pf.eager.on(CORE):
        returned = y.transpose_(0, 1)
    ref.transpose_(0, 1)
    assert returned is y and y.shape == ref.shape and y.stride() == ref.stride() and torch.equal(y, ref)


def test_gradients_equal_eager_through_decomposed_ops():
    x = torch.randn(4, 6, requires_grad=True)
    w = torch.randn(6, 6, requires_grad=True)

    def f(x, w):
        return (F.gelu(F.linear(x, w)).logsumexp(-1) + torch.logit(x.sigmoid(), 1e-3).std(-1)).sum()

    f(x, w).backward()
    expected = (x.grad.clone(), w.grad.clone())
    x.grad = w.grad = None
    with pf.eager.on(CORE) as session:
        f(x, w).backward()
    torch.testing.assert_close((x.grad, w.grad), expected)
    assert session.stats.decomposed  # the forward and the backward both lowered


def test_cpu_flash_attention_called_directly_lowers_with_its_fused_backward():
    # sdpa itself takes the math path in a session (test_sdpa_takes_the_math_path...); a direct
    # call of the fused kernel still lowers, its backward by our decomposition
    flash = aten._scaled_dot_product_flash_attention_for_cpu.default
    q, k, v = (torch.randn(2, 2, 5, 8, requires_grad=True) for _ in range(3))
    flash(q, k, v, 0.0, True)[0].sum().backward()
    expected = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    with pf.eager.on(CORE) as session:
        flash(q, k, v, 0.0, True)[0].sum().backward()
    torch.testing.assert_close([t.grad for t in (q, k, v)], expected)
    assert aten._scaled_dot_product_flash_attention_for_cpu_backward.default in session.stats.decomposed


@pytest.fixture(params=["cpp", "python"])
def attention_kernel(request, monkeypatch):
    """sdpa's math-path kernel of the session: the C++ one (where this machine builds it) or the Python one."""
    from predispatch_func.eager import native_kernels, native_registrations

    built = []
    if request.param == "python":
        monkeypatch.setattr(native_registrations, "native_math_attention", lambda *args: None)
    elif native_kernels.module() is None:
        pytest.skip(f"no C++ kernels here: {native_kernels.why_unavailable}")
    else:
        cpp = native_registrations.native_math_attention
        monkeypatch.setattr(native_registrations, "native_math_attention",
                            lambda *args: built.append(cpp(*args)) or built[-1])
    yield request.param
    assert bool(built) == (request.param == "cpp")  # the kernel the parameter names served


@pytest.mark.parametrize("mask", ["none", "causal", "bool", "float"])
def test_sdpa_takes_the_math_path_as_on_a_backend_without_fused_attention(mask, attention_kernel):
    # a backend with none of the device's fused kernels is answered "math" by sdpa's choice;
    # the session makes that choice too: no fused kernel, no trip into Python for it
    q, k, v = (torch.randn(2, 2, 5, 8, requires_grad=True) for _ in range(3))
    options = {"none": {}, "causal": {"is_causal": True},
               "bool": {"attn_mask": torch.rand(5, 5) > 0.3},
               "float": {"attn_mask": torch.randn(2, 1, 5, 5)}}[mask]
    with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.MATH]):
        out = F.scaled_dot_product_attention(q, k, v, **options)
        out.pow(2).sum().backward()
    expected = [out.detach(), *(t.grad.clone() for t in (q, k, v))]
    for t in (q, k, v):
        t.grad = None
    with pf.eager.on(CORE) as session:
        out = F.scaled_dot_product_attention(q, k, v, **options)
        out.pow(2).sum().backward()
    torch.testing.assert_close(out.detach(), expected[0], rtol=0, atol=0)  # the math kernel's own result
    # the gradients through the backward's lowered ops (``_softmax_backward_data``): rounding apart
    torch.testing.assert_close([t.grad for t in (q, k, v)], expected[1:])
    assert session.stats.above_autograd[aten.scaled_dot_product_attention.default] == 1
    fused = [op for op in session.stats.decomposed if "flash" in str(op)]
    assert not fused, fused
    assert torch.backends.cuda.flash_sdp_enabled()  # the switches are back as they were


def test_sdpa_keeps_the_fused_kernel_where_the_target_has_it():
    flash = aten._scaled_dot_product_flash_attention_for_cpu.default
    target = CORE | pf.OpSet.from_names([str(flash), str(aten._scaled_dot_product_flash_attention_for_cpu_backward.default)],
                                        name="with_flash")
    q, k, v = (torch.randn(2, 2, 5, 8, requires_grad=True) for _ in range(3))
    with pf.eager.on(target, observe=True) as session:
        F.scaled_dot_product_attention(q, k, v).sum().backward()
    assert session.stats.reached[flash] == 1
    assert aten.scaled_dot_product_attention.default not in session.stats.above_autograd


def test_sdpa_with_the_math_backend_switched_off_by_the_user_runs_as_it_would(attention_kernel):
    q, k, v = (torch.randn(2, 2, 5, 8) for _ in range(3))
    expected = F.scaled_dot_product_attention(q, k, v)
    with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.FLASH_ATTENTION]):
        with pf.eager.on(CORE) as session:
            got = F.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(got, expected)
    assert aten._scaled_dot_product_flash_attention_for_cpu.default in session.stats.decomposed


def test_sdpa_with_grouped_heads_and_a_padding_mask_like_eager():
    q = torch.randn(2, 4, 5, 8, requires_grad=True)
    k, v = (torch.randn(2, 2, 5, 8, requires_grad=True) for _ in range(2))
    mask = torch.ones(2, 1, 5, 5, dtype=torch.bool)
    mask[1, :, :, 3:] = False  # the second sequence is padded
    def run():
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        out.pow(2).sum().backward()
        grads = [t.grad.clone() for t in (q, k, v)]
        for t in (q, k, v):
            t.grad = None
        return out.detach(), grads
    expected = run()
    with pf.eager.on(CORE) as session:
        got = run()
    torch.testing.assert_close(got, expected)
    assert session.stats.decomposed


def test_weight_norm_is_decomposed_above_autograd():
    # its fused backward has no decomposition: autograd differentiates the forward's instead
    layer = torch.nn.utils.parametrizations.weight_norm(torch.nn.Linear(4, 3))
    x = torch.randn(2, 4)
    layer(x).pow(2).sum().backward()
    expected = [p.grad.clone() for p in layer.parameters()]
    layer.zero_grad()
    # on torch 2.13 linalg_vector_norm has no ATen decomposition: the backend has it
    with pf.eager.on(CORE | pf.OpSet.from_names(["aten.linalg_vector_norm.default"])) as session:
        layer(x).pow(2).sum().backward()
    torch.testing.assert_close([p.grad for p in layer.parameters()], expected)
    assert aten._weight_norm_interface.default in session.stats.above_autograd


def test_unreachable_op_names_op_target_and_line():
    x = torch.rand(10)
    with pytest.raises(pf.eager.EagerUnreachableError) as info:
        with pf.eager.on(CORE):
            torch.hash_tensor(x)  # the line the error must name
    assert info.value.kind is pf.Refusal.EAGER_OP_UNREACHABLE
    assert "aten.hash_tensor.default" in str(info.value) and "'core_aten'" in str(info.value)
    assert "test_eager.py" in info.value.source and "torch.hash_tensor(x)" in info.value.source


def test_unreachable_op_recorded_when_asked_to_run():
    x = torch.rand(10)
    with pf.eager.on(CORE, on_unreachable="run") as session:
        got = torch.hash_tensor(x)
    assert torch.equal(got, torch.hash_tensor(x))
    assert list(map(str, session.stats.unreachable)) == ["aten.hash_tensor.default"]


def test_random_ops_draw_like_eager():
    x = torch.randn(64)
    torch.manual_seed(3)
    ref = (torch.rand_like(x), torch.randn_like(x), F.dropout(x, 0.5, training=True), torch.bernoulli(x.sigmoid()))
    ref_state = torch.get_rng_state()
    torch.manual_seed(3)
    with pf.eager.on(CORE) as session:
        got = (torch.rand_like(x), torch.randn_like(x), F.dropout(x, 0.5, training=True),
               torch.bernoulli(x.sigmoid()))
    assert torch.equal(torch.get_rng_state(), ref_state)
    for g, r in zip(got, ref):
        assert torch.equal(g, r)
    assert session.stats.decomposed


def test_decorator_form():
    @pf.eager.on(CORE)
    def f(x):
        return torch.logit(x, 1e-3)

    x = torch.rand(5)
    assert torch.equal(f(x), torch.logit(x, 1e-3))


def test_target_is_extended_by_the_runtime_floor():
    assert "aten.copy_.default" not in CORE and "aten.copy_.default" in pf.eager.RUNTIME_FLOOR
    x = torch.zeros(3)
    with pf.eager.on(CORE) as session:
        x.add_(1)
    assert aten.copy_.default in session.stats.reached


def test_op_whose_kernel_cycles_through_its_out_form_is_named():
    # range's kernel for every backend calls range.out, which has no path (linalg_lstsq was the example
    # until it got a decomposition of ours)
    with pytest.raises(pf.eager.EagerUnreachableError, match=r"aten\.range"):
        with pf.eager.on(CORE):
            torch.ops.aten.range.default(0, 5)


def test_decomposition_declining_its_arguments_is_named_not_returned():
    # our angle decomposition returns NotImplemented for complex input (it needs view_as_real)
    x = torch.randn(4, dtype=torch.complex64)
    with pytest.raises(pf.eager.EagerUnreachableError, match="aten.angle.*declines"):
        with pf.eager.on(CORE):
            torch.angle(x)


def test_sparse_inputs_are_named_not_decomposed():
    x = torch.eye(3).to_sparse()
    with pf.eager.on(CORE, on_unreachable="run") as session:
        got = torch.sparse.mm(x, torch.ones(3, 2))
    assert torch.equal(got, torch.ones(3, 2))
    assert session.stats.unreachable


def test_sdpa_refused_by_torch_in_a_session_leaves_the_switches_as_they_were(attention_kernel):
    # the fused backends are switched off for the call only, also when the call raises
    q, k = torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 7)  # the key's last size is not the query's
    with pytest.raises(RuntimeError) as eager_error:
        F.scaled_dot_product_attention(q, k, k)
    with pf.eager.on(CORE):
        with pytest.raises(RuntimeError) as session_error:
            F.scaled_dot_product_attention(q, k, k)
    assert str(session_error.value).splitlines()[0] == str(eager_error.value).splitlines()[0]
    assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.mem_efficient_sdp_enabled()
    assert torch.backends.cuda.cudnn_sdp_enabled()


def test_a_device_takes_sdpas_math_path_where_the_target_has_none_of_its_fused_kernels():
    from predispatch_func.eager import attention_path

    core = frozenset(op.name() for op in CORE)
    assert attention_path.devices_taking_math(core) == {"cpu", "cuda"}
    assert attention_path.devices_taking_math(core | {"aten::_scaled_dot_product_flash_attention_for_cpu"}) == {"cuda"}
    assert attention_path.devices_taking_math(core | {"aten::_scaled_dot_product_efficient_attention"}) == {"cpu"}
    assert attention_path.devices_taking_math(core | {"aten::_efficient_attention_forward.overload"}) == {"cpu"}
    assert attention_path.devices_taking_math(core | {"aten::scaled_dot_product_attention"}) == frozenset()
    # a name that only starts like a fused kernel's is another op
    assert attention_path.devices_taking_math(core | {"aten::_scaled_dot_product_flash_attention_for_cpu_x"}) \
        == {"cpu", "cuda"}
