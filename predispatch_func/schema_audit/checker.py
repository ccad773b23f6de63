"""Run an overload on real CPU samples and hold each run against its schema.

A run can contradict the schema in two ways:

* a result shares storage with an input (or *is* the input) although the
  schema gives them no common alias set: the composite *lies about aliasing*;
* an input's version counter, values or metadata change although the schema
  does not mark it written (``Tensor(a!)``): it *lies about mutation*.

A result declared ``Tensor(a)`` that is fresh on some samples and an alias on
others is ``maybe_alias`` (``reshape``, ``contiguous``, ``to``): honest, but
only functionalization can tell which one a given call returns.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .. import _torch_compat as tc
from .samples import Sample
from .verdicts import HONEST, LIES_ALIAS, LIES_MUTATION, MAYBE_ALIAS, UNTESTED


@dataclasses.dataclass
class CheckResult:
    """What the samples showed about one overload."""

    op: str
    verdict: str
    evidence: str
    runs: int = 0
    alias_findings: list[str] = dataclasses.field(default_factory=list)
    mutation_findings: list[str] = dataclasses.field(default_factory=list)
    errors: list[str] = dataclasses.field(default_factory=list)
    crashes: list[str] = dataclasses.field(default_factory=list)  # samples that killed torch
    # sparse layouts the op accepts (layouts.py) that no sample ran on: untested for them
    untested_layouts: list[str] = dataclasses.field(default_factory=list)
    # the layouts (``strided`` or a sparse one, of the first tensor) of the samples that lied
    lying_layouts: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class _Input:
    """One tensor handed to the op, with the schema argument it was passed as."""

    label: str  # "self", "tensors[0]", ...
    tensor: torch.Tensor
    alias_info: Any  # torch._C._AliasInfo or None


def _declared_alias(ret_info: Any, arg_info: Any) -> bool:
    if ret_info is None or arg_info is None:
        return False
    ret_sets = set(ret_info.before_set) | set(ret_info.after_set)
    arg_sets = set(arg_info.before_set) | set(arg_info.after_set)
    if not ret_sets or not arg_sets or "*" in ret_sets or "*" in arg_sets:
        return True
    return bool(ret_sets & arg_sets)


def _storage_ptrs(t: torch.Tensor) -> set[int]:
    """Data pointers of the storages holding ``t``'s data (a sparse tensor's
    indices and values too: ``to_sparse_csr`` of a CSR tensor returns it)."""
    ptrs = set()
    for part in tc.sparse_components(t):
        try:
            storage = part.untyped_storage()
        except (RuntimeError, NotImplementedError, TypeError):
            continue  # nested, quantized...: no plain storage to compare
        if storage.nbytes() > 0:
            ptrs.add(storage.data_ptr())
    return ptrs


def _aliases(out: torch.Tensor, inp: torch.Tensor) -> bool:
    return out is inp or bool(_storage_ptrs(out) & _storage_ptrs(inp))


def _bits(t: torch.Tensor) -> list[torch.Tensor] | None:
    parts = tc.sparse_components(t)
    if not parts or t.is_quantized or t.dtype in (torch.bits8,):
        return None
    flats = [p.detach().reshape(-1).contiguous() for p in parts]
    return [f.view(torch.uint8) if f.numel() else f for f in flats]


class _Snapshot:
    """An input's version, metadata and bits before the call."""

    __slots__ = ("version", "meta", "bits")

    def __init__(self, t: torch.Tensor):
        self.version = tc.version_of(t)
        self.meta = _meta(t)
        bits = _bits(t)
        self.bits = [b.clone() for b in bits] if bits is not None else None

    def changes(self, t: torch.Tensor) -> list[str]:
        found = []
        if tc.version_of(t) != self.version:
            found.append(f"version {self.version}->{tc.version_of(t)}")
        if _meta(t) != self.meta:
            found.append("shape/stride changed")
        elif self.bits is not None:
            now = _bits(t)
            if now is not None and (len(now) != len(self.bits)
                                    or any(not torch.equal(a, b) for a, b in zip(now, self.bits))):
                found.append("values changed")
        return found


def _meta(t: torch.Tensor) -> tuple:
    try:
        return (tuple(t.shape), tuple(t.stride()), t.storage_offset(), t.dtype, t.layout)
    except RuntimeError:
        return (tuple(t.shape), t.dtype, t.layout)


def _inputs_of(schema: Any, args: tuple, kwargs: dict) -> list[_Input]:
    by_name = {a.name: a for a in schema.arguments}
    pairs = list(zip(schema.arguments, args)) + [(by_name[k], v) for k, v in kwargs.items() if k in by_name]
    found: list[_Input] = []
    for arg, value in pairs:
        if isinstance(value, torch.Tensor):
            found.append(_Input(arg.name, value, arg.alias_info))
        elif isinstance(value, (list, tuple)):
            found += [_Input(f"{arg.name}[{i}]", v, arg.alias_info)
                      for i, v in enumerate(value) if isinstance(v, torch.Tensor)]
    return found


