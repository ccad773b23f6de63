"""Every entry of predispatch_func/autograd_facts.py, provoked in eager.

The table says what eager's autograd does per op; the stages that read it
(the ``.data`` watch, the write-back guard, the observers) are only right
while torch does that. Each (op, fact) is checked here on a sample call; one
fails when a torch release changes the fact, and an entry added without a
sample fails too. What autograd saves is read with ``saved_tensors_hooks``
(every tensor it packs), by storage: a saved view of an input is that input.
"""

import pytest
import torch

from predispatch_func.autograd_facts import Fact, has, ops_with, saved_operands

_A = torch.ops.aten
_I = torch.tensor

# op -> a sample call on two independent (4, 3) tensors a and b (values in [0.5, 1.5]);
# a is the op's self, written in place by an in-place op
_SAMPLES = {
    _A.add.Tensor: lambda a, b: (a, b), _A.sub.Tensor: lambda a, b: (a, b),
    _A.add.Scalar: lambda a, b: (a, 2.0), _A.sub.Scalar: lambda a, b: (a, 2.0),
    _A.mul.Tensor: lambda a, b: (a, b), _A.mul.Scalar: lambda a, b: (a, 2.0),
    _A.div.Tensor: lambda a, b: (a, b), _A.div.Scalar: lambda a, b: (a, 2.0),
    _A.neg.default: lambda a, b: (a,), _A.abs.default: lambda a, b: (a,), _A.sgn.default: lambda a, b: (a,),
    _A.clone.default: lambda a, b: (a,), _A.detach.default: lambda a, b: (a,), _A._to_copy.default: lambda a, b: (a,),
    _A.expand.default: lambda a, b: (a, [2, 4, 3]), _A.view.default: lambda a, b: (a, [12]),
    _A.reshape.default: lambda a, b: (a, [12]), _A.slice.Tensor: lambda a, b: (a, 0, 1, 3),
    _A.select.int: lambda a, b: (a, 0, 1), _A.t.default: lambda a, b: (a,),
    _A.permute.default: lambda a, b: (a, [1, 0]), _A.unsqueeze.default: lambda a, b: (a, 0),
    _A.squeeze.dim: lambda a, b: (a[None], 0), _A.alias.default: lambda a, b: (a,),
    _A.copy_.default: lambda a, b: (a, b), _A.cat.default: lambda a, b: ([a, b],),
    _A.stack.default: lambda a, b: ([a, b],), _A.sum.default: lambda a, b: (a,),
    _A.sum.dim_IntList: lambda a, b: (a, [0]), _A.mean.default: lambda a, b: (a,), _A.mean.dim: lambda a, b: (a, [0]),
    _A.view.dtype: lambda a, b: (a, torch.float64),
    _A.mm.default: lambda a, b: (a, b.T), _A.bmm.default: lambda a, b: (a[None], b.T[None]),
    _A.addmm.default: lambda a, b: (a[0], a.T, b), _A.linear.default: lambda a, b: (a, b, a[:, 0]),
    _A.matmul.default: lambda a, b: (a, b.T),
    _A.conv1d.default: lambda a, b: (a[None], torch.ones(2, 4, 2, dtype=a.dtype) * b[0, 0]),
    _A.conv2d.default: lambda a, b: (a[None, None], torch.ones(1, 1, 2, 2, dtype=a.dtype) * b[0, 0]),
    _A.layer_norm.default: lambda a, b: (a, [3], b[0] + 1, b[1]),
    _A.group_norm.default: lambda a, b: (a[None], 1, b[:, 0], b[:, 1]),
    _A.batch_norm.default: lambda a, b: (a, b[0], b[1], None, None, True, 0.1, 1e-5, False),
    _A.rms_norm.default: lambda a, b: (a, [3], b[0] + 1, 1e-6),
    _A.embedding.default: lambda a, b: (a, _I([0, 2, 2])), _A.dropout.default: lambda a, b: (a, 0.0, True),
    _A.where.self: lambda a, b: (a > 1, a, b), _A.index.Tensor: lambda a, b: (a, [_I([0, 2])]),
    _A.masked_fill.Scalar: lambda a, b: (a, a > 1, 0.0), _A.masked_fill.Tensor: lambda a, b: (a, a > 1, b[0, 0]),
    _A.clamp.default: lambda a, b: (a, 0.7, 1.2), _A.hardtanh.default: lambda a, b: (a, 0.7, 1.2),
    _A.leaky_relu.default: lambda a, b: (a - 1,), _A.elu.default: lambda a, b: (a - 1,),
    _A.gelu.default: lambda a, b: (a,), _A.silu.default: lambda a, b: (a,), _A.hardsigmoid.default: lambda a, b: (a,),
    _A.softplus.default: lambda a, b: (a,), _A.mish.default: lambda a, b: (a,), _A.log.default: lambda a, b: (a,),
    _A.log1p.default: lambda a, b: (a,), _A.sin.default: lambda a, b: (a,), _A.cos.default: lambda a, b: (a,),
    _A.asin.default: lambda a, b: (a * 0.5,), _A.atan.default: lambda a, b: (a,), _A.sinh.default: lambda a, b: (a,),
    _A.cosh.default: lambda a, b: (a,), _A.erf.default: lambda a, b: (a,), _A.erfinv.default: lambda a, b: (a * 0.5,),
    _A.lgamma.default: lambda a, b: (a,), _A.digamma.default: lambda a, b: (a,), _A.logit.default: lambda a, b: (a * 0.5,),
    _A.pow.Tensor_Scalar: lambda a, b: (a, 3), _A.var.correction: lambda a, b: (a, [1]),
    _A.max.dim: lambda a, b: (a, 1), _A.sort.default: lambda a, b: (a,), _A.topk.default: lambda a, b: (a, 2),
    _A.cummax.default: lambda a, b: (a, 0), _A.maximum.default: lambda a, b: (a, b), _A.minimum.default: lambda a, b: (a, b),
    _A.add_.Tensor: lambda a, b: (a, b), _A.add_.Scalar: lambda a, b: (a, 2.0), _A.sub_.Tensor: lambda a, b: (a, b),
    _A.mul_.Tensor: lambda a, b: (a, b), _A.mul_.Scalar: lambda a, b: (a, 2.0), _A.div_.Tensor: lambda a, b: (a, b + 1),
    _A.div_.Scalar: lambda a, b: (a, 2.0), _A.neg_.default: lambda a, b: (a,), _A.clamp_.default: lambda a, b: (a, 0.7, 1.2),
    _A.masked_fill_.Scalar: lambda a, b: (a, a > 1, 0.0), _A.index_put_.default: lambda a, b: (a, [_I([0])], b[1] * 2),
    _A.fill_.Scalar: lambda a, b: (a, 2.0), _A.fill_.Tensor: lambda a, b: (a, b[0, 0] * 3), _A.zero_.default: lambda a, b: (a,),
    _A.zeros_like.default: lambda a, b: (a,), _A.ones_like.default: lambda a, b: (a,),
    _A.empty_like.default: lambda a, b: (a,), _A.full_like.default: lambda a, b: (a, 2.0),
    _A.rand_like.default: lambda a, b: (a,), _A.randn_like.default: lambda a, b: (a,),
    _A.randint_like.default: lambda a, b: (a, 10),
    _A.slice_scatter.default: lambda a, b: (a, b[0:2], 0, 0, 2), _A.select_scatter.default: lambda a, b: (a, b[0], 0, 0),
    _A.diagonal_scatter.default: lambda a, b: (a, b.diagonal()),
    _A.as_strided_scatter.default: lambda a, b: (a, b[:, 0], [4], [3]),
    _A.index_put.default: lambda a, b: (a, [_I([0])], b[1]), _A.fill.Scalar: lambda a, b: (a, 2.0),
    _A.relu.default: lambda a, b: (a,), _A.fill.Tensor: lambda a, b: (a, b[0, 0]), _A.zero.default: lambda a, b: (a,),
    _A.sigmoid.default: lambda a, b: (a,), _A.tanh.default: lambda a, b: (a,), _A.exp.default: lambda a, b: (a,),
    _A.logical_not_.default: lambda a, b: (a,), _A.logical_and_.default: lambda a, b: (a, b),
    _A.logical_or_.default: lambda a, b: (a, b), _A.logical_xor_.default: lambda a, b: (a, b),
}


