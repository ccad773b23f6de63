"""One lowering for both paths: ops torch leaves undecomposed, lowered by our decompositions in
``export(..., target=core_aten)`` (forward and joint programs) and in ``pf.eager.on(core_aten)``."""

from __future__ import annotations

import pytest
import torch

import predispatch_func as pf
from predispatch_func import _torch_compat as tc
from predispatch_func.graphs import all_graph_modules
from tests.joint.reference import export_joint_checked

CORE = pf.OpSet.core_aten()
aten = torch.ops.aten
# cumprod and hypot in the forward; upsample_bilinear2d_backward in the backward
OURS = (aten.cumprod.default, aten.hypot.default, aten.upsample_bilinear2d_backward.default)


class Blend(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.linspace(0.5, 1.5, 4))

    def forward(self, x):
        up = torch.nn.functional.interpolate(x, scale_factor=2, mode="bilinear")
        return torch.hypot(torch.cumprod(up * self.scale, -1), up).mean(1)


def _ops(ep) -> set:
    return {n.target for _, gm in all_graph_modules(ep.graph_module) for n in gm.graph.nodes if n.op == "call_function"}


def _eager_step(model, x):
    out = model(x)
    (out * torch.linspace(-1, 1, out.numel()).reshape(out.shape)).sum().backward()
    return out.detach(), x.grad, model.scale.grad


def _fresh():
    torch.manual_seed(0)
    return Blend(), torch.rand(2, 3, 2, 2).add(0.5).requires_grad_()


def test_torch_leaves_these_ops_undecomposed():
    torch_tables = {**tc.aten_decomposition_table(), **tc.core_aten_decomposition_table()}
    assert not any(op in torch_tables or op in CORE for op in OURS)


def test_export_to_core_aten_lowers_them_and_equals_eager_with_gradients():
    model, x = _fresh()
    expected = _eager_step(model, x)
    model, x = _fresh()
    ep = pf.export(model, (x.detach(),), target=CORE)
    assert not _ops(ep) & set(OURS)
    program = ep.module()
    out = program(x)
    (out * torch.linspace(-1, 1, out.numel()).reshape(out.shape)).sum().backward()
    got = out.detach(), x.grad, dict(program.named_parameters())["scale"].grad
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b)


class Pool3d(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.linspace(0.5, 1.5, 4))

    def forward(self, x):
        return torch.nn.functional.max_pool3d(x * self.scale, 2)


def test_joint_export_lowers_the_backward_kernel():
    """The joint program's backward calls max_pool3d_with_indices_backward (kept where the target
    allows it); into Core ATen it is our scatter of the gradient, equal to eager over two steps."""
    backward = aten.max_pool3d_with_indices_backward.default
    torch.manual_seed(0)
    x = torch.randn(1, 2, 4, 4, 4)
    allowed = CORE | pf.OpSet.from_names([str(backward)])
    assert backward in _ops(pf.export_joint(Pool3d(), (x,), loss_fn=lambda out: out.sum(), target=allowed))
    ep = export_joint_checked(Pool3d(), (x,), loss_fn=lambda out: (out * out).sum(), target=CORE)
    assert backward not in _ops(ep)


def test_eager_session_runs_them_as_the_same_decompositions():
    model, x = _fresh()
    expected = _eager_step(model, x)
    model, x = _fresh()
    with pf.eager.on(CORE) as session:
        got = _eager_step(model, x)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b)
    assert all(op in session.stats.decomposed for op in OURS), session.stats.decomposed


def test_export_names_an_op_whose_decomposition_reads_data():
    """unique's decomposition reads its output size from the data: pf.eager runs it (uncached),
    export names it as unreachable and says why, rather than a data-dependent trace error."""
    class Unique(torch.nn.Module):
        def forward(self, x):
            return torch.unique(x)

    x = torch.tensor([3.0, 1.0, 3.0])
    with pytest.raises(pf.UnsupportedError, match=r"aten\._unique2\.default: its decomposition reads tensor data"):
        pf.export(Unique(), (x,), target=CORE)
    with pf.eager.on(CORE) as session:
        got = Unique()(x)
    assert torch.equal(got, torch.unique(x)) and aten._unique2.default in session.stats.decomposed


