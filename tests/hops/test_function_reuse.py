"""A custom Function called again within one export reuses its first call's traced bodies
(``trace/extensions/function_reuse.py``) only where nothing its bodies could read differs;
the program is the same as when every call is traced."""

from __future__ import annotations

import pytest
import torch

import predispatch_func as pf
from predispatch_func.trace.extensions import function_reuse, function_trace


@pytest.fixture
def forward_traces(monkeypatch):
    """How many times a Function's forward was traced in the export that follows."""
    traced: list[str] = []
    original = function_trace._trace_forward

    def counting(call, inner, settings):
        traced.append(call.name)
        return original(call, inner, settings)

    monkeypatch.setattr(function_trace, "_trace_forward", counting)
    return traced


class Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale):
        ctx.save_for_backward(x)
        ctx.scale = scale
        return x * x * scale

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * 2 * x * ctx.scale, None


class Layers(torch.nn.Module):
    """``Square`` after each of three linear layers, with the scales given."""

    def __init__(self, scales=(0.5, 0.5, 0.5), widths=(4, 4, 4)):
        super().__init__()
        self.scales = scales
        self.layers = torch.nn.ModuleList(torch.nn.Linear(4, w) for w in widths)

    def forward(self, x):
        out = []
        for layer, scale in zip(self.layers, self.scales):
            out.append(Square.apply(layer(x), scale))
        return torch.cat(out, dim=-1)


def _loss(out):
    return out.square().sum()


def _checked(model, x, traced, expected_traces):
    traced.clear()
    ep = pf.export(model, (x,))
    assert traced == ["Square"] * expected_traces
    report = pf.verify(ep, model, (x,))
    assert report.ok, report
    jp = pf.export_joint(model, (x,), loss_fn=_loss)
    joint = pf.verify_joint(jp, model, (x,), loss_fn=_loss, calls=2)
    assert joint.ok, joint
    return ep


def test_a_function_called_per_layer_is_traced_once_and_each_call_owns_its_bodies(forward_traces):
    ep = _checked(Layers(), torch.randn(2, 4, requires_grad=True), forward_traces, expected_traces=1)
    bodies = [getattr(ep.graph_module, f"autograd_function_{half}_{i}") for half in ("fwd", "bwd") for i in range(3)]
    assert len({id(b) for b in bodies}) == 6, "each call holds its own copy of the bodies"


def test_the_program_is_the_one_every_call_traced_gives(monkeypatch):
    model, x = Layers(), torch.randn(2, 4, requires_grad=True)
    reused = pf.export(model, (x,)).graph_module.print_readable(print_output=False)
    joint_reused = pf.export_joint(model, (x,), loss_fn=_loss).graph_module.print_readable(print_output=False)
    monkeypatch.setattr(function_reuse, "_call_key", lambda *args: None)
    assert pf.export(model, (x,)).graph_module.print_readable(print_output=False) == reused
    assert pf.export_joint(model, (x,), loss_fn=_loss).graph_module.print_readable(print_output=False) \
        == joint_reused


@pytest.mark.parametrize("model, traces", [
    (Layers(scales=(0.5, 0.25, 0.5)), 2),  # a different plain argument
    (Layers(scales=(1, 1.0, True)), 3),  # equal numbers of other types (an int scale keeps ints integral)
    (Layers(widths=(4, 3, 4)), 2),  # another shape
], ids=["scale", "scale-type", "shape"])
def test_a_call_that_differs_in_an_argument_or_a_shape_is_traced_again(model, traces, forward_traces):
    _checked(model, torch.randn(2, 4, requires_grad=True), forward_traces, expected_traces=traces)


class Counted(torch.autograd.Function):
    """A Function whose result depends on how often it ran (a class attribute it writes)."""

    calls = 0

    @staticmethod
    def forward(ctx, x):
        Counted.calls += 1
        return x * Counted.calls

    @staticmethod
    def backward(ctx, grad):
        return grad * Counted.calls


SCALE = 1.0
TABLE = {"scale": 1.0}


class _Config:
    scale = 1.0


CONFIG = _Config()


