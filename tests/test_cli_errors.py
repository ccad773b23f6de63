"""The command line prints an export error as its kind, message, the model's line and a hint,
with exit status 1 and no traceback; ``--debug`` (before or after the command) or
``PREDISPATCH_FUNC_DEBUG=1`` lets the exception through."""

import os
import subprocess
import sys
import textwrap

import pytest

import predispatch_func as pf
from predispatch_func import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

USER_MODULE = '''
import torch


class Cache:
    def __init__(self, t):
        self.t = t


class ReturnsCache(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x):
        return self.lin(x), Cache(x)


class GradInForward(torch.nn.Module):
    def forward(self, x):
        x = x.detach().requires_grad_()
        (g,) = torch.autograd.grad(x.sin().sum(), x)
        return g


class Raises(torch.nn.Module):
    def forward(self, x):
        raise ValueError("boom")


class Two(torch.nn.Module):
    def forward(self, x, y):
        return x + y


def cache():
    return ReturnsCache(), (torch.randn(2, 3),)


def grad():
    return GradInForward(), (torch.randn(2, 3),)


def raises():
    return Raises(), (torch.randn(2, 3),)


def one_of_two():
    return Two(), (torch.randn(2, 3),)


class Zeta(torch.nn.Module):
    def forward(self, x):
        return torch.special.zeta(x.abs() + 2, 2.0)


def zeta():
    return Zeta(), (torch.randn(2, 3),)


def zeta_by_hand(x, q):
    return sum((torch.as_tensor(k, dtype=x.dtype) + q) ** -x for k in range(50))  # a few terms: only the lowering is checked
'''

DEBUG = "  (the traceback: run again with --debug, or PREDISPATCH_FUNC_DEBUG=1)\n"


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """A module in the working directory, as a user's would be; a fresh name per test."""
    name = f"cli_user_{os.path.basename(tmp_path)}".replace("-", "_")
    (tmp_path / f"{name}.py").write_text(USER_MODULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
    return name, str(tmp_path / f"{name}.py")


def _lineno(code: str) -> int:
    return next(i for i, line in enumerate(USER_MODULE.splitlines(), 1) if code in line)


def test_an_output_pytree_does_not_know_is_printed_without_a_traceback(user_module, capsys):
    name, path = user_module
    assert cli.main(["ops", f"{name}:cache"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        f"error: UnsupportedError (OUTPUT_NOT_A_PYTREE): ReturnsCache.forward returned a {name}.Cache at "
        "output[1], a type pytree does not know, so no program can return it (torch.export refuses it too). "
        "Register it as a pytree node before exporting: torch.utils._pytree.register_pytree_node(Cache, "
        "flatten_fn, unflatten_fn) (torch.export.register_dataclass for a dataclass); or return only its tensors\n"
        f"  at: {path}:{_lineno('def forward(self, x):')} in ReturnsCache.forward\n"
        "  hint: a known limit (OUTPUT_NOT_A_PYTREE: an output of a type pytree does not know (not a registered "
        "pytree node)); the message says what to write instead, and docs/limits.md lists every limit\n" + DEBUG)


def test_autograd_grad_in_forward_prints_the_op_and_the_users_line(user_module, capsys):
    name, path = user_module
    assert cli.main(["export", f"{name}:grad"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: UnsupportedError (AUTOGRAD_CALL_IN_FORWARD): torch.autograd.grad is called "
                          "inside forward: "), err
    assert ("\n  op: torch.autograd.grad\n"
            f"  at: {path}:{_lineno('torch.autograd.grad(')} in forward\n"
            "      (g,) = torch.autograd.grad(x.sin().sum(), x)\n"
            "  hint: a known limit (AUTOGRAD_CALL_IN_FORWARD: ") in err, err
    assert err.endswith(DEBUG) and "Traceback" not in err


def test_a_failure_that_is_no_known_limit_asks_for_a_report(user_module, capsys):
    name, path = user_module
    assert cli.main(["verify", f"{name}:raises"]) == 1
    assert capsys.readouterr().err == (
        "error: ExportError(ValueError): tracing failed: ValueError: boom\n"
        f"  at: {path}:{_lineno('boom')} in forward\n"
        '      raise ValueError("boom")\n'
        "  hint: this is not a known limit: if torch.export.export runs the model, it is a bug of "
        "predispatch_func; please report it with the traceback\n" + DEBUG)


def test_a_call_that_does_not_fit_the_model_says_so(user_module, capsys):
    name, _ = user_module
    assert cli.main(["export", f"{name}:one_of_two"]) == 1
    assert capsys.readouterr().err == (
        "error: InputError: the arguments do not match Two.forward(x, y): missing a required argument: 'y' "
        "(given 1 positional, keywords [])\n"
        "  hint: the model and inputs given to export do not fit: change the call as the message says\n" + DEBUG)


def test_export_lowers_into_its_target_or_names_what_it_cannot(user_module, capsys, tmp_path):
    """``export --target`` (it was ignored without ``--joint``); a target file's decomposition line
    imports from the working directory; a line that cannot is named, without a traceback."""
    name, path = user_module
    assert cli.main(["export", f"{name}:zeta", "--target", "core_aten"]) == 1
    err = capsys.readouterr().err
    assert "aten.special_zeta.other_scalar" in err and "with_decompositions" in err and "Traceback" not in err
    target = tmp_path / "backend.txt"
    target.write_text(f"@core_aten\naten::special_zeta.other_scalar = {name}:zeta_by_hand\n")
    assert cli.main(["ops", f"{name}:zeta", "--target", str(target)]) == 0
    target.write_text(f"@core_aten\naten::special_zeta.other_scalar = {name}:no_such_function\n")
    with pytest.raises(SystemExit, match=r"backend.txt:2: cannot import the decomposition .*no_such_function"):
        cli.main(["export", f"{name}:zeta", "--target", str(target)])


@pytest.mark.parametrize("argv", [["--debug", "ops", "{}:cache"], ["ops", "{}:cache", "--debug"]],
                         ids=["before_the_command", "after_it"])
def test_debug_lets_the_exception_through(user_module, argv):
    name, _ = user_module
    with pytest.raises(pf.UnsupportedError, match="returned a .*Cache at output"):
        cli.main([a.format(name) for a in argv])


def test_the_environment_variable_lets_the_exception_through(user_module, monkeypatch):
    name, _ = user_module
    monkeypatch.setenv(cli.DEBUG_ENV, "1")
    with pytest.raises(pf.UnsupportedError, match="returned a .*Cache at output"):
        cli.main(["ops", f"{name}:cache"])


def test_the_console_script_exits_with_1_and_no_traceback(tmp_path):
    (tmp_path / "user_model.py").write_text(textwrap.dedent(USER_MODULE))
    env = {k: v for k, v in os.environ.items() if k != cli.DEBUG_ENV}
    env["PYTHONPATH"] = os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-m", "predispatch_func.cli", "ops", "user_model:cache"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1
    assert "error: UnsupportedError (OUTPUT_NOT_A_PYTREE): ReturnsCache.forward returned" in done.stderr
    assert "Traceback" not in done.stderr + done.stdout, done.stderr