def _operand(seed: int, requires_grad: bool) -> torch.Tensor:
    """A (4, 3) float64 tensor in [0.5, 1.5]; one that requires grad is a non-leaf (written in place)."""
    t = torch.linspace(0.5, 1.5, 12, dtype=torch.float64).reshape(4, 3).roll(seed, 0) + 0.01 * seed
    return t.requires_grad_() * 1 if requires_grad else t


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _leaves(value):
    if isinstance(value, (list, tuple)):
        return [leaf for item in value for leaf in _leaves(item)]
    return [value]


def _saved_call(op, a_grad: bool, b_grad: bool):
    """Call ``op`` on its sample: (its args, its result, every tensor autograd saved)."""
    a, b = _operand(0, a_grad), _operand(1, b_grad)
    args = _SAMPLES[op](a, b)
    packed = []

    def pack(t):
        packed.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = op(*args)
    return args, out, packed


def _saves_any_of(packed, tensors) -> bool:
    storages = {_storage(t) for t in tensors if isinstance(t, torch.Tensor)}
    return any(_storage(p) in storages for p in packed)


def _saves_no_input(op) -> bool:
    args, _, packed = _saved_call(op, True, True)
    return not _saves_any_of(packed, _leaves(args))


def _saves_no_result(op) -> bool:
    _, out, packed = _saved_call(op, True, True)
    return not _saves_any_of(packed, [t for t in _leaves(out) if t.is_floating_point()])


