"""``pf.eager.register`` on a real dispatch key, proven on a backend without hardware.

``tests/eager/backend.py`` implements only Core ATen and the runtime floor on
PrivateUse1 and raises on anything else. With ``pf.eager.register``, and
under a keyed ``pf.eager.on`` session without any registration, the corpus
models run forward and backward on it, equal to plain eager on the CPU: so
nothing outside Core ATen and the floor reaches the backend either way.
"""


import contextlib
import functools

import pytest
import torch

import predispatch_func as pf
from tests.eager import backend
from tests.models.corpus import CASES, build

CORE = pf.OpSet.core_aten()
if torch.cuda.is_available():  # (CI's machine has none: the module runs there)
    pytest.skip("the Python PrivateUse1 test backend breaks CUDA backward in the process that sets it up "
                "(torch's engine.cpp stream assert, docs/runs/gpu-torch-2.11.md run 7): run on a CPU host",
                allow_module_level=True)
# at collection, before any test runs a backward: torch's autograd engine sizes its per-device
# queues when it first starts, and a PrivateUse1 device set up after that has none
backend.setup()
TARGET = backend.TARGET  # Core ATen, and the ops torch cannot lower into it that the corpus calls


@pytest.fixture(scope="module")
def registration():
    backend.setup()
    registration = pf.eager.register("PrivateUse1", TARGET)
    yield registration
    registration.remove()


def test_backend_refuses_ops_outside_its_set_until_registered():
    backend.setup()
    x = backend.to_device(torch.rand(4))
    with pytest.raises(backend.NotOnBackend, match="aten.logit"):
        torch.logit(x, 1e-3)
    registration = pf.eager.register("PrivateUse1", CORE)
    try:
        got = torch.logit(x, 1e-3)
    finally:
        registration.remove()
    assert torch.equal(backend.from_device(got), torch.logit(backend.from_device(x), 1e-3))
    with pytest.raises(backend.NotOnBackend, match="aten.logit"):
        torch.logit(x, 1e-3)


def test_registration_names_the_ops_the_backend_must_have_itself():
    registration = pf.eager.register("PrivateUse1", CORE)
    try:
        unreachable = set(map(str, registration.unreachable))
    finally:
        registration.remove()
    assert "aten.hash_tensor.default" in unreachable
    assert not unreachable & set(CORE.names())


def test_register_refuses_a_backend_without_the_floor():
    with pytest.raises(pf.eager.BackendLacksFloorError) as info:
        pf.eager.register("PrivateUse3", CORE)  # no kernels there at all
    assert info.value.kind is pf.Refusal.EAGER_BACKEND_LACKS_FLOOR
    assert "aten.copy_.default" in info.value.missing


def _loss(out):
    if isinstance(out, torch.Tensor):
        out = [out]
    values = out.values() if hasattr(out, "values") else out
    return sum(v.to(torch.promote_types(v.dtype, torch.float32)).pow(2).mean()  # float64 stays float64
               for v in values if isinstance(v, torch.Tensor) and v.is_floating_point())


