"""The tests' reference replay: export, check the contract, replay against the reference, snapshot.

Every edge-case test goes through :func:`export_checked`, so no test can
check a printed graph without also proving the program equals eager.
"""

from __future__ import annotations

import copy

import torch
from torch.export.graph_signature import OutputKind

import predispatch_func as pf
from predispatch_func import _torch_compat as tc
from predispatch_func.state.history_free_copy import deepcopy_without_history
from predispatch_func.verify import all_graph_modules


def _state_snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict(keep_vars=True).items()}


def export_checked(model: torch.nn.Module, args: tuple, kwargs: dict | None = None, *,
                   check_values: bool = True, check_grads: bool = True, tolerance: dict | None = None,
                   reference: torch.nn.Module | None = None, **export_kwargs) -> torch.export.ExportedProgram:
    """Export, then prove: contract holds, replay equals eager, nothing of the caller changed.

    ``tolerance``: ``rtol``/``atol`` for the replay (low-precision programs). ``reference``: the
    module the program is replayed against, ``model`` by default (:func:`on_export_branch`)."""
    kwargs = kwargs or {}
    before_state = _state_snapshot(model)
    before_inputs = copy.deepcopy((args, kwargs))
    before_rng = torch.get_rng_state()
    ep = pf.export(model, args, kwargs, **export_kwargs)
    assert torch.equal(torch.get_rng_state(), before_rng), "export moved the RNG state"
    after_state = _state_snapshot(model)
    assert before_state.keys() == after_state.keys()
    for k in before_state:
        assert torch.equal(before_state[k], after_state[k]), f"export changed model state {k}"
    flat_before = torch.utils._pytree.tree_leaves(before_inputs)
    flat_now = torch.utils._pytree.tree_leaves((args, kwargs))
    for a, b in zip(flat_before, flat_now):
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b), "export changed an input"
    pf.verify(ep, model if reference is None else reference, args, kwargs, raise_on_failure=True, check_values=check_values,
              check_grads=check_grads, **(tolerance or {}))
    return ep


