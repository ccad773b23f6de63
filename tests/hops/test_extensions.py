"""``torch.inference_mode()`` inside forward and ``torch.compile``-d submodules.

inference_mode exports as a ``no_grad`` region: equal to eager wherever eager
runs. Where eager raises (an inference tensor saved for backward outside the
region), the program runs: that is the one difference, shown below.
"""

import pytest
import torch
from expecttest import TestCase

import predispatch_func as pf
from tests.support.reference import export_checked, graph_code


class InferenceModeFeature(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.frozen = torch.nn.Linear(3, 3)
        self.head = torch.nn.Linear(3, 3)

    def forward(self, x):
        with torch.inference_mode():
            feature = self.frozen(x).relu()
        return self.head(x) + feature.sum(-1, keepdim=True)


class InferenceModeDecoratorAndOff(torch.nn.Module):
    @torch.inference_mode()
    def stats(self, x):
        with torch.inference_mode(False):  # grad back on, as in eager
            inner = x * 3
        return x.mean(), inner

    def forward(self, x):
        mean, inner = self.stats(x)
        return x * mean + inner


class InferenceTensorSavedForBackward(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(3))

    def forward(self, x):
        with torch.inference_mode():
            y = x * 2
        return y * self.w  # eager: "Inference tensors cannot be saved for backward"


class CompiledParts(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.block = torch.compile(torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.GELU()))

    def forward(self, x):
        return torch.sigmoid(self.block(x))


@torch.compile
def compiled_gelu_scale(x, w):
    return torch.nn.functional.gelu(x @ w) * 2


@torch.compile(backend="eager")
def compiled_in_place(t):
    return t.sin().add_(1)


class CompiledFunctions(torch.nn.Module):
    """Plain functions wrapped in torch.compile, called in forward (one under no_grad)."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(3, 3))

    def forward(self, x):
        y = compiled_gelu_scale(x, self.w)
        with torch.no_grad():
            z = compiled_in_place(x.clone())
        return y * z


class ExtensionsTest(TestCase):
    def setUp(self):
        torch.manual_seed(0)
        self.x = torch.randn(2, 3)

    def test_inference_mode_is_a_no_grad_region(self):
        ep = export_checked(InferenceModeFeature(), (self.x,))
        self.assertIn("pf_grad_region(False", graph_code(ep))

    def test_inference_mode_decorator_and_inference_mode_false(self):
        export_checked(InferenceModeDecoratorAndOff(), (self.x,))

    def test_where_inference_mode_differs_eager_raises(self):
        model = InferenceTensorSavedForBackward()
        with pytest.raises(RuntimeError, match="Inference tensors cannot be saved for backward"):
            model(self.x)
        out = pf.export(model, (self.x,)).module()(self.x)  # the program computes what no_grad would
        torch.testing.assert_close(out, (self.x * 2) * model.w)

    def test_compiled_submodule_is_traced_through(self):
        ep = export_checked(CompiledParts(), (self.x,))
        self.assertIn("aten.linear.default", graph_code(ep))

    def test_compiled_function_is_traced_through(self):
        ep = export_checked(CompiledFunctions(), (self.x,))
        code = graph_code(ep)
        self.assertIn("aten.gelu.default", code)
        self.assertIn("pf_grad_region(False", code)
        self.assertNotIn("CompiledFunction", code)