def _self_not_saved(op) -> bool:
    args, _, packed = _saved_call(op, True, True)
    return not _saves_any_of(packed, [args[0]])


def _own_grad_ignores_self(op) -> bool:
    args, _, packed = _saved_call(op, True, False)  # only self requires grad: what is saved is for its own
    return not _saves_any_of(packed, [args[0]])


def _write_not_recorded(op) -> bool:
    a = _operand(0, True)
    history = a.grad_fn
    result = op(*_SAMPLES[op](a, _operand(1, False)))
    return result is a and a.grad_fn is history and a.requires_grad


def _never_differentiable(op) -> bool:
    """Called as the model calls it, through torch's Python API: ``aten.randint_like`` called
    directly on a float tensor gets a NotImplemented backward; ``torch.randint_like`` none."""
    public = getattr(torch, op.overloadpacket.__name__)
    out = public(*_SAMPLES[op](_operand(0, True), _operand(1, True)))
    return not any(t.requires_grad for t in _leaves(out))


def _unseen_alias(op) -> bool:
    args, out, _ = _saved_call(op, True, True)
    return _storage(out) == _storage(args[0]) and out.grad_fn is None and not out.requires_grad


def _backward_reads_unchecked(hop) -> bool:
    """Eager's backward of the HOP reads an operand written after the call: the gradient follows the write."""
    call = {
        torch.ops.higher_order.scan: lambda v: torch._higher_order_ops.scan(
            lambda c, t: (c + t, (c * t).clone()), v[0] * 0, v)[1],
        torch.ops.higher_order.while_loop: lambda v: torch._higher_order_ops.while_loop(
            lambda i, t: i < 3, lambda i, t: (i + 1, t.cos() * 2), (torch.zeros((), dtype=torch.int64), v))[1],
    }[hop]
    grads = []
    for scale in (1.0, 10.0):
        x = torch.linspace(-1, 1, 6, dtype=torch.float64).reshape(3, 2).requires_grad_()
        v = x - 2
        out = call(v)
        v.copy_(x * scale)
        out.sum().backward()
        grads.append(x.grad)
    return not torch.allclose(grads[0], grads[1])