def _outputs_of(schema: Any, result: Any) -> list[tuple[str, torch.Tensor, Any]]:
    """(label, tensor, the return's alias info) for every tensor the op returned."""
    returns = schema.returns
    if len(returns) == 1:
        per_return = [result]
    elif isinstance(result, (tuple, list)):
        per_return = list(result)
    else:
        per_return = [result]
    found = []
    for i, (ret, value) in enumerate(zip(returns, per_return)):
        label = "result" if len(returns) == 1 else f"result {i}"
        if isinstance(value, torch.Tensor):
            found.append((label, value, ret.alias_info))
        elif isinstance(value, (list, tuple)):
            found += [(f"{label}[{j}]", v, ret.alias_info) for j, v in enumerate(value)
                      if isinstance(v, torch.Tensor)]
    return found


@dataclasses.dataclass
class _Run:
    alias_lies: list[str]
    mutation_lies: list[str]
    declared_alias_outcomes: dict[str, bool]  # output label -> aliased?


def run_sample(op: tc.OpOverload, sample: Sample) -> _Run:
    """Call ``op`` once on fresh copies of ``sample``; raises what the op raises."""
    schema = tc.schema_of(op)
    args, kwargs = sample.materialize()
    inputs = _inputs_of(schema, args, kwargs)
    before = [_Snapshot(i.tensor) for i in inputs]
    result = op(*args, **kwargs)
    run = _Run([], [], {})
    for label, out, ret_info in _outputs_of(schema, result):
        hits = [i for i in inputs if _aliases(out, i.tensor)]
        lies = [i for i in hits if not _declared_alias(ret_info, i.alias_info)]
        if lies:
            how = "is" if any(out is i.tensor for i in lies) else "shares storage with"
            run.alias_lies.append(f"{label} {how} input {lies[0].label}")
        elif ret_info is not None:
            run.declared_alias_outcomes[label] = bool(hits)
    for inp, snap in zip(inputs, before):
        if inp.alias_info is not None and inp.alias_info.is_write:
            continue
        changed = snap.changes(inp.tensor)
        if changed:
            run.mutation_lies.append(f"input {inp.label} written ({', '.join(changed)})")
    return run


def check(op: tc.OpOverload, samples: list[Sample], no_sample_reasons: Sequence[str] = (), *,
          skip: dict[int, str] | None = None,
          on_sample: Callable[[int, Sample], None] | None = None) -> CheckResult:
    """Run every sample, then give the overload one verdict with its evidence.

    ``skip``: sample indices not to run (they crashed torch before), with why;
    ``on_sample`` is told each sample before it runs (the runner's crash log).
    """
    skip = skip or {}
    name = str(op)
    result = CheckResult(name, UNTESTED, "")
    outcomes: dict[str, set[bool]] = {}
    examples: dict[bool, str] = {}
    ran_on: set[str] = set()
    lied_on: set[str] = set()
    result.crashes = sorted(skip.values())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for index, sample in enumerate(samples):
            if index in skip:
                continue
            if on_sample is not None:
                on_sample(index, sample)
            try:
                run = run_sample(op, sample)
            except Exception as exc:  # an op refusing a sample is expected
                result.errors.append(f"{type(exc).__name__}: {_first_line(exc)}")
                continue
            result.runs += 1
            ran_on.add(sample.layout)
            where = sample.describe("on ")
            result.alias_findings += [f"{x} {where}" for x in run.alias_lies]
            result.mutation_findings += [f"{x} {where}" for x in run.mutation_lies]
            if run.alias_lies or run.mutation_lies:
                lied_on.add(sample.layout)
            for label, aliased in run.declared_alias_outcomes.items():
                outcomes.setdefault(label, set()).add(aliased)
                examples.setdefault(aliased, where)
    result.verdict, result.evidence = _verdict(result, outcomes, examples, list(no_sample_reasons))
    from .layouts import SPARSE_LAYOUTS, accepted_layouts

    result.untested_layouts = [name for name in accepted_layouts(op) if name not in ran_on]
    result.lying_layouts = [name for name in ("strided", *SPARSE_LAYOUTS) if name in lied_on]
    return result


def _verdict(result: CheckResult, outcomes: dict[str, set[bool]], examples: dict[bool, str],
             no_sample_reasons: list[str]) -> tuple[str, str]:
    if result.alias_findings:
        extra = f" (and {result.mutation_findings[0]})" if result.mutation_findings else ""
        return LIES_ALIAS, result.alias_findings[0] + extra
    if result.mutation_findings:
        return LIES_MUTATION, result.mutation_findings[0]
    if result.runs == 0:
        why = result.crashes + sorted(set(result.errors)) or no_sample_reasons or ["no sample inputs"]
        return UNTESTED, "; ".join(why[:2])
    if any(len(seen) == 2 for seen in outcomes.values()):
        return MAYBE_ALIAS, f"alias {examples[True]}; fresh {examples[False]}"
    crashed = f"; {len(result.crashes)} samples crashed torch" if result.crashes else ""
    return HONEST, f"{result.runs} runs agreed with the schema{crashed}"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else "")[:160]
