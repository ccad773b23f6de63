"""The fast path of ``pf.eager.on``: kernels on the session's dispatch key instead of a Python mode.

A keyed session must give exactly what the observed one (the Python dispatch
mode) and plain eager give, while ops in the target never enter Python: only
ops outside ``target | floor`` have a kernel on the key, and the key is on in
the session's thread only.
"""

import threading

import pytest
import torch
import torch.nn.functional as F

import predispatch_func as pf
from predispatch_func import _torch_compat as tc
from predispatch_func.eager import session_key

aten = torch.ops.aten
CORE = pf.OpSet.core_aten()


def _programs():
    """Small programs touching each plan: decomposed, in-place and out= through the twin, an in-place
    view, a composite kernel drawing random numbers, a decomposition above autograd, batch norm."""
    def logit(x):
        return torch.logit(x.sigmoid(), 1e-3)

    def in_place_on_view(x):
        base = x.clone()
        view = base[1]
        view.addcmul_(view, view, value=0.5)
        return base, view

    def out_form(x):
        out = torch.empty(0)
        torch.logit(x.sigmoid(), 1e-3, out=out)
        return out

    def in_place_view(x):
        y = x.clone()
        y.t_()
        return y

    def random_draws(x):
        torch.manual_seed(1)
        return torch.rand_like(x), F.dropout(x, 0.5, training=True)

    def attention_with_grad(x):
        q = x.reshape(1, 2, 5, 2).detach().requires_grad_()
        mask = torch.ones(5, 5, dtype=torch.bool).tril()
        out = F.scaled_dot_product_attention(q, q, q, attn_mask=mask)
        out.sum().backward()
        return out.detach(), q.grad

    def batch_norm_train(x):
        bn = torch.nn.BatchNorm1d(4)
        out = bn(x.reshape(5, 4).detach().requires_grad_())
        out.pow(2).sum().backward()
        return out.detach(), bn.running_mean, bn.running_var

    return [logit, in_place_on_view, out_form, in_place_view, random_draws, attention_with_grad, batch_norm_train]


def test_keyed_session_equals_observed_session_and_plain_eager():
    x = torch.randn(5, 4)
    for program in _programs():
        expected = program(x)
        keyed = pf.eager.on(CORE)
        with keyed:
            got = program(x)
        assert keyed.keyed, program.__name__
        observed = pf.eager.on(CORE, observe=True)
        with observed:
            seen = program(x)
        assert not observed.keyed
        torch.testing.assert_close(got, expected, msg=program.__name__)
        torch.testing.assert_close(seen, expected, msg=program.__name__)
        assert keyed.stats.decomposed and observed.stats.decomposed, program.__name__


def test_each_op_gets_its_kernel_on_the_key_when_first_met_and_only_ops_outside_the_target_a_python_one():
    x, w = torch.rand(2, 3, 5, 5), torch.randn(4, 3, 3, 3)
    session_key.release()  # what earlier tests met is forgotten: registering starts from nothing
    with pf.eager.on(CORE):
        assert tc.spare_key_active()
        torch.logit(x.clamp(0.1, 0.9))
        torch.mm(x[0, 0], x[0, 0].t()).add(1).detach()
        torch.sort(x.flatten())
        torch.nn.functional.conv2d(x, w)
        torch.matmul(x, x.transpose(-1, -2))  # the result comes back through _unsafe_view
    assert not tc.spare_key_active()
    kind = session_key.kind_of
    # (torch 2.11, 2.12: what falls through is never met, the key's fallback being a fallthrough)
    through = session_key.THROUGH if tc.PYTHON_FALLBACK_ON_SPARE_KEY else None
    assert kind("aten::logit") == "DECOMPOSE"
    # views torch's composite kernel makes in metadata on any backend fall through to it, and
    # _unsafe_view, a view by its kernel though not by its schema; so do the target's ops
    assert kind("aten::transpose.int") == kind("aten::detach") == through
    assert kind("aten::_unsafe_view") == through
    assert kind("aten::mm") == kind("aten::add.Tensor") == through
    # ops of the target have a kernel there only to run torch's composite kernel with the key off,
    # where that kernel calls ops outside the target (sort.stable, convolution's implementations)
    assert kind("aten::sort") == kind("aten::convolution") == "BACKEND"
    registered = set(session_key.registered_ops())
    if tc.PYTHON_FALLBACK_ON_SPARE_KEY:
        # an op no session has called has nothing registered: registering costs about 10 us an op
        assert kind("aten::logit_backward") is None and "aten::logit_backward" not in registered
        assert {"aten::logit", "aten::mm", "aten::sort"} <= registered and len(registered) < 100
    else:  # torch 2.11, 2.12: every op outside the target up front, the rest falls through
        assert "aten::logit_backward" in registered and "aten::mm" not in registered
    inside = {op.name() if op._overloadname == "default" else f"{op.name()}.{op._overloadname}": op
              for op in CORE | pf.eager.RUNTIME_FLOOR}
    assert all(session_key._composite_inside_target(inside[name]) or inside[name].name() in session_key.NATIVE_KERNEL_CALLS
               for name in registered & inside.keys() if kind(name) not in (session_key.THROUGH, None))


