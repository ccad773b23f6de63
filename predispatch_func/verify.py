"""The verifier: contract checks on every graph, and replay against the reference.

The reference is the user's model run by eager PyTorch, the judge of every program
(not ``pf.eager``, which runs programs' ops on an op set).

``check_contract`` reads the program only (design.md points 2 and 3).
``verify`` adds point 6 when given the model and inputs: the program and the
model run on fresh clones of the same inputs, under the same RNG seed, and
outputs, written-back inputs, buffers and gradients are compared; and the
graph itself runs once more to show it writes none of its inputs (a write its
op's schema hides, which the schema check cannot see).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch.export.graph_signature import InputKind, OutputKind

from . import _torch_compat as tc
from . import output_aliasing
from .artifacts import program_facts
from .autograd_facts import may_carry_grad
from .errors import VerificationError
from .frame_stack import on_a_reserved_frame_stack
from .graphs import all_graph_modules
from .hidden_writes import inputs_the_graph_writes
from .state.caller_tripwire import CallersTensorsTripwire, callers_tensors
from .state.history_free_copy import rebind_closures

_FORBIDDEN_CALLS = (tc.SET_GRAD_ENABLED, tc.ENTER_AUTOCAST, tc.EXIT_AUTOCAST)


@dataclasses.dataclass
class VerifyReport:
    problems: list[str] = dataclasses.field(default_factory=list)
    checked: list[str] = dataclasses.field(default_factory=list)
    rounding: Any = None  # verify_joint(judge_float64=True): a joint.rounding.RoundingJudgement of the differences

    @property
    def ok(self) -> bool:
        return not self.problems

    def __str__(self) -> str:
        head = "OK" if self.ok else f"{len(self.problems)} problem(s)"
        lines = [f"verify: {head}; checked {', '.join(self.checked)}"]
        lines += [f"  - {p}" for p in self.problems]
        if self.rounding is not None:
            lines.append(f"  judged against float64: {self.rounding}")
        return "\n".join(lines)


# --- contract ---------------------------------------------------------------------


def mutable_target_reason(target: Any) -> str | None:
    """Why ``target`` is not allowed in the IR, or None."""
    if target in _FORBIDDEN_CALLS:
        return "grad-mode/autocast side effect"
    if isinstance(target, tc.OpOverload):
        if tc.schema_of(target).is_mutable:
            return "mutable schema (in-place, out= or copy_)"
        if torch.Tag.inplace_view in target.tags:
            return "in-place view"
    return None


def check_contract(ep: torch.export.ExportedProgram) -> VerifyReport:
    report = VerifyReport(checked=["contract"])
    for where, gm in all_graph_modules(ep.graph_module):
        for node in gm.graph.nodes:
            if node.op == "call_function" and (why := mutable_target_reason(node.target)):
                report.problems.append(f"{where}: node {node.format_node()} is not functional: {why}")
    _check_signature(ep, report)
    return report


def _check_signature(ep: torch.export.ExportedProgram, report: VerifyReport) -> None:
    sig = ep.graph_signature
    graph = ep.graph_module.graph
    placeholders = [n.name for n in graph.nodes if n.op == "placeholder"]
    if placeholders != [s.arg.name for s in sig.input_specs]:
        report.problems.append(f"placeholders {placeholders} do not match input specs")
    outputs = list(next(n for n in reversed(graph.nodes) if n.op == "output").args[0])
    if len(outputs) != len(sig.output_specs):
        report.problems.append(f"{len(outputs)} graph outputs but {len(sig.output_specs)} output specs")
    for out, spec in zip(outputs, sig.output_specs):
        name = out.name if isinstance(out, torch.fx.Node) else ""
        if getattr(spec.arg, "name", "") not in ("", name):
            report.problems.append(f"output spec {spec.arg} does not name graph output {name}")
    inputs_by_kind = {kind: {s.target if s.target else s.arg.name for s in sig.input_specs if s.kind == kind}
                      for kind in InputKind}
    wanted = {OutputKind.BUFFER_MUTATION: InputKind.BUFFER,
              OutputKind.PARAMETER_MUTATION: InputKind.PARAMETER,
              OutputKind.USER_INPUT_MUTATION: InputKind.USER_INPUT}
    for spec in sig.output_specs:
        if spec.kind in wanted and spec.target not in inputs_by_kind[wanted[spec.kind]]:
            report.problems.append(f"{spec.kind.name} targets unknown input {spec.target!r}")


# --- replay against the reference ------------------------------------------------


def _clone(value: Any, grad_for_floats: bool, leaf_of: dict | None = None,
           as_given: frozenset[int] = frozenset(), *, nonleaf: bool = False) -> Any:
    """Fresh copies of every tensor leaf; a tensor passed twice stays one tensor,
    so the replay sees the same aliasing between inputs as the caller's call.
    Float leaves require grad if asked (an in-place write to such a leaf is
    allowed where eager allows it: under no_grad or through ``detach()``).
    A tensor that requires grad is a leaf's ``clone()`` where the caller's is not
    a leaf (an activation from an upstream layer, which eager lets a model write
    in place), or everywhere with ``nonleaf``; its gradient reaches the leaf
    ``leaf_of`` records. A cached ``.grad`` is not copied: each side starts from none.
    ``as_given``: positions among the flat leaves that keep the caller's requires_grad
    (inputs the program must not be called with requiring grad)."""
    memo: dict[int, torch.Tensor] = {}
    leaves, spec = tc.pytree.tree_flatten(value)
    memo.update(_views_of_one_clone(leaves, grad_for_floats, leaf_of, as_given))

    def one(t: torch.Tensor, position: int) -> torch.Tensor:
        if id(t) not in memo:
            c = t.detach().clone()
            wants = t.requires_grad or (grad_for_floats and may_carry_grad(t) and position not in as_given)
            c.requires_grad_(wants)
            if leaf_of is not None and wants and (nonleaf or not t.is_leaf):
                leaf, c = c, c.clone()
                leaf_of[id(c)] = (c, leaf)
            memo[id(t)] = c
        return memo[id(t)]
    return tc.pytree.tree_unflatten([one(t, i) if isinstance(t, torch.Tensor) else t for i, t in enumerate(leaves)],
                                    spec)


def _views_of_one_clone(leaves: list[Any], grad_for_floats: bool, leaf_of: dict | None,
                        as_given: frozenset[int]) -> dict[int, torch.Tensor]:
    """Distinct tensors over one storage (``x`` and ``x[2:]``), copied as views of one copy of
    that memory, so the replay sees the caller's aliasing; where one requires grad, the copy is
    a leaf's ``clone()`` and each view's gradient reaches that leaf (``leaf_of``)."""
    by_storage: dict[Any, list[tuple[int, torch.Tensor]]] = {}
    for i, t in enumerate(leaves):
        if (isinstance(t, torch.Tensor) and type(t) in (torch.Tensor, torch.nn.Parameter)
                and t.layout == torch.strided and t.device.type != "meta"):
            by_storage.setdefault(tc.StorageWeakRef(t.untyped_storage()), []).append((i, t))
    memo: dict[int, torch.Tensor] = {}
    for members in by_storage.values():
        distinct = list({id(t): (i, t) for i, t in members}.values())
        if len(distinct) < 2 or len({t.dtype for _, t in distinct}) > 1:
            continue
        lowest = min(t.storage_offset() for _, t in distinct)
        span = max(t.storage_offset() + sum((n - 1) * st for n, st in zip(t.shape, t.stride())) + 1
                   for _, t in distinct if t.numel()) - lowest if any(t.numel() for _, t in distinct) else 0
        first = distinct[0][1]
        leaf = first.detach().as_strided((span,), (1,), lowest).clone()
        wants = any(t.requires_grad or (grad_for_floats and may_carry_grad(t) and i not in as_given)
                    for i, t in distinct)
        base = leaf.requires_grad_().clone() if wants else leaf
        for _, t in distinct:
            view = base.as_strided(t.shape, t.stride(), t.storage_offset() - lowest)
            if wants and leaf_of is not None:
                leaf_of[id(view)] = (view, leaf)
            memo[id(t)] = view
    return memo


def _grad_leaf(t: torch.Tensor, leaf_of: dict) -> torch.Tensor:
    entry = leaf_of.get(id(t))
    return entry[1] if entry is not None and entry[0] is t else t


def _run(module: torch.nn.Module, args: tuple, kwargs: dict, seed: int,
         modes: Any = None) -> tuple[Any, bool]:
    """Outputs and the grad mode the call left behind (restored afterwards); ``modes``:
    the caller's modes the program was exported under, around the eager call."""
    torch.manual_seed(seed)
    with torch.enable_grad():
        with modes.for_reference() if modes is not None else contextlib.nullcontext():
            out = module(*args, **kwargs)
        return out, torch.is_grad_enabled()


