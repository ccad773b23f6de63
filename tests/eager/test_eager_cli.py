"""``predispatch-func eager``: the survey of a model run eagerly on an op set."""

import json
import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(tmp_path, *extra):
    (tmp_path / "eager_cli_model.py").write_text(textwrap.dedent("""
        import torch

        class M(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.l = torch.nn.Linear(4, 4)

            def forward(self, x):
                return torch.logit(self.l(x).sigmoid(), 1e-3) + torch.hash_tensor(x).float() * 0

        def make():
            return M(), (torch.randn(3, 4),)
    """))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "predispatch_func.cli", "eager", "eager_cli_model:make", *extra],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)


def test_json_names_decomposed_and_unreachable_ops_with_their_line(tmp_path):
    done = _run(tmp_path, "--target", "core_aten", "--train", "--json")
    assert done.returncode == 1, done.stderr  # an op with no path into the target was met
    report = json.loads(done.stdout)
    assert "aten.logit.default" in report["decomposed"]
    assert "aten.logit_backward.default" in report["decomposed"]  # --train ran the backward too
    assert list(report["unreachable"]) == ["aten.hash_tensor.default"]
    assert "torch.hash_tensor(x)" in report["unreachable"]["aten.hash_tensor.default"][0]
    assert all(not op.startswith("aten.logit") for op in report["reached"])


def test_table_output(tmp_path):
    target = tmp_path / "backend.txt"
    target.write_text("@core_aten\naten.hash_tensor.default\n")
    done = _run(tmp_path, "--target", str(target))
    assert done.returncode == 0, done.stderr
    assert "decomposed into the target" in done.stdout and "aten.logit.default" in done.stdout
