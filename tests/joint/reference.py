"""The joint tests' reference replay: export_joint, prove the caller untouched, verify_joint over steps."""

from __future__ import annotations

import copy

import torch

import predispatch_func as pf
from predispatch_func.graphs import all_graph_modules
from predispatch_func.joint.verify import copy_with_gradient_hooks
from predispatch_func.regions.ops import REGION_HOPS


def export_joint_checked(model, args, kwargs=None, *, loss_fn=None, optimizer=None, calls: int = 2, **kw):
    """Export a joint program and prove it: contract, ``calls`` steps equal eager, model/inputs/RNG unchanged."""
    reference = copy_with_gradient_hooks(model)
    optimizer_state = copy.deepcopy(optimizer.state_dict()) if optimizer is not None else None
    before_inputs = copy.deepcopy((args, kwargs or {}))
    before_rng = torch.get_rng_state()
    ep = pf.export_joint(model, args, kwargs, loss_fn=loss_fn, optimizer=optimizer, **kw)
    assert torch.equal(torch.get_rng_state(), before_rng), "export_joint moved the RNG state"
    for (name, a), b in zip(reference.state_dict().items(), model.state_dict().values()):
        assert torch.equal(a, b), f"export_joint changed model state {name}"
    assert all(p.grad is None for p in model.parameters()), "export_joint left gradients on the model"
    for a, b in zip(torch.utils._pytree.tree_leaves(before_inputs), torch.utils._pytree.tree_leaves((args, kwargs))):
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b) and b.grad is None, "export_joint changed an input"
    if optimizer is not None:
        assert str(optimizer.state_dict()) == str(optimizer_state), "export_joint changed the optimizer"
    pf.verify_joint(ep, reference, args, kwargs, loss_fn=loss_fn, optimizer=optimizer, calls=calls,
                    raise_on_failure=True, target=kw.get("target"))
    return ep


def region_calls(ep) -> list[torch.fx.Node]:
    return [n for _, gm in all_graph_modules(ep.graph_module) for n in gm.graph.nodes if n.target in REGION_HOPS]


def forward_targets(ep) -> list[str]:
    """Every op name in every graph of the program."""
    return [str(n.target) for _, gm in all_graph_modules(ep.graph_module) for n in gm.graph.nodes
            if n.op == "call_function"]