def _compare(what: str, a: Any, b: Any, rtol: float, atol: float, values: bool, problems: list[str]) -> None:
    fa, sa = tc.pytree.tree_flatten(a)
    fb, sb = tc.pytree.tree_flatten(b)
    if sa != sb:
        problems.append(f"{what}: structure differs: eager {sa} vs program {sb}")
        return
    for i, (x, y) in enumerate(zip(fa, fb)):
        label = f"{what}[{i}]" if len(fa) > 1 else what
        if isinstance(x, torch.Tensor) != isinstance(y, torch.Tensor):
            problems.append(f"{label}: eager {type(x).__name__} vs program {type(y).__name__}")
        elif not isinstance(x, torch.Tensor):
            if values and _differs(x, y):
                problems.append(f"{label}: eager {x!r} vs program {y!r}")
        elif x.shape != y.shape or x.dtype != y.dtype or x.layout != y.layout:
            problems.append(f"{label}: eager {x.dtype}{list(x.shape)} {x.layout} vs program "
                            f"{y.dtype}{list(y.shape)} {y.layout}")
        elif x.layout != torch.strided:  # sparse kernels compare (allclose) only dense tensors
            _compare(label, x.detach().to_dense(), y.detach().to_dense(), rtol, atol, values, problems)
        elif values and not torch.allclose(x.detach(), y.detach(), rtol=rtol, atol=atol, equal_nan=True):
            wide = torch.complex128 if x.is_complex() else torch.float64
            diff = (x.detach().to(wide) - y.detach().to(wide)).abs().nan_to_num().max().item()
            problems.append(f"{label}: values differ (max abs diff {diff:.3g})")


