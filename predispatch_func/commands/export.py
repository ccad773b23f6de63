"""``predispatch-func export MODULE:FACTORY``: export a user's model and print the program."""

from __future__ import annotations

import argparse
import copy
from typing import Any

import torch
from rich.console import Console

from ..export import export
from ..render import render_program, render_report
from ..verify import verify
from .user_code import FACTORY_HELP, load_factory, load_target


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("export", help="export MODULE:FACTORY and print the program")
    p.add_argument("factory", help=FACTORY_HELP)
    p.add_argument("--save", metavar="PATH", help="write the program with torch.export.save")
    p.add_argument("--verify", action="store_true", help="replay against the reference")
    p.add_argument("--joint", action="store_true",
                   help="export one training step (forward, loss, backward): the model returns the loss first")
    p.add_argument("--optimizer", choices=("sgd", "adamw"),
                   help="with --joint: the optimizer step in the program (SGD momentum 0.9, or AdamW)")
    p.add_argument("--lr", type=float, default=1e-3, help="with --optimizer: the learning rate (an input later)")
    p.add_argument("--clip-grad-norm", type=float, metavar="MAX_NORM",
                   help="with --optimizer: clip the gradients to this total norm before the step (clip_grad_norm_)")
    p.add_argument("--target", metavar="FILE|core_aten", help="lower every op into this op set")
    add_post_dispatch_flag(p)
    p.set_defaults(run=run)


def add_post_dispatch_flag(parser: argparse.ArgumentParser) -> None:
    """The one choice of how to export that ``demo``, ``export`` and ``verify`` share."""
    parser.add_argument("--post-dispatch", action="store_true",
                        help="export one level lower (after autograd, plain ATen)")


def run(ns: argparse.Namespace, console: Console) -> int:
    model, args, kwargs = load_factory(ns.factory)
    if getattr(ns, "joint", False):
        if ns.post_dispatch:  # a joint program is pre-dispatch: its regions and kept composites are the point
            console.print("--post-dispatch does not apply to --joint (a training step is exported pre-dispatch)")
            return 2
        return export_joint_and_show(model, args, kwargs, ns, console)
    if getattr(ns, "optimizer", None):
        console.print("--optimizer needs --joint")
        return 2
    if getattr(ns, "clip_grad_norm", None) is not None:
        console.print("--clip-grad-norm needs --joint and --optimizer")
        return 2
    return export_and_show(model, args, kwargs, ns, console)


def export_joint_and_show(model: torch.nn.Module, args: tuple, kwargs: dict, ns: argparse.Namespace,
                          console: Console) -> int:
    """``--joint``: the training step's program (docs/joint.md), printed, saved and verified over 3 steps."""
    from ..joint import export_joint, verify_joint

    reference = copy.deepcopy(model)
    optimizer: torch.optim.Optimizer | None = None
    if ns.optimizer == "sgd":
        optimizer = torch.optim.SGD(model.parameters(), lr=ns.lr, momentum=0.9)
    elif ns.optimizer == "adamw":
        optimizer = torch.optim.AdamW(model.parameters(), lr=ns.lr)
    target = load_target(getattr(ns, "target", None))
    clip = getattr(ns, "clip_grad_norm", None)
    if clip is not None and optimizer is None:
        console.print("--clip-grad-norm needs --optimizer (it clips the gradients before the step)")
        return 2
    ep = export_joint(model, args, kwargs, optimizer=optimizer, target=target, clip_grad_norm=clip)
    render_program(ep, console)
    if getattr(ns, "save", None):
        torch.export.save(ep, ns.save)
        console.print(f"saved to {ns.save}")
    if getattr(ns, "verify", False):
        report = verify_joint(ep, reference, args, kwargs, optimizer=optimizer, calls=3, target=target)
        render_report(report, console)
        return 0 if report.ok else 1
    return 0


def export_and_show(model: torch.nn.Module, args: tuple, kwargs: dict, ns: argparse.Namespace,
                    console: Console) -> int:
    """Export, print the program, then save and verify as ``ns`` asks; the exit status."""
    target = load_target(getattr(ns, "target", None))
    ep = export(model, args, kwargs, pre_dispatch=not ns.post_dispatch, target=target)
    render_program(ep, console)
    if getattr(ns, "save", None):
        torch.export.save(ep, ns.save)
        console.print(f"saved to {ns.save}")
    if getattr(ns, "verify", True):
        report = verify(ep, model, args, kwargs, target=target)
        render_report(report, console)
        return 0 if report.ok else 1
    return 0
