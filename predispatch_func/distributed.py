"""Programs for torch.distributed's runtime: we export, torch.distributed runs.

We build no distributed runtime of our own. What exports today (docs/distributed.md):

* Pipeline stages: :func:`pipeline` is ``torch.distributed.pipelining.pipeline``
  with our exporter in place of ``torch.export.export``. torch splits our
  program at its ``pipe_split()`` markers (or the ``split_spec``), and
  ``pipe.build_stage(rank, device)`` hands each stage to torch's schedules
  (``ScheduleGPipe``, ``Schedule1F1B``, ...), as with torch's own trace::

      pipe = pf.distributed.pipeline(model, (x.chunk(n_microbatches)[0],))
      stage = pipe.build_stage(rank, torch.device("cpu"))
      ScheduleGPipe(stage, n_microbatches, loss_fn=loss_fn).step(...)

  A stage whose ``forward`` counts micro-batches in a Python attribute (the shape
  of pytorch#188727, where torch's stage replays the first micro-batch's offset for
  every split) is refused here (``PYTHON_STATE_CHANGED``); a counter kept in a
  buffer is carried as a buffer write and each micro-batch sees its own offset.
* DTensor programs: ``pf.export`` of a model whose parameters and inputs are
  DTensors (placed with ``distribute_tensor``) is a program over DTensors: its
  placeholders are DTensors, the lifted parameters in ``ep.state_dict`` keep their
  mesh and placements, and DTensor's dispatch issues the collectives when
  ``ep.module()`` runs on every rank.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from . import _torch_compat as tc
from .export import export


def pipeline(module: torch.nn.Module, mb_args: tuple, mb_kwargs: dict[str, Any] | None = None,
             split_spec: dict[str, Any] | None = None,
             split_policy: Callable[[torch.fx.GraphModule], torch.fx.GraphModule] | None = None) -> Any:
    """``torch.distributed.pipelining.pipeline`` (same arguments, returns its ``Pipe``) with the
    whole model traced by :func:`~predispatch_func.export` on the micro-batch example.

    torch annotates the ``split_spec`` points by replacing submodules' ``forward``; here the
    user's module gets them back afterwards, so exporting leaves it as it was.
    """
    from torch.distributed.pipelining import pipeline as torch_pipeline

    with _forwards_restored(module, split_spec or {}), tc.pipeline_traced_by(export):
        return torch_pipeline(module, mb_args, mb_kwargs, split_spec=split_spec, split_policy=split_policy)


@contextlib.contextmanager
def _forwards_restored(module: torch.nn.Module, split_spec: dict[str, Any]) -> Iterator[None]:
    """Give each split point's submodule back the instance attributes ``forward`` and
    ``_orig_forward`` it had (torch's ``annotate_split_points`` sets both)."""
    missing = object()
    saved = []
    for name in split_spec:
        try:
            sub = module.get_submodule(name)
        except AttributeError:
            continue  # torch's own error names it
        saved.append((sub, {k: sub.__dict__.get(k, missing) for k in ("forward", "_orig_forward")}))
    try:
        yield
    finally:
        for sub, attrs in saved:
            for key, value in attrs.items():
                if value is missing:
                    sub.__dict__.pop(key, None)
                else:
                    sub.__dict__[key] = value
