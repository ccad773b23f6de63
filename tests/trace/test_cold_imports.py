"""What a first export in a fresh process imports: nothing of torch that ``torch.export``'s
own first export needs and ours does not (its tracer's module pulls in aot_autograd and
networkx, a tenth to a third of a second of a cold export), also with an empty disk cache
(a machine that never ran the package); and none of our parts an export without ``target=``
never runs (the training-graph API, pf.eager, the distributed helpers, our decomposition
table, the Python-state judge: 20-25 ms of a first export), which load when first used."""

import json
import os
import subprocess
import sys

_SCRIPT = """
import json, sys, warnings, torch
heavy = ("torch.export._trace", "torch._functorch.aot_autograd", "networkx")
model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU())
before = [m for m in heavy if m in sys.modules]
import predispatch_func as pf
ep = pf.export(model, (torch.randn(1, 3, 8, 8),))
assert torch.allclose(ep.module()(torch.ones(1, 3, 8, 8)), model(torch.ones(1, 3, 8, 8)))
ours_unused = ("predispatch_func.joint", "predispatch_func.eager", "predispatch_func.distributed",
               "predispatch_func.opsets.decompositions", "predispatch_func.state.python_state",
               "predispatch_func.state.state_memos")
unused_loaded = [m for m in ours_unused if m in sys.modules]
pf.export_joint, pf.JointError
lowered, x = torch.nn.Sequential(torch.nn.Hardswish()), torch.randn(2, 3)
core = pf.export(lowered, (x,), target=pf.OpSet.core_aten())
assert torch.allclose(core.module()(x), lowered(x))
after = [m for m in heavy if m in sys.modules]

class Counts(torch.nn.Module):  # writes Python state: the judge and the memo reader run
    def __init__(self):
        super().__init__()
        self.calls, self.seen = 0, {}

    def forward(self, x):
        self.calls += 1
        self.seen[self.calls] = x.shape[0]
        return x * 2

counts = Counts()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    judged = pf.export(counts, (x,), python_state="warn")
assert torch.allclose(judged.module()(x), x * 2) and (counts.calls, counts.seen) == (0, {})
assert any("calls" in str(w.message) for w in caught)
print(json.dumps({"before": before, "after": after, "unused_loaded": unused_loaded,
                  "loaded_on_use": [m for m in ours_unused if m in sys.modules]}))
"""


def _first_export(env: dict) -> dict:
    run = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_a_first_export_imports_no_module_of_torch_exports_tracer(tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]),
           "PREDISPATCH_FUNC_CACHE": str(tmp_path)}  # empty
    got = _first_export(env)
    assert got["before"] == []  # importing torch alone does not import them: the check means something
    assert got["after"] == []
    assert got["unused_loaded"] == []
    # the training-graph API and the decompositions load when used: the check above means something
    assert got["loaded_on_use"] == ["predispatch_func.joint", "predispatch_func.opsets.decompositions",
                                    "predispatch_func.state.python_state", "predispatch_func.state.state_memos"]