def _differs(x: Any, y: Any) -> bool:
    """``x != y`` for two non-tensor outputs; one whose ``!=`` gives no truth value (an array,
    an object of tensors) is the same only if it is the same object."""
    try:
        return bool(x != y)
    except Exception:
        return x is not y


def _compare_requires_grad(e_out: Any, p_out: Any, problems: list[str], checked: list[str]) -> None:
    """Each output requires grad exactly when eager's does: a training loop reads it. Except
    an output eager forbids autograd through: a view made under no_grad whose base was then
    written in place (reading its ``grad_fn`` raises; its ``requires_grad`` says True, and any
    backward through it raises), found by the fuzz run: nothing there for a program to match."""
    e_flat, p_flat = tc.pytree.tree_leaves(e_out), tc.pytree.tree_leaves(p_out)
    for i, (x, y) in enumerate(zip(e_flat, p_flat)):
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.requires_grad != y.requires_grad:
            label = f"output[{i}]" if len(e_flat) > 1 else "output"
            if _autograd_forbidden(x):
                checked.append(f"{label}: requires_grad not compared (eager forbids autograd through it: a "
                               "view made under no_grad whose base was written in place)")
                continue
            problems.append(f"{label}: requires_grad is {x.requires_grad} in eager, "
                            f"{y.requires_grad} in program")


def _autograd_forbidden(t: torch.Tensor) -> bool:
    try:
        t.grad_fn  # noqa: B018 (reading it is the check)
    except RuntimeError as exc:
        return "view was created in no_grad mode" in str(exc)
    return False


def _loss(outputs: Any, weights_seed: int) -> torch.Tensor | None:
    """A random weighting of every float or complex output (a complex one through its
    real and imaginary parts, ``view_as_real``: a real loss, as a training loop's is);
    each output position gets its own weights whether or not it requires grad, so the
    two sides weight alike."""
    gen = torch.Generator().manual_seed(weights_seed)
    terms = []
    for t in tc.pytree.tree_leaves(outputs):
        if isinstance(t, torch.Tensor) and (t.is_floating_point() or (t.is_complex() and t.layout == torch.strided)):
            real = torch.view_as_real(t.resolve_conj()) if t.is_complex() else t
            w = torch.randn(real.shape, generator=gen, dtype=torch.float64).to(real.device, real.dtype)
            if t.requires_grad:
                terms.append((real * w).sum().double())
    return sum(terms[1:], terms[0]) if terms else None


