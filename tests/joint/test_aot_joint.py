"""pf.aot_export_module(trace_joint=True): torch's joint calling convention, replayed against the reference."""

from __future__ import annotations

import copy

import torch

import predispatch_func as pf
from tests.joint.cases import CASES


def test_joint_graph_in_torchs_convention_gives_eagers_loss_and_gradients():
    model, args, kwargs, _ = CASES["issue_41_repro"].build()  # returns (loss, logits)
    eager = copy.deepcopy(model)
    gm, sig = pf.aot_export_module(model, args, trace_joint=True, output_loss_index=0)
    backward = sig.backward_signature
    assert backward.loss_output == sig.user_outputs[0]
    assert set(backward.gradients_to_parameters.values()) == {n for n, _ in model.named_parameters()}
    loss, logits = eager(*copy.deepcopy(args))
    loss.backward()
    state = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    inputs = [state[s.target] if s.target is not None else None for s in sig.input_specs]
    users = iter(args)
    flat = [v if v is not None else next(users) for v in inputs]
    outs = dict(zip([s.arg.name for s in sig.output_specs], gm(*[t.detach().clone() for t in flat])))
    torch.testing.assert_close(outs[backward.loss_output], loss.detach())
    for name, parameter in backward.gradients_to_parameters.items():
        torch.testing.assert_close(outs[name], eager.get_parameter(parameter).grad, rtol=1e-5, atol=1e-5)
    (ema,) = [n for n, b in sig.buffers_to_mutate.items()]
    torch.testing.assert_close(outs[ema], eager.ema)


def test_trace_joint_needs_the_loss_index():
    model, args, kwargs, _ = CASES["plain_mlp"].build()
    try:
        pf.aot_export_module(model, args, trace_joint=True)
    except ValueError as e:
        assert "output_loss_index" in str(e)
    else:
        raise AssertionError("no error")
