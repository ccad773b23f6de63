"""Cases from torch's hop_db and from the ExportDB cond_*/map/autograd_function examples,
and the judge both ``tests/hops/test_hop_db.py`` and ``scripts/hop_figures.py`` use."""

from __future__ import annotations

import copy

import torch

import predispatch_func as pf
from predispatch_func.errors import UnsupportedError

EXPORTDB = ("cond_", "map", "autograd_function")


class _Call(torch.nn.Module):
    """``fn(*args, **kwargs)`` with the tensor leaves as the module's inputs."""

    def __init__(self, fn, args: tuple, kwargs: dict):
        super().__init__()
        self.fn = fn
        self.flat, self.spec = torch.utils._pytree.tree_flatten((args, kwargs))
        self.slots = [i for i, v in enumerate(self.flat) if isinstance(v, torch.Tensor)]

    def call(self, *tensors):
        flat = list(self.flat)
        for i, t in zip(self.slots, tensors):
            flat[i] = t
        args, kwargs = torch.utils._pytree.tree_unflatten(flat, self.spec)
        return self.fn(*args, **kwargs)


def _named_call(fn, args: tuple, kwargs: dict) -> _Call:
    """A _Call whose forward names each tensor (torch's unlifting binds them by name)."""
    model = _Call(fn, args, kwargs)
    names = ", ".join(f"t{i}" for i in range(len(model.slots)))
    scope: dict = {}
    exec(f"def forward(self, {names}):\n    return self.call({names})", scope)  # noqa: S102
    return type("Call", (_Call,), {"forward": scope["forward"]})(fn, args, kwargs)


def hop_db_cases(samples: int):
    from torch.testing._internal.hop_db import hop_db

    for op in hop_db:
        key = op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")
        dtypes = op.supported_dtypes("cpu")
        dtype = torch.float32 if torch.float32 in dtypes else torch.float64
        try:
            torch.manual_seed(0)
            found = list(op.sample_inputs("cpu", dtype, requires_grad=False))[:samples]
        except Exception as exc:  # noqa: BLE001
            yield f"hop/{key}", None, None, f"no CPU samples: {type(exc).__name__}"
            continue
        for i, s in enumerate(found):
            args, kwargs = (s.input, *s.args), dict(s.kwargs)
            model = _named_call(op.op, args, kwargs)
            yield f"hop/{key}/{i}", model, tuple(model.flat[j] for j in model.slots), None


def exportdb_cases():
    from torch._export.db.examples import all_examples

    for key, example in all_examples().items():
        if not any(key.startswith(p) or p in key for p in EXPORTDB):
            continue
        model = example.model
        args = copy.deepcopy(tuple(example.example_args))
        yield f"exportdb/{key}", model, args, None


def skip_unless_eager_runs(model, args: tuple, skip: str | None) -> None:
    """Skip a case the database marks, or one eager itself cannot run on CPU."""
    import pytest

    if skip:
        pytest.skip(skip)
    try:
        with torch.no_grad():
            model(*args)
    except RuntimeError as exc:
        pytest.skip(f"eager does not run it on CPU: {exc}")


def judge(model, args) -> tuple[str, str]:
    try:
        with torch.no_grad():
            copy.deepcopy(model)(*copy.deepcopy(args))
    except Exception as exc:  # noqa: BLE001
        return "eager-fails", f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
    try:
        ep = pf.export(model, args)
    except UnsupportedError as exc:
        return "refused", str(exc).splitlines()[0][:160]
    except Exception as exc:  # noqa: BLE001
        return "error", f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    try:
        report = pf.verify(ep, model, args)
    except Exception as exc:  # noqa: BLE001
        return "error", f"verify raised {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    if not report.ok:
        return "wrong", "; ".join(report.problems)[:200]
    return "ok", "gradients" if "gradients" in report.checked else "no gradients (eager has none)"