def _none_as_zeros(a: list[Any], b: list[Any]) -> tuple[list[Any], list[Any]]:
    """A missing gradient equals an all-zero one: eager keeps a zero grad for an
    input whose every use was overwritten in place, the program never reads it."""
    def fill(x, y):
        return torch.zeros_like(y) if x is None and isinstance(y, torch.Tensor) else x
    return [fill(x, y) for x, y in zip(a, b)], [fill(y, x) for x, y in zip(a, b)]


def _names_by_tensor(module: torch.nn.Module, named: str) -> tuple[dict[str, torch.Tensor], list[list[str]]]:
    """``named_parameters``/``named_buffers`` under every name, and the names grouped by tensor
    (in order). A module registered under two names (timm's CoaT shares ``crpe1`` with its
    blocks) or a tied weight is one tensor: which of its names torch's de-duplication keeps
    depends on the order of registration, which a program's module need not repeat; and a
    program may hold the names as one tensor or as several (torch.export.load's module)."""
    by_name = dict(getattr(module, named)(remove_duplicate=False))
    groups: dict[int, list[str]] = {}
    for name, t in by_name.items():
        groups.setdefault(id(t), []).append(name)
    return by_name, list(groups.values())


def _grad_of(names: list[str], params: dict[str, torch.Tensor]) -> Any:
    """The gradient the program gives the tensor eager holds under ``names``: the sum over
    the program's distinct tensors under those names (a tied weight held twice gets its
    gradient in parts), None if none has one, ``"missing"`` if the program has none of them."""
    tensors = list({id(params[n]): params[n] for n in names if n in params}.values())
    if not tensors:
        return "missing"
    grads = [t.grad for t in tensors if t.grad is not None]
    return sum(grads[1:], grads[0]) if grads else None


@on_a_reserved_frame_stack
def verify(ep: torch.export.ExportedProgram, model: torch.nn.Module | None = None,
           args: tuple | None = None, kwargs: dict | None = None, *,
           raise_on_failure: bool = False, check_values: bool = True, check_grads: bool = True,
           rtol: float = 1e-4, atol: float = 1e-5, seed: int = 0,
           nonleaf_inputs: bool = False, target: Any = None, calls: int = 1) -> VerifyReport:
    """Check the contract; with ``model`` and ``args`` also replay against the reference.

    ``calls``: how many calls in a row to replay, each on fresh clones of the inputs,
    eager's model and the program each keeping the state the previous call left
    (buffers, parameters written in place, Python state such as caches and flags):
    a one-time effect of the first call (weights rescaled once, a cache filled)
    shows from the second call on.

    ``check_values=False`` compares only structure, shapes and dtypes (for
    programs with randomness that eager draws differently, e.g. dropout).
    Float inputs require grad in the replay; where eager then refuses (an
    in-place write to a leaf that requires grad) the replay runs without input
    gradients, or, with ``nonleaf_inputs``, with each such input a leaf's
    ``clone()`` (an activation from an upstream layer, which eager lets a
    model write in place), so gradients through the write are compared too.
    An input of the caller's that is such an activation stays one. It always
    returns a report (``raise_on_failure`` aside): what it could not check
    (eager refuses the inputs, the model cannot be copied) is a problem of it.
    ``target`` (an :class:`~predispatch_func.opsets.OpSet`): every op of every
    graph must be in it (region and torch HOPs aside).
    """
    report = check_contract(ep)
    if target is not None:
        from .opsets import Lowering

        report.checked.append(f"membership in {target.name!r}")
        report.problems += [f"{where}: node {node.format_node()} is not in the target op set"
                            for where, node in Lowering(target).outside(ep.graph_module)]
    if model is not None and args is not None:
        _check_calls(calls)
        with _reported_if_it_fails(report, "the replay against eager"):
            program, detached = _copy_program(ep)
            replay = replay_against_reference(program, model, args, kwargs, check_values=check_values,
                                              check_grads=check_grads, rtol=rtol, atol=atol, seed=seed,
                                              nonleaf_inputs=nonleaf_inputs,
                                              ambient=program_facts(ep.graph_module).ambient, calls=calls,
                                              inputs_as_given=_inputs_without_grad(ep))
            if detached:
                replay.checked.append(f"program constants copied without their autograd history: "
                                      f"{', '.join(detached)}")
            report.problems += replay.problems
            report.checked += replay.checked
        with _reported_if_it_fails(report, "the check that the graph writes none of its inputs"):
            spent, _ = copy_without_history(ep)
            p_args, p_kwargs = _clone((args, kwargs or {}), grad_for_floats=False)
            report.problems += [f"the graph writes its input {name} (an op writes it without declaring it)"
                                for name in inputs_the_graph_writes(spent, p_args, p_kwargs, seed)]
            report.checked.append("the graph writes none of its inputs")
    if raise_on_failure and not report.ok:
        raise VerificationError(str(report))
    return report


