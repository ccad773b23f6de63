"""``predispatch-func export MODULE:FACTORY --joint [--optimizer sgd|adamw] [--target ...]``."""

import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(tmp_path, *extra):
    (tmp_path / "joint_cli_model.py").write_text(textwrap.dedent("""
        import torch

        class M(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.l = torch.nn.Linear(4, 4)
                self.n = torch.nn.LayerNorm(4)

            def forward(self, x):
                return self.n(self.l(x)).pow(2).mean()

        def make():
            torch.manual_seed(0)
            return M(), (torch.randn(3, 4),)
    """))
    env = {**os.environ, "COLUMNS": "250", "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "predispatch_func.cli", "export", "joint_cli_model:make", *extra],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)


def test_joint_export_with_adamw_prints_the_signature_and_verifies(tmp_path):
    done = _run(tmp_path, "--joint", "--optimizer", "adamw", "--verify", "--save", str(tmp_path / "step.pt2"))
    assert done.returncode == 0, done.stdout + done.stderr
    for word in ("LOSS_OUTPUT", "GRADIENT_TO_PARAMETER", "PARAMETER_MUTATION", "native_layer_norm_backward",
                 "verify: OK"):
        assert word in done.stdout, word
    assert (tmp_path / "step.pt2").exists()


def test_joint_export_lowered_to_core_aten(tmp_path):
    done = _run(tmp_path, "--joint", "--target", "core_aten", "--verify")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "layer_norm.default" not in done.stdout.replace("native_layer_norm", "")


def test_joint_export_refuses_a_flag_it_cannot_honour(tmp_path):
    done = _run(tmp_path, "--joint", "--post-dispatch")
    assert done.returncode == 2 and "--post-dispatch does not apply to --joint" in done.stdout, done.stdout + done.stderr


def test_joint_export_clips_the_gradients_before_the_step(tmp_path):
    done = _run(tmp_path, "--joint", "--optimizer", "sgd", "--clip-grad-norm", "0.01", "--verify")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "verify: OK" in done.stdout and "linalg_vector_norm" in done.stdout


def test_clip_grad_norm_without_an_optimizer_is_refused(tmp_path):
    done = _run(tmp_path, "--joint", "--clip-grad-norm", "1.0")
    assert done.returncode == 2 and "--clip-grad-norm needs --optimizer" in done.stdout, done.stdout + done.stderr