def test_a_program_of_target_ops_never_enters_python():
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    with pf.eager.on(CORE) as session:
        y = torch.mm(x, w).add(1).mul(x).sigmoid()  # all in Core ATen, C++ kernels that call no other op
    assert torch.equal(y, torch.mm(x, w).add(1).mul(x).sigmoid())
    assert not session.stats.decomposed and not session.stats.reached


def test_composite_kernel_of_a_target_op_keeps_its_inner_calls():
    # sort's CPU kernel calls sort.stable, which torch cannot lower: a backend implementing sort
    # never makes that call, so the session must not see it
    x = torch.randn(6)
    with pf.eager.on(CORE) as session:
        got = torch.sort(x)
    assert torch.equal(got.values, torch.sort(x).values)
    assert aten.sort.stable not in session.stats.decomposed


def test_index_backward_writes_like_eager():
    # without a Python mode, autograd's index backward writes with _index_put_impl_
    x, i = torch.randn(5, 3, requires_grad=True), torch.tensor([0, 2, 2])
    x[i].pow(2).sum().backward()
    expected, x.grad = x.grad, None
    with pf.eager.on(CORE) as session:
        x[i].pow(2).sum().backward()
    torch.testing.assert_close(x.grad, expected)
    assert aten._index_put_impl_.default in session.stats.decomposed


def test_key_is_off_in_other_threads():
    x = torch.rand(4)
    seen = {}

    def elsewhere():
        seen["included"] = tc.spare_key_active()
        seen["value"] = torch.logit(x, 1e-3)

    with pf.eager.on(CORE) as session:
        thread = threading.Thread(target=elsewhere)
        thread.start()
        thread.join()
    assert seen["included"] is False
    assert torch.equal(seen["value"], torch.logit(x, 1e-3))
    assert aten.logit.default not in session.stats.decomposed


def test_session_of_another_target_inside_a_keyed_one_runs_as_the_mode():
    x, w, b = torch.rand(3, 4), torch.rand(4, 2), torch.rand(2)
    other = CORE.difference("aten.addmm.default")
    with pf.eager.on(CORE) as outer:
        with pf.eager.on(other) as inner:
            got = torch.addmm(b, torch.logit(x, 1e-3), w)
    assert outer.keyed and not inner.keyed
    torch.testing.assert_close(got, torch.addmm(b, torch.logit(x, 1e-3), w))
    assert aten.addmm.default in inner.stats.decomposed


def test_target_change_between_sessions_registers_the_new_target():
    x, w, b = torch.rand(3, 4), torch.rand(4, 2), torch.rand(2)
    other = CORE.difference("aten.addmm.default")
    with pf.eager.on(other) as session:
        got = torch.addmm(b, x, w)
    assert session.keyed and aten.addmm.default in session.stats.decomposed
    torch.testing.assert_close(got, torch.addmm(b, x, w))
    with pf.eager.on(CORE) as session:
        torch.addmm(b, x, w)
    assert session.keyed and aten.addmm.default not in session.stats.decomposed


def test_number_a_derivative_passes_as_a_tensor_reaches_the_op_as_one():
    # ldexp's derivative calls pow with the number 2 as a (wrapped) tensor; a Python kernel
    # receives a Python float there, which the op itself refuses
    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    e = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64, requires_grad=True)
    torch.ldexp(x, e).sum().backward()
    expected = (x.grad, e.grad)
    x.grad = e.grad = None
    with pf.eager.on(CORE, on_unreachable="run") as session:  # exp2 runs as our decomposition
        torch.ldexp(x, e).sum().backward()
    torch.testing.assert_close((x.grad, e.grad), expected)
    assert session.keyed and session.stats.decomposed


