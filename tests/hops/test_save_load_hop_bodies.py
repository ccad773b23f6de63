"""Programs whose torch HOP bodies call submodules save and load: their body nodes carry
``nn_module_stack`` in torch.export's form (torch's serializer refused dynamo's raw
entries, keyed by module id and named by the capture's closure path)."""

import io

import pytest
import torch
from torch._higher_order_ops.map import map as torch_map
from torch._higher_order_ops.scan import scan

import predispatch_func as pf
from predispatch_func.graphs import all_graph_modules
from tests.support.reference import export_checked


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)


class CondOverSubmodules(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = Block(), Block()

    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda x: self.a.lin(x), lambda x: self.b.lin(x).cos(), (x,))


class MapOverSubmodule(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block()

    def forward(self, xs):
        return torch_map(lambda x: self.block.lin(x).relu(), xs)


class ScanOverSubmodule(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block()

    def forward(self, init, xs):
        def step(carry, x):
            nxt = self.block.lin(carry) + x
            return nxt, nxt.sum(-1)
        return scan(step, init, xs)


CASES = {
    "cond": (CondOverSubmodules, lambda: (torch.randn(2, 3),)),
    "map": (MapOverSubmodule, lambda: (torch.randn(4, 2, 3),)),
    "scan": (ScanOverSubmodule, lambda: (torch.randn(2, 3), torch.randn(4, 2, 3))),
}


@pytest.mark.parametrize("name", list(CASES))
def test_program_with_submodules_in_hop_bodies_round_trips(name):
    model_cls, make_args = CASES[name]
    torch.manual_seed(0)
    model, args = model_cls(), make_args()
    ep = export_checked(model, args)
    for where, gm in all_graph_modules(ep.graph_module):
        for node in gm.graph.nodes:
            for key, (fqn, kind) in node.meta.get("nn_module_stack", {}).items():
                assert key.startswith("L__self__") and isinstance(kind, str), (where, node.format_node())
                assert fqn == "" or model.get_submodule(fqn) is not None
    buffer = io.BytesIO()
    torch.export.save(ep, buffer)
    buffer.seek(0)
    loaded = pf.load(buffer)
    torch.testing.assert_close(loaded.module()(*args), model(*args))
    pf.verify(loaded, model, args, raise_on_failure=True)



def test_program_binding_an_unbacked_size_in_a_hop_round_trips():
    """hop_db's while_loop_stack_output stacks a data-dependent number of results: the
    program binds an unbacked size (u0), whose range torch.export.load reads."""
    from tests.support.hop_db_cases import hop_db_cases

    model, args = next((m, a) for name, m, a, _ in hop_db_cases(1)
                       if name == "hop/while_loop_stack_output.simple/0")
    ep = export_checked(model, args, check_grads=False)
    buffer = io.BytesIO()
    torch.export.save(ep, buffer)
    buffer.seek(0)
    loaded = pf.load(buffer)
    torch.testing.assert_close(loaded.module()(*args), model(*args))