_PROBES = {
    Fact.SAVES_NO_INPUT: _saves_no_input, Fact.SAVES_NO_RESULT: _saves_no_result,
    Fact.SELF_NOT_SAVED: _self_not_saved, Fact.OWN_GRAD_IGNORES_SELF: _own_grad_ignores_self,
    Fact.WRITE_NOT_RECORDED: _write_not_recorded, Fact.NEVER_DIFFERENTIABLE: _never_differentiable,
    Fact.UNSEEN_ALIAS: _unseen_alias, Fact.BACKWARD_READS_UNCHECKED: _backward_reads_unchecked,
}

# entries the table holds although eager does otherwise, each with why it is kept
_KNOWN_WRONG: dict = {}  # none today; an entry needs its reason (sgn was one: it saves its result)
_ENTRIES = [pytest.param(fact, op, id=f"{fact.name}-{op}",
                         marks=[pytest.mark.xfail(strict=True, reason=_KNOWN_WRONG[fact, op])]
                         if (fact, op) in _KNOWN_WRONG else [])
            for fact, op in sorted(((f, op) for f in Fact for op in ops_with(f)), key=lambda e: (e[0].name, str(e[1])))]


def test_every_fact_has_a_probe_and_entries():
    assert set(_PROBES) == set(Fact)
    assert all(ops_with(fact) for fact in Fact)


@pytest.mark.parametrize(("fact", "op"), _ENTRIES)
def test_autograd_fact_holds_in_eager(fact, op):
    assert has(op, fact)
    assert _PROBES[fact](op), f"{op}: eager no longer does this: {fact.value}"


@pytest.mark.parametrize("op", [_A.mul.Tensor, _A.div.Tensor])
@pytest.mark.parametrize(("a_grad", "b_grad"), [(True, True), (True, False), (False, True)])
def test_ops_that_save_some_operands_save_those_the_rule_names(op, a_grad, b_grad):
    args, _, packed = _saved_call(op, a_grad, b_grad)
    predicted = saved_operands(op)(args, lambda t: t.requires_grad)
    assert {_storage(p) for p in packed} == {_storage(t) for t in predicted}


def test_an_op_without_an_entry_has_no_fact():
    # the safe default: exp saves its result, its results may require grad
    assert not any(has(_A.exp.default, fact) for fact in Fact if fact is not Fact.OWN_GRAD_IGNORES_SELF)
    assert not any(has(_A.softmax.int, fact) for fact in Fact)


class _SgnThenDataWrite(torch.nn.Module):
    def forward(self, x):
        y = x.sgn()
        y.data.mul_(-3)
        return y


def test_a_data_write_to_sgn_s_saved_result_is_refused():
    """Regression: the table said sgn saves no result, so this export passed while eager's complex
    gradient reads the written result and the program's does not (verify compares no complex grads)."""
    import predispatch_func as pf
    from tests.support.expect_refusal import refused

    x = torch.randn(4, dtype=torch.complex64, requires_grad=True)
    with refused(pf.Refusal.DATA_WRITE_AFTER_SAVED_READ, "aten.sgn.default"):
        pf.export(_SgnThenDataWrite(), (x,))


def test_autograd_transparent_writes_match_eager_over_op_db():
    """The in-place ops whose eager write autograd does not record are exactly
    the ops of ``Fact.WRITE_NOT_RECORDED`` (among OpInfo's in-place variants)."""
    from torch.testing._internal.common_methods_invocations import op_db

    from predispatch_func.autograd_facts import Fact, ops_with

    found = set()
    for op in op_db:
        if op.inplace_variant is None or torch.float32 not in op.supported_dtypes("cpu"):
            continue
        for s in list(op.sample_inputs("cpu", torch.float32))[:2]:
            if not isinstance(s.input, torch.Tensor):
                continue
            y = s.input.detach().clone().requires_grad_(True) * 1
            before = y.grad_fn
            try:
                result = op.inplace_variant(y, *s.args, **s.kwargs)
            except (RuntimeError, TypeError, ValueError):
                continue
            if y.grad_fn is before and result is y and s.input.numel():
                found.add(op.name)
    dropouts = {n for n in found if "dropout" in n}  # p=0 / eval: eager returns the input untouched
    assert found - dropouts == {op.overloadpacket.__name__[:-1] for op in ops_with(Fact.WRITE_NOT_RECORDED)}, found