class Spectral(torch.nn.Module):
    """Singular values, a pseudo-inverse and symmetric eigenvectors (through a sign-free use)."""

    def __init__(self):
        super().__init__()
        # full rank: a zero singular value has no derivative (eager's and ours are different subgradients)
        weight = torch.linspace(-1, 1, 12, dtype=torch.float64).reshape(4, 3) + torch.eye(4, 3, dtype=torch.float64)
        self.weight = torch.nn.Parameter(weight)

    def forward(self, x):
        y = x @ self.weight
        _, vectors = torch.linalg.eigh(y.mT @ y)
        return torch.linalg.svdvals(y), torch.linalg.pinv(y), vectors.abs()


SPECTRAL_OPS = (aten._linalg_svd.default, aten._linalg_eigh.default, aten.linalg_pinv.atol_rtol_tensor)


def test_spectral_ops_lower_the_same_way_on_both_paths():
    """Jacobi's eigh and SVD (ours: torch has no decomposition of either) in a program exported to
    Core ATen and in an eager session, each equal to eager with gradients."""
    torch.manual_seed(0)
    x = torch.randn(2, 5, 4, dtype=torch.float64)

    def step(model, inputs):
        outputs = model(inputs)
        total = sum((o * torch.linspace(-1, 1, o.numel(), dtype=o.dtype).reshape(o.shape)).sum() for o in outputs)
        parameters = [p for p in model.parameters()]
        return [o.detach() for o in outputs], torch.autograd.grad(total, [inputs, *parameters])

    expected = step(Spectral(), x.clone().requires_grad_())
    ep = pf.export(Spectral(), (x,), target=CORE)
    assert not _ops(ep) & set(SPECTRAL_OPS)
    exported = step(ep.module(), x.clone().requires_grad_())
    with pf.eager.on(CORE) as session:
        eager = step(Spectral(), x.clone().requires_grad_())
    assert all(op in session.stats.decomposed for op in SPECTRAL_OPS), session.stats.decomposed
    for path, got in (("export", exported), ("pf.eager", eager)):
        torch.testing.assert_close(got, expected, msg=lambda m, path=path: f"{path}: {m}")


class PublicOverPrivate(torch.nn.Module):
    """Ops whose eager kernel calls a private op with our decomposition: pf.eager (below autograd)
    meets the private one, export (above it) the public one. Only the private one had a decomposition,
    so export refused what pf.eager ran ("torch has no decomposition")."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.linspace(-1, 1, 12, dtype=torch.float64).reshape(2, 2, 3))

    def forward(self, x, factor):
        scan = torch.logcumsumexp(x * self.weight, -1)
        solved = torch.cholesky_solve(self.weight, factor)  # factor (2, 2) broadcast over the batch
        buffer = x.new_empty_strided((2, 3), (1, 2))  # uninitialised: only its layout is compared
        return scan.sum() + solved.pow(2).sum(), buffer


def _public_over_private():
    torch.manual_seed(0)
    a = torch.randn(2, 2, dtype=torch.float64)
    factor = torch.linalg.cholesky(a @ a.T + 2 * torch.eye(2, dtype=torch.float64))
    return PublicOverPrivate(), (torch.randn(2, 2, 3, dtype=torch.float64), factor)


@pytest.mark.parametrize("target", [CORE, None], ids=["core_aten", "plain"])
def test_a_public_op_lowers_as_the_private_op_its_kernel_calls(target):
    model, args = _public_over_private()
    ep = pf.export(model, args, target=target)
    public = {aten.logcumsumexp.default, aten.cholesky_solve.default, aten.new_empty_strided.default}
    assert not _ops(ep) & public if target is not None else public <= _ops(ep)
    program = ep.module()
    loss, buffer = program(*args)
    loss.backward()
    expected_loss, expected_buffer = model(*args)
    expected_loss.backward()
    torch.testing.assert_close(loss, expected_loss)
    torch.testing.assert_close(dict(program.named_parameters())["weight"].grad, model.weight.grad)
    assert (buffer.shape, buffer.stride(), buffer.dtype) == (expected_buffer.shape, expected_buffer.stride(),
                                                             expected_buffer.dtype)


class _Zeroed(PublicOverPrivate):
    def forward(self, x, factor):  # the uninitialised buffer zeroed: an output the replay can compare
        loss, buffer = super().forward(x, factor)
        return loss, buffer.zero_()


def test_a_public_op_lowers_in_the_joint_program_too():
    _, args = _public_over_private()
    export_joint_checked(_Zeroed(), args, loss_fn=lambda out: out[0], target=CORE)
