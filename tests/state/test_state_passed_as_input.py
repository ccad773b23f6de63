"""The model's own parameter or buffer passed as a user input (``model(x, model.weight)``).

The input and the state are two graph inputs: ``forward``'s reads of the state read
the state's placeholder, its reads of the argument the input's. Faked as one object,
they were one fake, and the graph read the input wherever ``forward`` read the weight:
called with any other tensor, the program computed with it in place of the weight
(torch.export's program still does, silently). A write through either is a write to
inputs that alias, refused as before.
"""

import pytest
import torch

import predispatch_func as pf
from tests.support.reference import export_checked


class ReadsItsWeightAndAnInput(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(4, 4))
        self.register_buffer("scale", torch.full((4,), 2.0))

    def forward(self, x, w):
        return x @ self.weight * self.scale + w.sum()


@pytest.mark.parametrize("which", ["weight", "scale"])
def test_state_passed_as_an_input_is_read_through_its_own_placeholder(which):
    torch.manual_seed(0)
    model, x = ReadsItsWeightAndAnInput(), torch.randn(3, 4)
    state = getattr(model, which)
    ep = export_checked(model, (x, state))  # replayed against the reference, gradients included
    other = torch.randn_like(state)
    torch.testing.assert_close(ep.module()(x, other), model(x, other))
    reads = {str(a) for n in ep.graph.nodes if n.op == "call_function" for a in n.args}
    assert {"p_weight", "b_scale"} <= reads


def test_state_passed_as_an_input_under_inference_mode():
    torch.manual_seed(0)
    model, x = ReadsItsWeightAndAnInput(), torch.randn(3, 4)
    with torch.inference_mode():
        ep = pf.export(model, (x, model.weight))
    other = torch.randn(4, 4)
    torch.testing.assert_close(ep.module()(x, other), model(x, other))


class WritesItsBufferAndReadsAnInput(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("steps", torch.zeros(2))

    def forward(self, x, s):
        self.steps.add_(1)
        return x + s


def test_a_write_to_state_passed_as_an_input_is_refused_as_a_write_to_inputs_that_alias():
    model = WritesItsBufferAndReadsAnInput()
    with pytest.raises(pf.UnsupportedError, match=r"writes to inputs 'steps', 's', which share memory, and one of them is a parameter, buffer"):
        pf.export(model, (torch.randn(2), model.steps))
    assert torch.equal(model.steps, torch.zeros(2))


def test_state_passed_as_an_input_with_a_dynamic_dim_takes_other_sizes():
    torch.manual_seed(0)
    model, x = ReadsItsWeightAndAnInput(), torch.randn(3, 4)
    ep = pf.export(model, (x, model.scale), dynamic_shapes=(None, {0: torch.export.Dim("n", min=2)}))
    longer = torch.randn(7)
    torch.testing.assert_close(ep.module()(x, longer), model(x, longer))