def test_composite_target_ops_calling_only_target_ops_fall_through_and_equal_eager():
    # session_key.COMPOSITE_KERNEL_CALLS: clone's composite kernel calls empty_strided and copy_,
    # both in Core ATen: it falls through in C++ instead of a trip into Python
    x, table, indices = torch.randn(3, 4), torch.randn(10, 4), torch.tensor([1, 3])
    expected = (x.clone(), x.to(torch.float64), x * 2.0, torch.nn.functional.embedding(indices, table))
    with pf.eager.on(CORE) as session:
        got = (x.clone(), x.to(torch.float64), torch.nn.functional.embedding(indices, table))
    assert not session.stats.decomposed, session.stats.decomposed
    with pf.eager.on(CORE):  # (called from Python, the number is made a tensor by ops of its own)
        torch.sort(x)  # a composite kernel whose inner call (sort.stable) is outside the target
        got = (*got[:2], torch.ops.aten.mul.Scalar(x, 2.0), got[2])
    for value, want in zip(got, expected):
        assert torch.equal(value, want)
    if tc.PYTHON_FALLBACK_ON_SPARE_KEY:
        assert session_key.kind_of("aten::clone") == session_key.kind_of("aten::mul.Scalar") == session_key.THROUGH
    assert session_key.kind_of("aten::sort") == "BACKEND"


def test_ops_outside_the_target_served_by_their_composite_kernel_make_no_trip():
    # plans.SERVED_BY_COMPOSITE_KERNEL: empty_like (the autograd engine's buffers), new_empty and
    # stack run by their composite kernels, whose calls are Core ATen's: no decomposition, eager's
    # result (empty_like keeps the layout, stack the values)
    x = torch.randn(3, 4).t()
    with pf.eager.on(CORE) as session:
        like, new, stacked = torch.empty_like(x), x.new_empty([5]), torch.stack([x, x * 2], 1)
        w = torch.randn(4, 3, requires_grad=True)
        (w * 2).sum().backward()
    assert not {str(op) for op in session.stats.decomposed} & {
        "aten.empty_like.default", "aten.new_empty.default", "aten.stack.default"}, session.stats.decomposed
    assert like.shape == x.shape and like.stride() == x.stride() and new.shape == (5,)
    assert torch.equal(stacked, torch.stack([x, x * 2], 1)) and torch.equal(w.grad, torch.full((4, 3), 2.0))
    if tc.PYTHON_FALLBACK_ON_SPARE_KEY:
        assert session_key.kind_of("aten::empty_like") == session_key.THROUGH


class _Marked(torch.Tensor):
    pass


@pytest.mark.parametrize("wrap", [torch.nn.Parameter, lambda t: t.as_subclass(_Marked)], ids=["Parameter", "as_subclass"])
def test_tensor_wrapped_first_thing_in_a_fresh_session(wrap):
    """``nn.Parameter(t)`` detaches ``t`` in C++ (``as_subclass`` aliases it) and wraps the result
    in a new Python object. Had that op first reached the key there, its fallthrough being
    registered by the Python fallback, the result would already have a Python object and torch
    refuses to wrap it (seen on CI, depending on which test a worker ran first)."""
    session_key.release()  # nothing met yet, as in a fresh process
    with pf.eager.on(CORE):
        weight = torch.linspace(-1, 1, 12).reshape(4, 3) + 1
        wrapped = wrap(weight)
        module = torch.nn.Linear(3, 2)  # its parameters are made as Parameters
        out = module(wrapped)
    assert type(wrapped) is not torch.Tensor
    torch.testing.assert_close(out, torch.nn.functional.linear(weight, module.weight, module.bias))


def test_without_the_cpp_kernels_the_python_fallback_and_kernels_give_the_same(monkeypatch):
    """Where the C++ kernels cannot be built (no compiler, ``PREDISPATCH_FUNC_NATIVE=0``), the key's
    fallback and every kernel on it are Python (``_Registered._first_meeting``): the same values,
    and each op given what it gets with the C++ kernels."""
    from predispatch_func.eager import native_kernels

    session_key.release()
    monkeypatch.setattr(native_kernels, "_loaded", [None])  # as a machine without a compiler
    try:
        x = torch.randn(5, 4)
        for program in _programs():
            expected = program(x)
            with pf.eager.on(CORE) as session:
                got = program(x)
            assert session.keyed, program.__name__
            torch.testing.assert_close(got, expected, msg=program.__name__)
        registered = session_key._registered  # noqa: SLF001
        assert registered is not None and not registered.native and registered._meeting_in_cpp is None  # noqa: SLF001
        through = session_key.THROUGH if tc.PYTHON_FALLBACK_ON_SPARE_KEY else None
        assert session_key.kind_of("aten::logit") == "DECOMPOSE"
        assert session_key.kind_of("aten::add.Tensor") == through
    finally:
        session_key.release()  # the Python kernels go before the C++ module is back
