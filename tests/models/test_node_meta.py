"""Node metadata on a par with torch.export, and ``torch.export.unflatten`` of our programs.

Every call in every graph (region bodies included) carries ``nn_module_stack``,
``torch_fn`` and ``stack_trace`` wherever torch.export writes them, naming the
same modules; ``torch.export.unflatten`` rebuilds the module hierarchy and runs
equal to eager, buffer mutations included. The whole corpus runs with
``-m models``; a hand-made model and the quick CNN run by default.
"""

import copy

import pytest
import torch

import predispatch_func as pf
from predispatch_func.graphs import all_graph_modules
from tests.models.corpus import CASES, build
from tests.support.reference import export_checked

KEYS = ("nn_module_stack", "torch_fn", "stack_trace", "source_fn_stack")


class Counter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.register_buffer("calls", torch.zeros(4))

    def forward(self, x):
        self.calls.add_(1)
        with torch.no_grad():
            scale = x.abs().mean() + 1
        return torch.relu(self.lin(x)) / scale + self.calls


class Twice(torch.nn.Module):
    """One submodule called twice (``@1`` keys), another once, a no_grad region in each."""

    def __init__(self):
        super().__init__()
        self.a, self.b = Counter(), Counter()

    def forward(self, x):
        return self.b(self.a(self.a(x))).sum(-1)


def _calls(ep):
    return [(where, n) for where, gm in all_graph_modules(ep.graph_module)
            for n in gm.graph.nodes if n.op == "call_function"]


def _fqns(ep):
    """Modules some call comes from; torch keeps an identity ``dropout`` (p=0 or eval)
    as a node, which our program does not hold (it decomposes to its input)."""
    return {fqn for _, n in _calls(ep) if n.target is not torch.ops.aten.dropout.default
            for fqn, _ in n.meta.get("nn_module_stack", {}).values()}


def check_metadata_like_torch(model, args, kwargs):
    ours = pf.export(model, args, kwargs)
    theirs = torch.export.export(copy.deepcopy(model), args, kwargs)
    written = {k for _, n in _calls(theirs) for k in KEYS if k in n.meta}
    assert {"nn_module_stack", "torch_fn", "stack_trace"} <= written
    for where, node in _calls(ours):
        lacking = [k for k in written if k not in node.meta]
        assert not lacking, f"{where}: {node.format_node()} lacks {lacking}"
        root = next(iter(node.meta["nn_module_stack"].values()))
        assert root == ("", f"{type(model).__module__}.{type(model).__qualname__}")
    assert _fqns(ours) == _fqns(theirs)
    # the same user frames, formatted as torch's tracer formats them (our HOP calls
    # have no torch twin: a region's trace is its `with` line)
    traces = {n.meta.get("stack_trace") for _, n in _calls(theirs)}
    for where, node in _calls(ours):
        if not isinstance(node.target, torch._ops.HigherOrderOperator) and node.meta.get("stack_trace"):
            assert node.meta["stack_trace"] in traces, f"{where}: {node.format_node()}: {node.meta['stack_trace']}"
    return ours


def check_unflatten_runs_like_eager(model, args, kwargs):
    eager = copy.deepcopy(model)
    ep = pf.export(model, args, kwargs)
    flat = torch.export.unflatten(ep)
    names = {name for name, _ in flat.named_modules()}
    assert {name for name, _ in model.named_modules()
            if any(True for _ in _.parameters(recurse=False))} <= names
    for _ in range(2):  # the second call reads the buffers the first one wrote
        got, want = flat(*args, **kwargs), eager(*args, **kwargs)
        torch.testing.assert_close(torch.utils._pytree.tree_leaves(got),
                                   torch.utils._pytree.tree_leaves(want))
    for name, buf in eager.named_buffers():
        torch.testing.assert_close(flat.get_buffer(name), buf, msg=f"buffer {name}")


def test_hand_model_metadata_and_unflatten():
    model, x = Twice(), torch.randn(3, 4)
    ep = check_metadata_like_torch(model, (x,), {})
    keys = {k for _, n in _calls(ep) for k in n.meta["nn_module_stack"]}
    assert {"L__self__", "L__self__a", "L__self__a@1", "L__self__b", "L__self__a.lin@1"} <= keys
    regions = [gm for where, gm in all_graph_modules(ep.graph_module) if where != "<top>"]
    assert len(regions) == 3 and all(
        n.meta["nn_module_stack"] and "torch_fn" in n.meta
        for gm in regions for n in gm.graph.nodes if n.op == "call_function")
    check_unflatten_runs_like_eager(model, (x,), {})


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_quick_model_unflattens(train):
    model, args, kwargs = build("small_cnn", train=train)
    check_metadata_like_torch(model, args, kwargs)
    check_unflatten_runs_like_eager(model, args, kwargs)