def _check_calls(calls: int) -> None:
    if calls < 1:
        raise ValueError(f"calls must be at least 1, got {calls}")


@contextlib.contextmanager
def _reported_if_it_fails(report: VerifyReport, stage: str) -> Iterator[None]:
    """A stage of verify that raises is a problem of the report, never the caller's exception:
    the caller asked whether the program is right, and "could not tell, because" is the answer."""
    try:
        yield
    except Exception as exc:
        report.problems.append(f"{stage} could not run: {type(exc).__name__}: {_first_line(exc)}")


def _inputs_without_grad(ep: torch.export.ExportedProgram) -> frozenset[int]:
    """Positions, among the flat user inputs, of those the program must not be called with
    requiring grad (``passes/grad_free_inputs.py``): replayed with the caller's flags."""
    names = program_facts(ep.graph_module).inputs_without_grad
    users = [s.arg.name for s in ep.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    return frozenset(i for i, name in enumerate(users) if name in names)


def replay_against_reference(program: torch.nn.Module, model: torch.nn.Module, args: tuple,
                             kwargs: dict | None = None, *, check_values: bool = True,
                             check_grads: bool = True, rtol: float = 1e-4, atol: float = 1e-5,
                             seed: int = 0, nonleaf_inputs: bool = False, ambient: Any = None,
                             calls: int = 1, inputs_as_given: frozenset[int] = frozenset()) -> VerifyReport:
    """Run ``program`` (a module that writes its mutations back, as ``ep.module()``
    does; it is run as given, so pass a copy) and a copy of ``model`` on fresh
    clones of the inputs, and compare. ``ambient``: the caller's modes at export
    (``AmbientModes``), which the program holds as outer regions; the eager model
    runs under them. ``inputs_as_given``: positions of flat inputs replayed with the
    caller's requires_grad, never made to require grad. Also used by scripts to judge
    torch's paths."""
    _check_calls(calls)
    report = VerifyReport()
    reference_model, detached = copy_without_history(model)
    if detached:
        report.checked.append(f"model attributes copied without their autograd history: {', '.join(detached)}")
    # the replay seeds every device's generator: the caller's CUDA ones are restored too
    with torch.random.fork_rng(devices=range(torch.cuda.device_count()) if torch.cuda.is_initialized() else []):
        attempt = None
        for call in range(calls):
            problems: list[str] = []
            attempt = _replay(program, model, reference_model, attempt, tuple(args), dict(kwargs or {}), report,
                              problems, check_values=check_values, check_grads=check_grads, rtol=rtol,
                              atol=atol, seed=seed + 2 * call, nonleaf_inputs=nonleaf_inputs, ambient=ambient,
                              as_given=inputs_as_given)
            report.problems += [f"call {call + 1}: {p}" for p in problems] if calls > 1 else problems
            if attempt is None:  # the program could not run
                break
            reference_model = attempt[2]
    if calls > 1:
        report.checked.append(f"{calls} calls in a row, state carried")
    return report


def _nonleaf_tensors(named: Any) -> list[tuple[str, torch.Tensor]]:
    """Tensors with autograd history among ``named``'s values (containers walked), by path:
    ``copy.deepcopy`` refuses them (torch copies graph leaves only)."""
    leaves, _ = tc.pytree.tree_flatten_with_path(named)
    return [(".".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path), t) for path, t in leaves
            if isinstance(t, torch.Tensor) and t.grad_fn is not None]


