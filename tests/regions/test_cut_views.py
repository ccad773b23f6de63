"""Views cut from autograd by a grad-off region, read later with grad on (issue 39, item 1).

A view made under ``torch.no_grad()`` carries no autograd history in eager, also when
it is used with grad on afterwards. Functionalization rebuilds such a view from its
base where it is next read; before the fix, the composite policy's guard read
(and so rebuilt) it in the grad mode of the read, ahead of the region-keeping
observer, and the program sent gradient through it (``enc.weight.grad`` off by 1.89
on the issue's repro).

The class is generated: every view op x every consumer, each under a region kind and
after a write kind chosen by rotation (so every pair, region and write is met), and
view x consumer x region kind under the ``exhaustive`` marker (2,560 cases, about 7 minutes). Each program is exported and replayed
against the reference with gradients of parameters and inputs.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from tests.support.reference import export_checked

# a view of the written (4, 4) tensor ``h``, as users write it; each gives a 2-D result
VIEWS = {
    "slice": "h[:, :2]",
    "rows": "h[1:3]",
    "T": "h.T",
    "mT": "h.mT",
    "t": "h.t()",
    "transpose": "h.transpose(0, 1)",
    "permute": "h.permute(1, 0)",
    "view": "h.view(2, 8)",
    "reshape": "h.reshape(8, 2)",
    "narrow": "h.narrow(1, 1, 2)",
    "select_unsqueeze": "h[0].unsqueeze(0)",
    "split": "h.split(2, dim=1)[0]",
    "chunk": "h.chunk(2)[1]",
    "unbind": "h.unbind(0)[2].unsqueeze(1)",
    "expand": "h.expand(2, 4, 4)[1]",
    "diagonal": "h.diagonal().unsqueeze(1)",
    "unfold": "h.unfold(1, 2, 2)[..., 0]",
    "as_strided": "h.as_strided((2, 2), (4, 1))",
    "movedim": "h.movedim(0, 1)",
    "view_chain": "h.view(-1)[:8].view(2, 4)",
}

# a use of the 2-D view ``t`` with grad on; ``w`` is an (8, 8) parameter
CONSUMERS = {
    "at": "t @ w[:t.shape[1], :3]",
    "matmul": "torch.matmul(t, w[:t.shape[1], :3])",
    "mm": "torch.mm(t, w[:t.shape[1], :3])",
    "bmm": "torch.bmm(t.unsqueeze(0), w[:t.shape[1], :3].unsqueeze(0))",
    "linear": "torch.nn.functional.linear(t, w[:3, :t.shape[1]])",
    "einsum": "torch.einsum('ij,jk->ik', t, w[:t.shape[1], :3])",
    "dot": "torch.dot(t.flatten(), w.flatten()[:t.numel()])",
    "mul": "t * w[:t.shape[0], :t.shape[1]]",
    "unary": "t.exp()",
    "softmax": "torch.softmax(t, -1)",
    "layer_norm": "torch.nn.functional.layer_norm(t, t.shape[-1:])",
    "cat": "torch.cat([t, t])",
    "sum": "t.sum()",
    "type_as": "t.type_as(w)",
    "function": "Double.apply(t)",
    "cond": "torch.cond(t.sum() > 0, lambda a: a * 2, lambda a: a - 1, (t,))",
}

# a write to ``h`` before the view is made (nothing: the view is never stale)
WRITES = {
    "relu_": "h.relu_()",
    "add_": "h.add_(1.0)",
    "copy_": "h.copy_(h * 2)",
    "setitem": "h[:, 0] = 0.5",
    "none": "pass",
}

# how the view is cut from autograd: the region header (or call) it is made under
REGIONS = {
    "no_grad": ["with torch.no_grad():", "    t = {view}"],
    "set_grad_enabled_false": ["with torch.set_grad_enabled(False):", "    t = {view}"],
    "set_grad_enabled_call": ["torch.set_grad_enabled(False)", "t = {view}", "torch.set_grad_enabled(True)"],
    "no_grad_in_autocast": ['with torch.autocast("cpu", enabled=False):', "    with torch.no_grad():",
                            "        t = {view}"],
    "autocast_in_no_grad": ["with torch.no_grad():", '    with torch.autocast("cpu", dtype=torch.bfloat16):',
                            "        t = {view}"],
    "nested_no_grad": ["with torch.no_grad():", "    with torch.no_grad():", "        t = {view}"],
    # grad back on inside: eager's view keeps its history (the gradient must flow)
    "enable_grad_in_no_grad": ["with torch.no_grad():", "    with torch.enable_grad():", "        t = {view}"],
    # made with grad on, then read inside a no_grad block and again outside it
    "made_with_grad": ["t = {view}", "with torch.no_grad():", "    s = t.sum()"],
}


class Double(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a):
        return a * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


def _source(view: str, consumer: str, write: str, region: str) -> str:
    body = ["w = self.w", "h = self.enc(x)", WRITES[write]]
    body += [line.format(view=VIEWS[view]) for line in REGIONS[region]]
    body += [f"c = {CONSUMERS[consumer]}",
             "return c.float().sum() * self.head(h).sum(), c"]
    return "def forward(self, x):\n" + "".join(f"    {line}\n" for line in body)


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = torch.nn.Linear(4, 4)
        self.head = torch.nn.Linear(4, 4)
        self.w = torch.nn.Parameter(torch.randn(8, 8))


def build(view: str, consumer: str, write: str, region: str) -> torch.nn.Module:
    namespace = {"torch": torch, "Double": Double}
    exec(_source(view, consumer, write, region), namespace)
    net_type = type(f"Cut_{view}_{consumer}_{write}_{region}", (_Net,), {"forward": namespace["forward"]})
    torch.manual_seed(0)
    return net_type()


def _rotated() -> list[tuple[str, str, str, str]]:
    """Every view with every consumer once, the write and region kinds taken in turn."""
    writes, regions = list(WRITES), list(REGIONS)
    return [(v, c, writes[i % len(writes)], regions[(i // len(writes) + i) % len(regions)])
            for i, (v, c) in enumerate(itertools.product(VIEWS, CONSUMERS))]


def _check(view: str, consumer: str, write: str, region: str) -> None:
    model = build(view, consumer, write, region)
    x = torch.randn(4, 4, requires_grad=True)
    export_checked(model, (x,))


@pytest.mark.parametrize("view,consumer,write,region", _rotated(), ids=["-".join(c) for c in _rotated()])
def test_cut_view_keeps_eagers_gradient(view, consumer, write, region):
    _check(view, consumer, write, region)


def _every_region() -> list[tuple[str, str, str, str]]:
    """Every view x consumer x region kind, the write kinds taken in turn."""
    writes = list(WRITES)
    return [(v, c, writes[i % len(writes)], r)
            for i, (v, c, r) in enumerate(itertools.product(VIEWS, CONSUMERS, REGIONS))]


@pytest.mark.exhaustive
@pytest.mark.parametrize("view,consumer,write,region", _every_region(), ids=["-".join(c) for c in _every_region()])
def test_cut_view_keeps_eagers_gradient_in_every_region(view, consumer, write, region):
    _check(view, consumer, write, region)


def test_issue_repro_gradient_reaches_only_through_the_head():
    """The issue's model: ``enc.weight``'s gradient comes through ``self.head(h)`` only."""

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.enc = torch.nn.Linear(4, 4)
            self.head = torch.nn.Linear(4, 4)

        def forward(self, x):
            h = self.enc(x)
            h.relu_()
            with torch.no_grad():
                target = h[:, :2]
            return self.head(h)[:, :2] @ target.T

    torch.manual_seed(0)
    ep = export_checked(Net(), (torch.randn(3, 4),))
    regions = [n for n in ep.graph_module.graph.nodes if "pf_grad_region" in str(n.target)]
    assert len(regions) == 1, ep.graph_module.code  # the cut view is rebuilt inside a region