@pytest.mark.models
@pytest.mark.parametrize("name", list(CASES))
def test_corpus_metadata_like_torch(name):
    check_metadata_like_torch(*build(name))


@pytest.mark.models
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("name", list(CASES))
def test_corpus_unflattens(name, train):
    check_unflatten_runs_like_eager(*build(name, train=train))


class Branchy(torch.nn.Module):
    """torch.cond (its branches are traced by dynamo, where our observers stand aside)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda v: torch.softmax(self.lin(v), -1),
                          lambda v: torch.nn.functional.silu(v), (x,))


def test_torch_cond_bodies_carry_metadata_and_unflatten():
    model, x = Branchy(), torch.randn(3, 4)
    ep = pf.export(model, (x,))
    bodies = [gm for where, gm in all_graph_modules(ep.graph_module) if where != "<top>"]
    assert len(bodies) == 2
    for where, node in _calls(ep):
        assert {"nn_module_stack", "torch_fn", "stack_trace"} <= node.meta.keys(), (where, node)
    check_unflatten_runs_like_eager(model, (x,), {})
    check_unflatten_runs_like_eager(model, (-x.abs(),), {})


# --- preserve_module_call_signature ---------------------------------------------------

PRESERVED = {"small_cnn": "features", "bert": "encoder.layer.0", "gpt2": "transformer.h.1",
             "llama": "model.layers.1", "t5": "encoder.block.0", "vit": "layers.1"}


def check_preserved_signature_swaps(model, args, kwargs, path):
    """Like torch.export: the submodule keeps its calling convention, so it can be swapped."""
    eager = copy.deepcopy(model)
    ep = pf.export(model, args, kwargs, preserve_module_call_signature=(path,))
    theirs = torch.export.export(copy.deepcopy(model), args, kwargs, preserve_module_call_signature=(path,))
    ours_sig = {e.fqn: e.signature for e in ep.module_call_graph}
    their_sig = {e.fqn: e.signature for e in theirs.module_call_graph if e.signature is not None}
    assert ours_sig.keys() == their_sig.keys()
    for fqn, sig in their_sig.items():
        assert (sig.in_spec, sig.out_spec) == (ours_sig[fqn].in_spec, ours_sig[fqn].out_spec)
        assert len(sig.inputs) == len(ours_sig[fqn].inputs) and len(sig.outputs) == len(ours_sig[fqn].outputs)
    assert not any(str(n.target).endswith("_export_tracepoint") for _, n in _calls(ep))
    flat = torch.export.unflatten(ep)
    want = torch.utils._pytree.tree_leaves(eager(*args, **kwargs))
    torch.testing.assert_close(torch.utils._pytree.tree_leaves(flat(*args, **kwargs)), want)
    eager_again = copy.deepcopy(eager)
    flat.set_submodule(path, copy.deepcopy(eager.get_submodule(path)))  # the swap
    torch.testing.assert_close(torch.utils._pytree.tree_leaves(flat(*args, **kwargs)),
                               torch.utils._pytree.tree_leaves(eager_again(*args, **kwargs)))


def test_preserved_signatures_of_repeat_calls_and_swap():
    model, x = Twice(), torch.randn(3, 4)
    eager = copy.deepcopy(model)
    ep = pf.export(model, (x,), preserve_module_call_signature=("a", "b"))
    sigs = {e.fqn: e.signature for e in ep.module_call_graph}
    assert sigs.keys() == {"", "a", "a@1", "b"}
    assert [a.name for a in sigs["a"].inputs] == ["x"]
    assert [a.name for a in sigs["a@1"].inputs] == [a.name for a in sigs["a"].outputs]
    flat = torch.export.unflatten(ep)
    for _ in range(2):  # outputs read the counters the calls before wrote
        torch.testing.assert_close(flat(x), eager(x))
    flat.set_submodule("b", copy.deepcopy(eager.b))
    torch.testing.assert_close(flat(x), eager(x))
    check_preserved_signature_swaps(Twice(), (x,), {}, "a")


def test_quick_model_preserved_signature():
    check_preserved_signature_swaps(*build("small_cnn"), PRESERVED["small_cnn"])


@pytest.mark.models
@pytest.mark.parametrize("name", sorted(PRESERVED))
def test_corpus_preserved_signature(name):
    check_preserved_signature_swaps(*build(name), PRESERVED[name])


# --- a module held under two names: the path forward walked, as torch.export names it ---------


class SharedInSequential(torch.nn.Module):
    """One LayerNorm at positions 0 and 2 of a Sequential; one Counter (a buffer it writes) as
    ``self.n`` and ``self.p``, called through both names."""

    def __init__(self):
        super().__init__()
        ln = torch.nn.LayerNorm(4)
        self.seq = torch.nn.Sequential(ln, torch.nn.ReLU(), ln)
        self.n = Counter()
        self.p = self.n

    def forward(self, x):
        return self.p(self.n(self.seq(x)))


class SlicedContainers(torch.nn.Module):
    """A Sequential and a ModuleList sliced in forward, their items one shared module."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.seq = torch.nn.Sequential(*[self.lin] * 3)
        self.items = torch.nn.ModuleList([self.lin] * 3)
        self.table = torch.nn.ModuleDict({"a": self.lin})

    def forward(self, x):
        for m in self.seq[1:2]:
            x = m(x)
        for m in self.items[2:]:
            x = m(x)
        return self.table["a"](x) + self.items[0](x)