# the name before the judge was called the reference (issue 40); kept for callers of 0.x
replay_against_eager = replay_against_reference


def copy_without_history(obj: Any) -> tuple[Any, list[str]]:
    """``copy.deepcopy(obj)``, where each tensor with autograd history that a module of
    ``obj`` (or an ExportedProgram's constants and state) holds, a cache a forward filled
    for instance, is copied detached; with the names of those tensors."""
    if isinstance(obj, torch.export.ExportedProgram):
        found = _nonleaf_tensors({"constants": dict(obj.constants), "state_dict": dict(obj.state_dict)})
    elif isinstance(obj, torch.nn.Module):
        found = [(f"{prefix}.{name}" if prefix else name, t)
                 for prefix, sub in obj.named_modules()
                 for name, t in _nonleaf_tensors({k: v for k, v in vars(sub).items()
                                                  if k not in ("_parameters", "_buffers", "_modules")})]
    else:
        found = []
    memo = {id(t): t.detach().clone() for _, t in found}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch's own deepcopy of TreeSpecs
        copied = copy.deepcopy(obj, memo)
    rebind_closures(copied, memo)  # a forward closing over the model runs the copy, not the caller's
    return copied, [name for name, _ in found]


def _copy_program(ep: torch.export.ExportedProgram) -> tuple[torch.nn.Module, list[str]]:
    """A runnable copy whose writes never reach the caller's program or model."""
    copied, detached = copy_without_history(ep)
    return copied.module(), detached


