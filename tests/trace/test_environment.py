"""The trace's environment (trace/environment.py): every manager around a traced forward, in order.

The lists below are what an export enters, recorded as it enters them: a reordered, added or
dropped manager is a visible diff here. Every entered manager is exited, in reverse, also
when the export raises.
"""

import pytest
import torch

import predispatch_func as pf
from predispatch_func.errors import ExportError, UnsupportedError
from predispatch_func.trace import environment
from tests.support.reference import export_checked

# each layer's managers, outermost first
LAYERS = {
    "export": ["caller's fake mode unset"],
    "call": ["module inputs flattened", "fake tensor leaks watched"],
    "model state": ["state guard", "fake dispatch seeded"],
    "tracer": ["caller's modes neutral", "autocast nesting", "exporting", "rnn decompositions as eager",
               "rnn weights left unflattened", "HOP partitioner quiet",
               "pre-dispatch pushes without uncache", "lazy graph modules",
               "stack capture only under a recordable frame", "module methods left unpatched",
               "static tensor metadata", "op calls recorded directly", "node values unsnapshotted", "fake mode"],
    "traced function": ["functional mode", "grad on", "caller's autocast cache", "torch HOP rules",
                        "autograd Functions traced", "inference mode as grad mode", "compiled modules run eagerly",
                        "torch HOP limits refused", "HOP capture static", "func transforms below autograd",
                        "autograd calls refused", "tensor subclass API", "subclass constructors unrecorded"],
    "caller": ["caller's modes", "eager fast paths", ".data as functional ops", "reseeds routed",
               "CUDA autocast without a GPU", "CUDA sdpa choice without a GPU",
               "CUDA batch norm reserve without a GPU", "CUDA grid sampler without a GPU",
               "detach without the mode"],
    "model call": ["state swapped for traced inputs", "tracer noted for leaks", "non-strict call rewrites",
                   "node metadata", "preserved call brackets", "tensor attribute warning", "after the call"],
    "body trace": ["outside the trace", "the caller's torch-function modes hidden", "autocast off"],
    "body": ["caller's autocast, unrecorded"],
}

# the layers in the order an export of ScaledByFunction enters them: the program's, then the
# Function's forward body and its backward body, each traced from inside the model's call
PROGRAM = ["export", "call", "model state", "tracer", "traced function", "caller", "model call"]
BODY = ["body trace", "tracer", "traced function", "caller", "body"]
ORDER = PROGRAM + BODY + BODY


class Triple(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 3

    @staticmethod
    def backward(ctx, g):
        return g * 3


class ScaledByFunction(torch.nn.Module):
    def __init__(self, fail: str | None = None):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.register_buffer("seen", torch.zeros(4))
        self.fail = fail

    def forward(self, x):
        y = Triple.apply(self.lin(x))
        with torch.no_grad():
            self.seen.add_(y.sum(0))
        if self.fail == "python":
            raise ValueError("the model's own error")
        if self.fail == "refusal":
            torch.manual_seed(0)
            return y + torch.rand_like(y)  # a draw after reseeding inside forward: refused
        return y * 2


@pytest.fixture
def entered(monkeypatch):
    """(event, layer, entry) for each manager entered ("enter") and each one exited ("exit")."""
    events: list[tuple[str, str, str]] = []
    enter = environment._enter

    def recorded(stack, layer, entry):
        assert entry.why.strip(), f"{layer}: {entry.name} says not why it is there"
        value = enter(stack, layer, entry)
        events.append(("enter", layer, entry.name))
        stack.callback(events.append, ("exit", layer, entry.name))  # runs as the manager's exit begins
        return value

    monkeypatch.setattr(environment, "_enter", recorded)
    return events


def _layers_entered(events):
    """The entered managers grouped into consecutive runs of one layer: [(layer, [names])]."""
    runs: list[tuple[str, list[str]]] = []
    for event, layer, name in events:
        if event != "enter":
            continue
        if runs and runs[-1][0] == layer and name not in runs[-1][1]:
            runs[-1][1].append(name)
        else:
            runs.append((layer, [name]))
    return runs


def _assert_exited_in_reverse(events):
    open_: list[tuple[str, str]] = []
    for event, layer, name in events:
        if event == "enter":
            open_.append((layer, name))
        else:
            assert open_ and open_.pop() == (layer, name), f"{layer}: {name} exited out of order"
    assert open_ == [], f"left entered: {open_}"


def test_an_export_enters_the_declared_layers_in_order(entered):
    export_checked(ScaledByFunction(), (torch.randn(2, 4),))
    runs = _layers_entered(entered)
    assert [layer for layer, _ in runs] == ORDER
    for layer, names in runs:
        assert names == LAYERS[layer], layer
    _assert_exited_in_reverse(entered)


@pytest.mark.parametrize("fail", ["python", "refusal"])
def test_every_entered_manager_is_exited_when_the_export_raises(entered, fail):
    raised = UnsupportedError if fail == "refusal" else ExportError
    with pytest.raises(raised):
        pf.export(ScaledByFunction(fail), (torch.randn(2, 4),))
    assert [layer for layer, _ in _layers_entered(entered)] == ORDER
    _assert_exited_in_reverse(entered)


def test_the_check_sees_a_manager_left_entered():
    with pytest.raises(AssertionError, match="left entered"):
        _assert_exited_in_reverse([("enter", "tracer", "exporting")])
    with pytest.raises(AssertionError, match="out of order"):
        _assert_exited_in_reverse([("enter", "tracer", "a"), ("enter", "tracer", "b"), ("exit", "tracer", "a")])


def test_a_body_trace_keeps_only_the_metadata_mode_and_torch_exports_handler():
    """Not the caller's pre-dispatch recorder (torch's autocast records into the first one of the
    stack), nor its other modes: the body's trace pushes its own."""
    from torch._export.non_strict_utils import _NonStrictTorchFunctionHandler
    from torch.fx.experimental.proxy_tensor import PreDispatchTorchFunctionMode
    from torch.overrides import TorchFunctionMode

    from predispatch_func.passes.node_meta import _TorchFnMode
    from predispatch_func.trace.environment import carried_into_bodies

    assert carried_into_bodies(_TorchFnMode()) and carried_into_bodies(_NonStrictTorchFunctionHandler())
    assert not carried_into_bodies(PreDispatchTorchFunctionMode(tracer=None))
    assert not carried_into_bodies(TorchFunctionMode())