def on_export_branch(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` run eagerly down the branch its code takes while exported
    (``torch.compiler.is_exporting()`` true, as in every trace of ours and torch.export's),
    sharing its parameters and their names. The reference for a model that computes
    otherwise when exported (transformers' attention: an explicit causal mask, so
    ``repeat_kv``), where the two branches agree in exact arithmetic only."""
    base = type(model)

    def forward(self, *args, **kwargs):
        with tc.exporting_state():
            return base.forward(self, *args, **kwargs)

    branch = copy.copy(model)
    branch.__class__ = type(f"{base.__name__}OnExportBranch", (base,), {"forward": forward})
    return branch


def graph_code(ep: torch.export.ExportedProgram) -> str:
    """The top graph's code followed by each region body, for snapshots."""
    parts = []
    for where, gm in all_graph_modules(ep.graph_module):
        header = "" if where == "<top>" else f"# {where}\n"
        parts.append(header + gm.code.strip())
    return "\n\n".join(parts)


def export_case(name: str, **export_kwargs) -> torch.export.ExportedProgram:
    """Build the catalogue case ``name`` (tests/support/cases_core.py) and :func:`export_checked` it."""
    from tests.support.cases_core import CASES

    case = CASES[name]
    model, args, kwargs = case.build()
    return export_checked(model, args, kwargs, check_values=case.check_values, **export_kwargs)


def mutations(ep: torch.export.ExportedProgram) -> list[tuple[str, str]]:
    """(kind, target) of every mutation output, in signature order."""
    return [(s.kind.name, s.target) for s in ep.graph_signature.output_specs
            if s.kind != OutputKind.USER_OUTPUT]


def call_targets(ep: torch.export.ExportedProgram) -> set[str]:
    """The names of every op called anywhere in the program, e.g. ``aten.linear.default``."""
    return {str(n.target) for _, gm in all_graph_modules(ep.graph_module)
            for n in gm.graph.nodes if n.op == "call_function"}


def _fresh(value):
    """Clones of every tensor leaf, keeping requires_grad (a tensor passed twice stays one)."""
    memo = {}

    def one(t):
        if id(t) not in memo:
            memo[id(t)] = t.detach().clone().requires_grad_(t.requires_grad)
        return memo[id(t)]
    return torch.utils._pytree.tree_map_only(torch.Tensor, one, value)


def _assert_same(what, a, b, rtol=1e-4, atol=1e-5):
    fa, sa = torch.utils._pytree.tree_flatten(a)
    fb, sb = torch.utils._pytree.tree_flatten(b)
    assert sa == sb, f"{what}: structure {sa} vs {sb}"
    for i, (x, y) in enumerate(zip(fa, fb)):
        if isinstance(x, torch.Tensor):
            assert isinstance(y, torch.Tensor) and x.shape == y.shape and x.dtype == y.dtype, \
                f"{what}[{i}]: reference {x!r:.80} vs program {y!r:.80}"
            assert torch.allclose(x.detach(), y.detach(), rtol=rtol, atol=atol, equal_nan=True), \
                f"{what}[{i}]: reference {x} vs program {y}"
            assert x.requires_grad == y.requires_grad, f"{what}[{i}]: requires_grad differs"
        else:
            assert x == y, f"{what}[{i}]: reference {x!r} vs program {y!r}"


def replay_calls(ep, model, args, kwargs=None, *, calls=2, grads=True, rtol=1e-4, atol=1e-5):
    """Run a copy of ``model`` and of ``ep.module()`` ``calls`` times in a row on fresh clones
    of the inputs: outputs, written-back inputs, state and (with ``grads``) gradients must
    equal eager's (within ``rtol``/``atol``) after every call, so state carried from one call
    to the next is checked. Tensors may live on any device."""
    kwargs = kwargs or {}
    tol = {"rtol": rtol, "atol": atol}
    eager = deepcopy_without_history(model)  # a model run before export keeps tensors of that call
    program = copy.deepcopy(ep).module()
    for call in range(calls):
        e_in, p_in = _fresh((args, kwargs)), _fresh((args, kwargs))
        torch.manual_seed(call)
        e_out = eager(*e_in[0], **e_in[1])
        torch.manual_seed(call)
        p_out = program(*p_in[0], **p_in[1])
        _assert_same(f"call {call} output", e_out, p_out, **tol)
        _assert_same(f"call {call} inputs after", e_in, p_in, **tol)
        _assert_same(f"call {call} state", dict(sorted(eager.state_dict().items())),  # by name: the order of
                     dict(sorted(program.state_dict().items())), **tol)  # tied weights' names is no part of the state
        if not grads:
            continue
        outs = [(e, p) for e, p in zip(torch.utils._pytree.tree_leaves(e_out),
                                       torch.utils._pytree.tree_leaves(p_out))
                if isinstance(e, torch.Tensor) and e.requires_grad]
        if not outs:
            continue
        weights = [torch.randn(e.shape, generator=torch.Generator().manual_seed(7)).to(e.device) for e, _ in outs]
        sum((e * w).sum() for (e, _), w in zip(outs, weights)).backward()
        sum((p * w).sum() for (_, p), w in zip(outs, weights)).backward()
        e_params, p_params = dict(eager.named_parameters()), dict(program.named_parameters())
        for name, param in e_params.items():
            e_grad, p_grad = param.grad, p_params[name].grad
            if e_grad is None or p_grad is None:
                assert (e_grad is None or not e_grad.any()) and (p_grad is None or not p_grad.any()), \
                    f"call {call}: grad of {name}: reference {e_grad} vs program {p_grad}"
            else:
                _assert_same(f"call {call} grad of {name}", e_grad, p_grad, **tol)
        e_leaves = [t for t in torch.utils._pytree.tree_leaves(e_in) if isinstance(t, torch.Tensor)]
        p_leaves = [t for t in torch.utils._pytree.tree_leaves(p_in) if isinstance(t, torch.Tensor)]
        for i, (e, p) in enumerate(zip(e_leaves, p_leaves)):
            if e.requires_grad and e.is_leaf:
                _assert_same(f"call {call} grad of input {i}",
                             e.grad if e.grad is not None else torch.zeros_like(e),
                             p.grad if p.grad is not None else torch.zeros_like(p), **tol)
        for module in (eager, program):
            module.zero_grad(set_to_none=True)


def caller_state(model, inputs):
    """Everything of the caller's that exporting must leave as it was, in comparable form:
    every module's attributes (tensors by value, version and grad), train flags, inputs,
    RNG state, grad mode and autocast state."""
    def tensor(t):
        return ("tensor", t.detach().clone(), t._version, t.requires_grad,
                None if not t.is_leaf or t.grad is None else t.grad.clone(), t.shape, t.dtype)

    def value(v):
        if isinstance(v, torch.Tensor):
            return tensor(v)
        if isinstance(v, dict):
            return ("dict", id(v), {k: value(x) for k, x in v.items()})
        if isinstance(v, (list, tuple, set)):
            return (type(v).__name__, id(v) if not isinstance(v, tuple) else None,
                    [value(x) for x in (sorted(v, key=repr) if isinstance(v, set) else v)])
        return ("object", id(v), repr(v)[:200])
    modules = {name: {k: value(v) for k, v in vars(m).items()} for name, m in model.named_modules()}
    return {"modules": modules, "inputs": value(inputs),
            "rng": torch.get_rng_state(), "grad": torch.is_grad_enabled(),
            "autocast": (torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"),
                         torch.is_autocast_cache_enabled())}


def assert_same_caller_state(before, after, where=""):
    def same(a, b, path):
        if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
            assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor), path
            assert a.shape == b.shape and a.dtype == b.dtype and a.device == b.device, f"{where}: {path} changed"
            assert a.device.type == "meta" or torch.equal(a, b), f"{where}: {path} changed"
        elif isinstance(a, dict):
            assert isinstance(b, dict) and a.keys() == b.keys(), f"{where}: {path} keys {a.keys()} vs {b.keys()}"
            for k in a:
                same(a[k], b[k], f"{path}.{k}")
        elif isinstance(a, (list, tuple)):
            assert isinstance(b, (list, tuple)) and len(a) == len(b), f"{where}: {path} changed"
            for i, (x, y) in enumerate(zip(a, b)):
                same(x, y, f"{path}[{i}]")
        else:
            assert a == b, f"{where}: {path}: {a!r:.100} became {b!r:.100}"
    same(before, after, "")