def _replay(program, model, reference_model, attempt, args, kwargs, report, problems, *, check_values,
            check_grads, rtol, atol, seed, nonleaf_inputs, ambient, as_given=frozenset()) -> tuple | None:
    """One call of each, compared; returns how eager's inputs were made and the eager model,
    for the next call (None: nothing more can be compared). ``attempt`` is the previous
    call's, or None on the first, which tries: inputs that require grad as leaves (a caller's
    non-leaf stays one); where eager refuses (in-place on a leaf that requires grad), as
    non-leaves; where it still refuses (out= of a tensor that requires grad), with the
    caller's requires_grad only; where eager refuses the caller's own inputs (a leaf of
    theirs that requires grad, written in place), with those as non-leaves, said in the
    report. Where eager refuses even that, the report says so as a problem."""
    first = attempt is None
    if first:
        attempts = [(True, False)] + [(True, True)] * nonleaf_inputs + [(False, False), (False, True)] \
            if check_grads else [(False, False), (False, True)]
    else:
        attempts = [attempt[:2]]
    refused = None
    for i, (grad_inputs, nonleaf) in enumerate(attempts):
        leaf_of: dict = {}
        candidate = (copy_without_history(model)[0] if i else reference_model) if first else reference_model
        e_args, e_kwargs = _clone((args, kwargs), grad_inputs, leaf_of, as_given, nonleaf=nonleaf)
        try:
            e_state = output_aliasing.state_tensors(candidate)
            with CallersTensorsTripwire(callers_tensors(model, (args, kwargs), tc.pytree.tree_leaves)):
                e_out, e_grad_mode = _run(candidate, e_args, e_kwargs, seed, ambient)
            e_rng = torch.get_rng_state()
            reference_model = candidate
            break
        except Exception as exc:  # eager refuses these inputs: try the next way of making them
            if i == len(attempts) - 1:
                problems.append(f"eager raised {type(exc).__name__} on copies of the inputs, so nothing was "
                                f"compared: {_first_line(exc)}")
                return None
            refused = exc
    if first and (grad_inputs, nonleaf) == (False, True):
        report.checked.append(f"inputs that require grad as a leaf's clone() (eager refuses them as given: "
                              f"{_first_line(refused) if refused is not None else ''})")
    p_args, p_kwargs = _clone((args, kwargs), grad_inputs, leaf_of, as_given, nonleaf=nonleaf)
    try:
        p_out, p_grad_mode = _run(program, p_args, p_kwargs, seed)
        p_rng = torch.get_rng_state()
    except Exception as exc:  # a program that cannot run is a verification failure
        problems.append(f"program raised {type(exc).__name__}: {exc}")
        return None
    checked = report.checked if first else []  # what a replay checks is said once, on the first call
    checked += ["outputs", "input mutations", "buffers and parameters", "grad mode after the call"]
    _compare_call(checked, problems, reference_model, program, e_out, p_out, e_rng, p_rng, e_grad_mode,
                  p_grad_mode, (e_args, e_kwargs), (p_args, p_kwargs), leaf_of, check_values=check_values,
                  check_grads=check_grads, rtol=rtol, atol=atol, seed=seed, e_state=e_state)
    return grad_inputs, nonleaf, reference_model


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def _compare_call(checked, problems, reference_model, program, e_out, p_out, e_rng, p_rng, e_grad_mode,
                  p_grad_mode, e_inputs, p_inputs, leaf_of, *, check_values, check_grads, rtol, atol,
                  seed, e_state) -> None:
    (e_args, e_kwargs), (p_args, p_kwargs) = e_inputs, p_inputs
    if check_values:  # what the caller draws next: a program must draw as much as eager
        checked.append("RNG state after the call")
        if not torch.equal(e_rng, p_rng):
            problems.append("RNG state after the call differs from eager's (the program draws differently)")
    if e_grad_mode != p_grad_mode:
        problems.append(f"grad mode after the call: eager {e_grad_mode}, program {p_grad_mode}")
    _compare("output", e_out, p_out, rtol, atol, check_values, problems)
    checked.append("which inputs and state each output shares memory with")
    problems += output_aliasing.differences(output_aliasing.shared_memory(e_out, e_inputs, reference_model, e_state),
                                            output_aliasing.shared_memory(p_out, p_inputs, program))
    _compare("input after call", (e_args, e_kwargs), (p_args, p_kwargs), rtol, atol, check_values, problems)
    for kind, named in (("buffer", "named_buffers"), ("parameter", "named_parameters")):
        (e_state, groups), (p_state, _) = _names_by_tensor(reference_model, named), _names_by_tensor(program, named)
        for names in groups:
            name = next((n for n in names if n in p_state), None)
            if name is None:
                problems.append(f"{kind} {names[0]} missing from the program")
            else:  # a parameter written under no_grad must be written back like a buffer
                _compare(f"{kind} {name} after call", e_state[name], p_state[name], rtol, atol, check_values, problems)
    if not check_grads:
        return
    _compare_requires_grad(e_out, p_out, problems, checked)
    try:  # eager itself may refuse to differentiate: a saved tensor overwritten, or a
        # multi-output view (split) read after its base was written in place
        e_loss = _loss(e_out, seed + 1)
        if e_loss is not None:
            e_loss.backward()
    except RuntimeError as exc:
        checked.append(f"no gradients (eager's backward raised: {str(exc).splitlines()[0][:80]})")
        return
    try:
        p_loss = _loss(p_out, seed + 1)
        if e_loss is None or p_loss is None:  # a requires_grad difference is reported above
            return
        checked.append("gradients")
        p_loss.backward()
    except RuntimeError as exc:
        problems.append(f"program's backward raised where eager's did not: {exc}")
        return
    (e_params, groups), (p_params, _) = (_names_by_tensor(reference_model, "named_parameters"),
                                         _names_by_tensor(program, "named_parameters"))
    groups = [g for g in groups if e_params[g[0]].requires_grad]
    names = [g[0] for g in groups]
    e_pg, p_pg = _none_as_zeros([e_params[k].grad for k in names], [_grad_of(g, p_params) for g in groups])
    _compare("parameter grads", dict(zip(names, e_pg)), dict(zip(names, p_pg)), rtol, atol, check_values, problems)
    e_leaves = [_grad_leaf(t, leaf_of) for t in tc.pytree.tree_leaves((e_args, e_kwargs)) if isinstance(t, torch.Tensor)]
    p_leaves = [_grad_leaf(t, leaf_of) for t in tc.pytree.tree_leaves((p_args, p_kwargs)) if isinstance(t, torch.Tensor)]
    # a non-leaf's .grad is always None (reading it makes torch warn in the user's test run)
    _compare("input grads", *_none_as_zeros([t.grad if t.is_leaf else None for t in e_leaves],
                                            [t.grad if t.is_leaf else None for t in p_leaves]),
             rtol, atol, check_values, problems)
