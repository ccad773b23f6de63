"""Run one generated program through the exporter and prove it equals eager.

:func:`check_program` is the property: export, check that exporting changed
nothing of the caller's, then ``verify`` (contract + replay of outputs,
written-back inputs, buffers and gradients). Gradients are compared whenever
eager itself can compute them: ``verify`` makes float inputs require grad, and
some valid programs (an in-place write to a tensor autograd saved) make eager's
backward raise; for those the replay compares everything but gradients.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import pkgutil
from collections.abc import Callable, Iterator
from typing import Any

import torch

import predispatch_func as pf

from .program import Program


def _import_every_module_of(package) -> None:
    """Hypothesis draws from literals it finds in newly imported local modules, before each
    input; export imports some of ours lazily, which changed the programs a seed gives
    once the first export ran. Importing them all up front keeps a seed's programs fixed."""
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        importlib.import_module(info.name)


_import_every_module_of(pf)


# Refusals the exporter makes on purpose, for cases torch blocks or the IR cannot hold;
# each has a regression test in the stage folder of tests/ whose behaviour it pins (a strict
# xfail for torch's, e.g. tests/trace/test_writes_through_views.py, test_writes_through_detach.py).
KNOWN_REFUSALS = frozenset({
    pf.Refusal.VIEW_REPLAY_AFTER_STRIDED_WRITE,
    pf.Refusal.GRAD_VALUE_THROUGH_DETACH,
    pf.Refusal.GRAD_VALUE_INTO_INTEGER,
    pf.Refusal.WRITE_THROUGH_AS_STRIDED_OF_VIEW,
    pf.Refusal.VIEW_DTYPE_REBUILD,
    pf.Refusal.DATA_ASSIGN_ALIASED,  # the IR's limits on `.data`: tests/state/test_state.py pins them
    pf.Refusal.DATA_WRITE_AFTER_SAVED_READ,
    pf.Refusal.WRITE_AFTER_UNCHECKED_HOP_READ,  # torch's while_loop/scan backward: tests/hops/test_torch_hops.py
    pf.Refusal.HOP_OPERAND_OF_WHILE_LOOP,  # torch's HOP capture of a while_loop result: tests/hops/test_torch_hops.py
    pf.Refusal.STATE_REPLACED,  # a later call on a buffer's new shape: tests/state/test_state_replaced_by_assignment.py
})


# export_joint's, each pinned by tests/joint/test_joint_errors.py
KNOWN_JOINT_REFUSALS = frozenset({pf.JointProblem.STATE_WRITTEN_WITH_HISTORY, pf.JointProblem.UNSUPPORTED_HOP})


class KnownRefusal(Exception):
    """The exporter refused the program with one of :data:`KNOWN_REFUSALS`, or with any clear
    refusal (an ``UnsupportedError``) of a program ``torch.export.export`` fails on too."""


def eager_backward_runs(program: Program) -> bool:
    """Whether eager's backward works under the inputs ``verify`` builds."""
    model, args = program.build()
    grad_args = tuple(a.detach().clone().requires_grad_(a.is_floating_point()) for a in args)
    try:
        with torch.enable_grad():  # restores the grad mode a forward that raised left off
            outs = model(*grad_args)
    except RuntimeError:
        return True  # verify retries with the caller's inputs, which do not reach backward
    try:  # eager may refuse to even read an output (a no_grad view of a base written later)
        terms = [o.double().sum() for o in outs if isinstance(o, torch.Tensor) and o.requires_grad]
        if terms:
            sum(terms).backward()
    except RuntimeError:
        return False
    return True


def check_program(program: Program) -> torch.export.ExportedProgram:
    """Export ``program`` and replay it against the reference; raise on any difference."""
    model, args = program.build()
    check_grads = eager_backward_runs(program)
    ep = _exported_leaving_the_caller_untouched(lambda: pf.export(model, args), model, args)
    pf.verify(ep, model, args, raise_on_failure=True, check_grads=check_grads)
    return ep


class EagerCannotTrain(Exception):
    """Eager's own training step raises on this program, or its loss carries no gradient:
    nothing for a training program to equal."""


def fuzz_loss(out) -> torch.Tensor:
    """Every floating output counts: the mean of its square, summed (in float64, so the
    loss's own rounding hides nothing)."""
    leaves = [o for o in torch.utils._pytree.tree_leaves(out)
              if isinstance(o, torch.Tensor) and o.is_floating_point()]
    return sum((o.double().pow(2).mean() for o in leaves), torch.zeros((), dtype=torch.float64))