def _last_fqns(ep, op):
    return [list(n.meta["nn_module_stack"].values())[-1][0] for _, n in _calls(ep) if n.target is op]


@pytest.mark.parametrize("model, x, op", [
    (SharedInSequential(), torch.randn(3, 4), torch.ops.aten.layer_norm.default),
    (SharedInSequential(), torch.randn(3, 4), torch.ops.aten.linear.default),
    (SlicedContainers(), torch.randn(3, 4), torch.ops.aten.linear.default),
], ids=["sequential", "two-names", "slices"])
def test_a_shared_module_is_named_by_the_path_forward_walked(model, x, op):
    """Regression: a module held twice was named by its first path (``seq.0`` for both calls of a
    LayerNorm at 0 and 2, ``n`` for a call through ``self.p``); torch.export names the path
    forward walked, slices included, and ``unflatten`` builds its modules from those names."""
    ep = export_checked(model, (x,))
    theirs = torch.export.export(copy.deepcopy(model), (x,))
    assert _last_fqns(ep, op) == _last_fqns(theirs, op) and len(_last_fqns(ep, op)) >= 2
    assert len(set(_last_fqns(ep, op))) == len(_last_fqns(ep, op))
    check_unflatten_runs_like_eager(model, (x,), {})
    # the stand-ins are gone: the model's own submodules are what it holds, and it runs as before
    assert all(type(m).__name__ == type(m).__mro__[0].__name__ and "_pf_paths" not in type(m).__dict__
               for m in model.modules())


class BranchCalls(torch.nn.Module):
    """cond branches calling functions, Tensor methods, operators and a nested cond."""

    def inner(self, x):
        y = torch.sin(x) + x.cos()
        y = y.cos() * 2
        z = torch.cond(y.sum() > 0, lambda a: a.exp(), lambda a: torch.nn.functional.relu(a), (y,))
        return z - torch.nn.functional.gelu(y)

    def other(self, x):
        return torch.tanh(x) - x

    def forward(self, x):
        return torch.cond(x.sum() > 0, self.inner, self.other, (x,)) + x.cos()


def _torch_fns_by_graph(ep):
    return {where: [n.meta.get("torch_fn") for n in gm.graph.nodes if n.op == "call_function"]
            for where, gm in ep.graph_module.named_modules() if isinstance(gm, torch.fx.GraphModule)}


def test_calls_in_cond_branches_carry_their_own_torch_fn():
    """Regression: every call in a cond branch carried the cond's ``torch_fn`` (``cond_1``); torch.export
    names the torch call each came from, counted afresh in each branch."""
    model, x = BranchCalls(), torch.randn(2, 3)
    ours = _torch_fns_by_graph(export_checked(model, (x,)))
    assert ours == _torch_fns_by_graph(torch.export.export(model, (x,)))
    assert ours["true_graph_0"][:3] == [("sin_1", "builtin_function_or_method.sin"),
                                        ("cos_1", "method_descriptor.cos"), ("add_1", "method_descriptor.add")]


class LinearThenScale(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        x = self.linear(x)
        x *= 2.0
        return x


@pytest.mark.parametrize("make", ["make_fx", "ep.module()"])
def test_an_exported_graph_module_keeps_its_nodes_stack_traces(make):
    """Regression: a graph module (``make_fx``'s, a program's ``module()``) exported again ran its
    generated code, so its nodes' stack traces named that code (``<eval_with_key>``); torch.export
    runs it node by node and each node's calls keep the node's ``stack_trace``: the model's lines."""
    model, x = LinearThenScale(), torch.randn(4, 4)
    if make == "make_fx":
        gm = torch.fx.experimental.proxy_tensor.make_fx(model, record_stack_traces=True)(x)
    else:
        gm = pf.export(model, (x,)).module()
    ep = export_checked(gm, (x,))
    traces = {n.target: n.meta.get("stack_trace") or "" for n in ep.graph.nodes if n.op == "call_function"}
    assert traces and all("<eval_with_key>" not in t for t in traces.values())
    mul = next(t for target, t in traces.items() if "mul" in str(target))
    assert "in forward\n    x *= 2.0" in mul and __file__ in mul