def _forward_backward_on_backend(name, session=None, built=None, tolerance: float | None = None):
    """``built``: (model, args, kwargs) of a model not in the corpus (the zoo's): one eager itself
    cannot train is skipped, naming eager's error. Both runs draw from the same seed."""
    model, args, kwargs = built if built is not None else build(name)
    model.train()
    # one device tensor per distinct CPU tensor, so tied weights stay tied; taken before eager's
    # run writes the buffers (running statistics)
    moved: dict[int, torch.Tensor] = {}
    state = {n: moved.setdefault(id(t), backend.to_device(t)) for n, t in  # (a copy)
             [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]}
    torch.manual_seed(0)
    try:
        loss = _loss(model(*args, **kwargs))
        loss.backward()
    except Exception as e:  # noqa: BLE001
        if built is None:
            raise
        pytest.skip(f"eager itself cannot train it: {type(e).__name__}: {e}"[:300])
    dev_args = [backend.to_device(a) if isinstance(a, torch.Tensor) else a for a in args]
    dev_kwargs = {k: backend.to_device(v) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    torch.manual_seed(0)
    with session if session is not None else contextlib.nullcontext():
        dev_loss = _loss(torch.func.functional_call(model, state, tuple(dev_args), dev_kwargs))
        dev_loss.backward()
    floor = max((p.grad.abs().max().item() for p in model.parameters() if p.grad is not None and p.grad.numel()),
                default=0.0)
    close = _normwise(tolerance, floor) if tolerance is not None else functools.partial(
        torch.testing.assert_close, rtol=1e-4, atol=1e-5)
    close(backend.from_device(dev_loss).detach(), loss.detach(), msg="loss")
    for n, p in model.named_parameters():
        q = state[n]
        if p.grad is None:
            assert q.grad is None, n
        else:
            close(backend.from_device(q.grad), p.grad, msg=n)


def _normwise(relative: float, floor: float):
    """Each tensor's largest difference against its largest value (at least ``floor``, the
    largest gradient: a gradient that is zero in exact arithmetic, batch norm's bias before
    another batch norm, is rounding alone): a wrong formula differs at order 1, a float32
    rounding (a constant made in float32) at 1e-7, float64 rounding through a deep network in
    training at 1e-9 or less."""
    def close(got, expected, msg):
        scale = max(expected.abs().max().item() if expected.numel() else 0.0, floor)
        diff = (got - expected).abs().max().item() if expected.numel() else 0.0
        assert diff <= relative * scale + 1e-300, f"{msg}: max difference {diff:.3g} against max value {scale:.3g}"
    return close


def test_quick_model_forward_backward_on_the_backend(registration):
    _forward_backward_on_backend("small_cnn")


@pytest.mark.models
@pytest.mark.parametrize("name", list(CASES))
def test_corpus_model_forward_backward_on_the_backend(registration, name):
    _forward_backward_on_backend(name)


def test_quick_model_forward_backward_on_the_backend_under_a_keyed_session():
    # no registration: the session's key lowers every op outside Core ATen before the backend sees it
    session = pf.eager.on(TARGET)
    _forward_backward_on_backend("small_cnn", session)
    assert session.keyed and session.stats.decomposed


def _in_place_writes(x, y, mask):
    """In-place ops outside Core ATen: twins in it (``add_``, ``mul_``), a twin the session lowers
    (``masked_fill_``), a divisor computed from the destination itself (mixtral's router)."""
    x.add_(y, alpha=2).mul_(3)
    x.masked_fill_(mask, 0.5)
    x.div_(x.sum(-1, keepdim=True))
    x[1:].sub_(y[:-1])  # a view of the destination, another tensor's memory
    return x


def _under(request, under: str):
    """The module's registration (one backend key takes one; torch 2.11 and 2.12 refuse a second
    Python kernel for an op on it), or a keyed session without one."""
    if under == "registration":
        request.getfixturevalue("registration")
        return contextlib.nullcontext()
    return pf.eager.on(TARGET)


@pytest.mark.parametrize("under", ["registration", "keyed session"])
def test_in_place_writes_into_backend_tensors(request, under):
    """A backend's tensors keep their memory to themselves (here a wrapper, whose storage has no
    data): neither the C++ in-place kernel nor eager's overlap check may read it; the write is
    the backend's, equal to eager's on the CPU."""
    backend.setup()
    x, y, mask = torch.rand(4, 5), torch.rand(4, 5), torch.rand(4, 5) > 0.5
    expected = _in_place_writes(x.clone(), y, mask)
    with _under(request, under):
        got = _in_place_writes(*map(backend.to_device, (x, y, mask)))
    torch.testing.assert_close(backend.from_device(got), expected, rtol=0, atol=0)


@pytest.mark.parametrize("under", ["registration", "keyed session"])
def test_gradients_accumulated_into_backend_tensors(request, under):
    """Autograd's engine thread accumulates a weight used twice with ``add_`` (served in C++ on the
    CPU): on a backend's tensors it is the backend's write, and a refusal there must reach the
    caller as an exception, not abort the process."""
    backend.setup()
    w, x = torch.rand(5, 5, requires_grad=True), torch.rand(3, 5)
    (x @ w @ w).tanh().sum().backward()
    dev_w = backend.to_device(w.detach()).requires_grad_()
    with _under(request, under):
        (backend.to_device(x) @ dev_w @ dev_w).tanh().sum().backward()
    torch.testing.assert_close(backend.from_device(dev_w.grad), w.grad)


@pytest.mark.models
@pytest.mark.parametrize("name", list(CASES))
def test_corpus_model_forward_backward_on_the_backend_under_a_keyed_session(name):
    session = pf.eager.on(TARGET)
    _forward_backward_on_backend(name, session)
    assert session.keyed