OPTIMIZERS = {"sgd": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
              "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-2)}


def check_joint_program(program: Program, *, calls: int = 2, optimizer: str | None = None) -> torch.export.ExportedProgram:
    """``export_joint`` ``program`` with :func:`fuzz_loss` and replay ``calls`` training steps
    against eager's (loss, every gradient, written buffers and inputs); raise on any difference.
    Float inputs require grad where eager can train so (the program then returns their
    gradients too), else none does. ``optimizer`` (a key of :data:`OPTIMIZERS`): each step also
    updates the model's parameters, compared with eager's (parameters and optimizer state)."""
    model, args = program.build()
    with_grads = tuple(a.detach().clone().requires_grad_(a.is_floating_point()) for a in args)
    problems = []
    for candidate in ((with_grads, args) if any(a.requires_grad for a in with_grads) else (args,)):
        problem = _why_eager_cannot_train(model, candidate, calls)
        if problem is None:
            args = candidate
            break
        problems.append(problem)
    else:
        raise EagerCannotTrain("; ".join(problems))
    reference = copy.deepcopy(model)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = OPTIMIZERS[optimizer](params) if optimizer is not None and params else None
    ep = _exported_leaving_the_caller_untouched(
        lambda: pf.export_joint(model, args, loss_fn=fuzz_loss, optimizer=opt), model, args)
    with _known_refusals_named():  # the program may refuse a later step (a buffer's new shape)
        report = pf.verify_joint(ep, reference, args, loss_fn=fuzz_loss, optimizer=opt, calls=calls)
    if not report.ok:
        if optimizer is not None and _equal_in_float64(program, args, calls, optimizer):
            raise DiffersByRounding("; ".join(report.problems[:2]))
        raise pf.VerificationError(str(report))
    return ep


class DiffersByRounding(Exception):
    """A training step with an optimizer differs from eager's in float32 and equals it in float64
    (1e-9). Our SGD/Adam updates take the learning rate as a tensor input, ``p - g * lr``: two
    roundings where eager's ``p.add_(g, alpha=-lr)`` fuses one (a quarter of the elements differ
    by an ulp a step); a program whose values grow fast amplifies that past the tolerance."""


def _equal_in_float64(program: Program, args: tuple, calls: int, optimizer: str) -> bool:
    model, _ = program.build()
    model = model.double()
    wide = tuple(a.double() if a.is_floating_point() else a for a in args)
    wide = tuple(w.detach().requires_grad_(a.requires_grad) if a.is_floating_point() else w for w, a in zip(wide, args))
    reference = copy.deepcopy(model)
    opt = OPTIMIZERS[optimizer]([p for p in model.parameters() if p.requires_grad])
    try:
        ep = pf.export_joint(model, wide, loss_fn=fuzz_loss, optimizer=opt)
        return pf.verify_joint(ep, reference, wide, loss_fn=fuzz_loss, optimizer=opt, calls=calls,
                               rtol=1e-9, atol=1e-9).ok
    except Exception:  # noqa: BLE001 (no float64 verdict: the float32 failure stands)
        return False


@contextlib.contextmanager
def _known_refusals_named() -> Iterator[None]:
    """A deliberate refusal (one of the known kinds) becomes :class:`KnownRefusal`."""
    try:
        yield
    except (pf.UnsupportedError, pf.JointError) as exc:
        if exc.kind in KNOWN_REFUSALS or exc.kind in KNOWN_JOINT_REFUSALS:
            raise KnownRefusal(f"{exc.kind.name}: {str(exc).splitlines()[0]}") from exc
        raise


def _exported_leaving_the_caller_untouched(export: Callable[[], Any], model: torch.nn.Module, args: tuple) -> Any:
    """``export()``, checked to leave the caller's inputs and state as they were."""
    args_before = copy.deepcopy(args)
    state_before = {k: v.detach().clone() for k, v in model.state_dict(keep_vars=True).items()}
    untouched = copy.deepcopy(model)
    with _known_refusals_named():
        try:
            ep = export()
        except pf.UnsupportedError as exc:  # a clear refusal where torch.export fails too is no failure
            if exc.kind in KNOWN_REFUSALS or not _torch_export_fails(untouched, args_before):
                raise
            raise KnownRefusal(f"{exc.kind.name}, torch.export fails too: {str(exc).splitlines()[0]}") from exc
    for i, (a, b) in enumerate(zip(args_before, args)):
        assert torch.equal(a, b), f"exporting changed input {i}"
    for k, v in model.state_dict(keep_vars=True).items():
        assert torch.equal(state_before[k], v), f"exporting changed {k}"
    return ep


def _torch_export_fails(model: torch.nn.Module, args: tuple) -> bool:
    try:
        torch.export.export(model, copy.deepcopy(args))
    except Exception:  # noqa: BLE001 (whatever torch raises: the program is beyond it too)
        return True
    return False


def _why_eager_cannot_train(model: torch.nn.Module, args: tuple, calls: int) -> str | None:
    """Eager's own steps on copies, as many as the replay takes (a step may change what the
    next one meets): why they fail, or None."""
    trial = copy.deepcopy(model)
    try:
        for _ in range(calls):
            with torch.enable_grad():
                loss = fuzz_loss(trial(*(a.detach().clone().requires_grad_(a.requires_grad) for a in args)))
                if not loss.requires_grad:
                    return "the loss requires no grad"
                loss.backward()
    except Exception as exc:  # eager's own error, whatever its type (IndexError on a buffer's new shape)
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return None