class ReadsGlobal(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * SCALE

    @staticmethod
    def backward(ctx, grad):
        return grad * SCALE


class ReadsTable(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * TABLE["scale"]

    @staticmethod
    def backward(ctx, grad):
        return grad * TABLE["scale"]


class ReadsObject(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * CONFIG.scale

    @staticmethod
    def backward(ctx, grad):
        return grad * CONFIG.scale


class StateBetweenCalls(torch.nn.Module):
    """Three calls of ``function``, the global state it reads changed before each."""

    def __init__(self, function):
        super().__init__()
        self.function = function

    def forward(self, x):
        global SCALE
        out = []
        for i in range(3):
            SCALE = float(i + 2)
            TABLE["scale"] = float(i + 2)
            CONFIG.scale = float(i + 2)
            out.append(self.function.apply(x))
        return torch.stack(out)


@pytest.mark.parametrize("function", [ReadsGlobal, ReadsTable, ReadsObject],
                         ids=["global", "global-dict", "global-object"])
def test_a_function_reading_state_changed_between_calls_is_traced_at_each(function, forward_traces):
    model, x = StateBetweenCalls(function), torch.randn(3)
    ep = pf.export(model, (x,))
    assert len(forward_traces) == 3
    torch.testing.assert_close(ep.module()(x), torch.stack([x * 2, x * 3, x * 4]))


def test_a_function_that_writes_its_own_state_is_traced_at_each_call():
    class Thrice(torch.nn.Module):
        def forward(self, x):
            return torch.stack([Counted.apply(x) for _ in range(3)])

    Counted.calls = 0
    x = torch.randn(3)
    ep = pf.export(Thrice(), (x,))
    torch.testing.assert_close(ep.module()(x), torch.stack([x * 1, x * 2, x * 3]))


class Noisy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x + torch.rand_like(x)

    @staticmethod
    def backward(ctx, grad):
        return grad


def test_a_body_that_draws_random_numbers_is_traced_at_each_call(forward_traces):

    class Twice(torch.nn.Module):
        def forward(self, x):
            return Noisy.apply(x) + Noisy.apply(x)

    model, x = Twice(), torch.randn(3)
    ep = pf.export(model, (x,))
    assert forward_traces == ["Noisy", "Noisy"]
    report = pf.verify(ep, model, (x,))
    assert report.ok, report


def test_calls_under_other_grad_modes_are_traced_apart(forward_traces):
    class Modes(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 4)

        def forward(self, x):
            h = Square.apply(self.layer(x), 0.5)
            with torch.no_grad():
                k = Square.apply(self.layer(x), 0.5)
            return h + k + Square.apply(self.layer(h), 0.5)

    model, x = Modes(), torch.randn(2, 4, requires_grad=True)
    ep = pf.export(model, (x,))
    assert forward_traces == ["Square"] * 2
    report = pf.verify(ep, model, (x,))
    assert report.ok, report


def test_calls_on_symbolic_shapes_are_traced_at_each(forward_traces):
    model, x = Layers(), torch.randn(3, 4, requires_grad=True)
    ep = pf.export(model, (x,), dynamic_shapes=({0: torch.export.Dim("batch")},))
    assert forward_traces == ["Square"] * 3
    report = pf.verify(ep, model, (torch.randn(5, 4, requires_grad=True),))
    assert report.ok, report


class WithRegions(torch.autograd.Function):
    """A forward holding an enable_grad region (a subgraph of its own)."""

    @staticmethod
    def forward(ctx, x):
        y = x + 1
        with torch.enable_grad():
            z = torch.mm(y, y.t())
        ctx.save_for_backward(x)
        return z.sum(-1, keepdim=True) + x

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        with torch.no_grad():
            scale = x.abs().mean()
        return grad * scale


def test_bodies_holding_regions_are_reused_as_copies_with_their_regions(forward_traces):
    class Twice(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 4)

        def forward(self, x):
            return WithRegions.apply(self.layer(WithRegions.apply(self.layer(x))))

    model, x = Twice(), torch.randn(4, 4, requires_grad=True)
    ep = pf.export(model, (x,))
    assert forward_traces == ["WithRegions"]
    bodies = [name for name, _ in ep.graph_module.named_modules()
              if name.startswith("autograd_function_") and "." not in name]
    regions = [name for name, _ in ep.graph_module.named_modules() if name.startswith("autograd_function_fwd_")
               and "." in name]
    assert len(bodies) == 4 and len(regions) == 2, list(dict(ep.graph_module.named_modules()))
    assert ep.graph_module.get_submodule(regions[0]) is not ep.graph_module.get_submodule(regions[1])
    report = pf.verify(ep, model, (x,))
    assert report.ok, report


def test_a_function_whose_forward_enters_enable_grad_trains():
    """The joint trace recorded the body's region markers but not the grad-off autograd runs a
    Function's forward in: its graph ended in grad off and was refused as 'leaves grad mode
    changed' (replay_extension, joint/extensions.py)."""
    class Once(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 4)

        def forward(self, x):
            return WithRegions.apply(self.layer(x))

    model, x = Once(), torch.randn(4, 4, requires_grad=True)
    jp = pf.export_joint(model, (x,), loss_fn=_loss)
    joint = pf.verify_joint(jp, model, (x,), loss_fn=_loss, calls=2)
    assert joint.ok, joint
