"""Python state that ``forward`` writes, judged by what eager does over several calls.

A program holds tensors only, so it replays the first call: the traced
``forward`` started from the model's Python state as the user left it. That is
right exactly when eager's later calls compute what its first call computes.
Whether an attribute was written says little (a memo cache, a flag set once, a
hook installed on the first call, a value recomputed and stored each call all
write one); eager's behaviour over calls says it all. So, on deep copies (the
caller's model, inputs and RNG are never touched; tensors a model kept of an
earlier call with grad on are copied detached, :mod:`.history_free_copy`),
:func:`judge_over_calls`
runs two models side by side for three calls::

    live     one model called again and again: eager as the user will see it
    replica  a fresh copy of the model as it was, holding live's tensors as they
             are before the call: what the program computes on that call

Calls 1 and 2 take the caller's inputs, call 3 the same tensors with their
elements shuffled (a cache of the inputs shows itself there). Each written
attribute is then

- *carried* when live and replica agree on every call (outputs, tensors, the
  inputs written back) and the attribute settles: the second identical call
  leaves it as the first did;
- *drifting* when a second identical call changes it again (a counter, a log):
  the program cannot hold what eager keeps accumulating;
- *read back* when it settles but live and replica disagree (a stale cache,
  a set-up that changes what later calls compute): later calls of the program
  would differ from eager's.

If eager cannot be asked (meta or fake tensors, a model that cannot be copied,
a call that raises), nothing is carried.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import dataclasses
import enum
from collections.abc import Callable
from typing import Any

import torch

from .. import _torch_compat as tc
from .access_order import AccessOrder
from .caller_tripwire import CallersTensorsTripwire, callers_tensors
from .history_free_copy import deepcopy_without_history

_CALLS = 3
_RTOL, _ATOL = 1.3e-6, 1e-5  # a cache and its recomputation may round differently


class Verdict(enum.Enum):
    CARRIED = "settles after the first call and later calls compute what the first did"
    DRIFTING = "changes again on a second identical call (a counter or a log): the program keeps the first call's value"
    READ_BACK = ("later eager calls read it and compute differently from the first call (a stale cache or a "
                 "one-time change): the program would repeat the first call")
    UNJUDGED = "eager could not be run to judge it"


@dataclasses.dataclass(frozen=True)
class Written:
    """One attribute a traced call wrote: ``module`` is its module's qualified name."""

    module: str
    name: str


@dataclasses.dataclass(frozen=True)
class Judgement:
    verdict: Verdict
    detail: str = ""  # why eager could not be run, for UNJUDGED

    @property
    def carried(self) -> bool:
        return self.verdict is Verdict.CARRIED

    def __str__(self) -> str:
        return self.verdict.value + (f" ({self.detail})" if self.detail else "")


def judge_over_calls(model: torch.nn.Module, inputs: tuple[tuple, dict],
                     written: list[Written]) -> dict[Written, Judgement]:
    """Run deep copies of ``model`` over three calls and judge each of ``written``."""
    unjudged = _why_eager_cannot_run(model, inputs)
    if unjudged is None:
        try:
            token = _CALLERS.set(tuple(callers_tensors(model, inputs, tc.pytree.tree_leaves)))
            try:
                with torch.random.fork_rng(devices=_cuda_devices(model, inputs)):
                    return _judge(model, inputs, written)
            finally:
                _CALLERS.reset(token)
        except Exception as e:  # noqa: BLE001 (any failure of the user's eager code leaves it unjudged)
            unjudged = f"{type(e).__name__}: {e}".splitlines()[0][:200]
    return dict.fromkeys(written, Judgement(Verdict.UNJUDGED, unjudged))


def _judge(model: torch.nn.Module, inputs: tuple[tuple, dict], written: list[Written]) -> dict[Written, Judgement]:
    # ``model`` is back as the caller left it and is only ever copied, never called
    live = deepcopy_without_history(model)
    order = AccessOrder.of(live, [(w.module, w.name) for w in written])
    first = _EagerCall.on(live, inputs, seed=0, order=order)
    if order is not None and not order.read_before_written:
        judged = _judged_by_access_order(live, inputs, written, order)
        if judged is not None:
            return judged
        live = deepcopy_without_history(model)  # read first on the second call: the full judge starts over
        first = _EagerCall.on(live, inputs, seed=0)
    return _judged_over_three_calls(model, live, inputs, written, first)


@dataclasses.dataclass(frozen=True)
class _EagerCall:
    """One eager call of ``live``: its inputs (fresh clones, as the call left them), its
    outputs, and the RNG state it started from (``torch.manual_seed(seed)``)."""

    inputs: Any
    outputs: Any
    seeded: torch.Tensor

    @staticmethod
    def on(live: torch.nn.Module, inputs: tuple[tuple, dict], *, seed: int,
           order: AccessOrder | None = None) -> _EagerCall:
        fresh = _fresh(inputs)
        torch.manual_seed(seed)
        seeded = torch.get_rng_state()
        with order.recording() if order is not None else contextlib.nullcontext():
            out = _call(live, fresh)
        return _EagerCall(fresh, out, seeded)


def _judged_over_three_calls(model: torch.nn.Module, live: torch.nn.Module, inputs: tuple[tuple, dict],
                             written: list[Written], first_call: _EagerCall) -> dict[Written, Judgement]:
    """The full judge (module docstring), ``live`` having made call 0 (``first_call``)."""
    calls = [inputs, inputs, _shuffled(inputs)]
    agree = True
    first: tuple[Any, Any, dict[str, torch.Tensor]] | None = None  # call 0's inputs, outputs and tensors
    if _first_call_replays_itself(model, live, first_call.seeded):
        first = (_fresh(first_call.inputs), _fresh(first_call.outputs), _tensors(model))
    seen = [{w: _frozen(_read(live, w)) for w in written}]
    for call, call_inputs in enumerate(calls[1:], start=1):
        # the replica takes live's tensors as they are before the call (None: call 0 stands for it)
        replica = _replica(model, live) if not (call == 1 and first is not None) else None
        live_in = _fresh(call_inputs)
        torch.manual_seed(call)
        live_out = _call(live, live_in)
        if replica is None:  # the replica would compute what call 0 did
            assert first is not None
            replica_in, replica_out, replica_tensors = first
        else:
            replica_in = _fresh(call_inputs)
            torch.manual_seed(call)
            replica_out = _call(replica, replica_in)
            replica_tensors = _tensors(replica)
        agree = agree and _alike(live_out, replica_out) and _alike(live_in, replica_in) \
            and _alike(_tensors(live), replica_tensors)
        seen.append({w: _frozen(_read(live, w)) for w in written})
    verdicts = {}
    for w in written:
        if seen[0][w] != seen[1][w]:
            verdicts[w] = Judgement(Verdict.DRIFTING)
        else:
            verdicts[w] = Judgement(Verdict.CARRIED if agree else Verdict.READ_BACK)
    return verdicts


def _judged_by_access_order(live: torch.nn.Module, inputs: tuple[tuple, dict], written: list[Written],
                            order: AccessOrder) -> dict[Written, Judgement] | None:
    """Judge with one more live call and no replica, ``live`` having made call 0 setting every
    written attribute before reading it (:mod:`.access_order`); None when the second call
    reads one first.

    A call that never reads what the last call left computes what the first call did:
    live and replica would agree, so only settling is left to judge (a timestamp or a
    random draw stored each call still changes on the second call)."""
    first = {w: _frozen(_read(live, w)) for w in written}
    _EagerCall.on(live, inputs, seed=1, order=order)
    if order.read_before_written:
        return None
    return {w: Judgement(Verdict.DRIFTING if first[w] != _frozen(_read(live, w)) else Verdict.CARRIED)
            for w in written}


def _first_call_replays_itself(model: torch.nn.Module, live: torch.nn.Module, seeded: torch.Tensor) -> bool:
    """Whether the first call drew no random numbers and wrote none of the model's tensors.
    Then the replica of the second call (identical inputs) is the model exactly as the
    first call found it and computes what the first call computed, so that call's
    results stand for the replica's: one eager call and one copy fewer."""
    if _cuda_devices(model, ()) or not torch.equal(torch.get_rng_state(), seeded):
        return False
    return _alike(_tensors(live), _tensors(model))


# --- running eager on copies ------------------------------------------------------------

_CALLERS: contextvars.ContextVar[tuple[torch.Tensor, ...]] = contextvars.ContextVar("callers_tensors", default=())


def _call(copy_of_model: torch.nn.Module, inputs: tuple[tuple, dict]) -> Any:
    """Call a copy, stopped if it reaches the caller's tensors (:mod:`.caller_tripwire`)."""
    with CallersTensorsTripwire(_CALLERS.get()):
        return copy_of_model(*inputs[0], **inputs[1])


def _why_eager_cannot_run(model: torch.nn.Module, inputs: Any) -> str | None:
    tensors = [*model.parameters(), *model.buffers(),
               *(t for t in tc.pytree.tree_leaves(inputs) if isinstance(t, torch.Tensor))]
    if any(t.is_meta or isinstance(t, tc.FakeTensor) for t in tensors):
        return "the model or its inputs hold meta or fake tensors"
    leftover = _traced_value_held(model)
    if leftover is not None:
        where, value = leftover
        return (f"the model holds a traced {type(value).__name__} at {where!r}, which an earlier trace wrote "
                "there (torch.export leaves the attributes its trace writes); the model cannot be copied to "
                "be called: export a freshly built or loaded model")
    return None


_TRACED_VALUES = (torch.SymInt, torch.SymFloat, torch.SymBool, tc.FakeTensor, tc.FunctionalTensor)


def _traced_value_held(model: torch.nn.Module) -> tuple[str, Any] | None:
    """A symbolic value or tracing tensor in a module's attributes (or one container down):
    what a trace that does not restore the model (torch.export's) leaves behind."""
    for name, module in model.named_modules():
        for attr, value in vars(module).items():
            members = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else ()
            traced = next((v for v in (value, *members) if isinstance(v, _TRACED_VALUES)), None)
            if traced is not None:
                return (f"{name}.{attr}" if name else attr), traced
    return None


def _cuda_devices(model: torch.nn.Module, inputs: Any) -> list[int]:
    tensors = [*model.parameters(), *model.buffers(),
               *(t for t in tc.pytree.tree_leaves(inputs) if isinstance(t, torch.Tensor))]
    return sorted({t.device.index or 0 for t in tensors if t.device.type == "cuda"})


def _fresh(value: Any) -> Any:
    """Clones of every tensor leaf, keeping requires_grad; a tensor passed twice stays one."""
    memo: dict[int, torch.Tensor] = {}

    def one(t: torch.Tensor) -> torch.Tensor:
        if id(t) not in memo:
            memo[id(t)] = t.detach().clone().requires_grad_(t.requires_grad)
        return memo[id(t)]
    return tc.pytree.tree_map_only(torch.Tensor, one, value)


def _shuffled(value: Any) -> Any:
    """The same tensors with their elements permuted: the same values (valid token ids,
    masks) in other places, so a result cached from one call's inputs shows as stale."""
    generator = torch.Generator().manual_seed(0)

    def one(t: torch.Tensor) -> torch.Tensor:
        if t.numel() < 2:
            return t
        order = torch.randperm(t.numel(), generator=generator).to(t.device)
        return t.detach().reshape(-1)[order].reshape(t.shape).requires_grad_(t.requires_grad)
    return tc.pytree.tree_map_only(torch.Tensor, one, value)


def _replica(model: torch.nn.Module, live: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model`` (Python state as the caller left it) holding ``live``'s current
    parameter and buffer values: what the program computes on live's next call.

    The values go into ``deepcopy``'s memo, so each tensor is copied once, from live,
    and the model's ties (one tensor under two names) stay as they are."""
    memo: dict[int, Any] = {}
    given = _tensors(live)
    for name, tensor in _tensors(model).items():
        value = given.get(name)
        if id(tensor) in memo or value is None or type(tensor) not in (torch.Tensor, torch.nn.Parameter):
            continue  # tensor subclasses, and what live no longer holds, are copied from the model
        clone = value.detach().clone()
        if type(tensor) is torch.nn.Parameter:
            clone = torch.nn.Parameter(clone, requires_grad=tensor.requires_grad)
            vars(clone).update(copy.deepcopy(vars(tensor), memo))
        memo[id(tensor)] = clone
    return deepcopy_without_history(model, memo)


def _tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {**dict(model.named_parameters(remove_duplicate=False)),
            **dict(model.named_buffers(remove_duplicate=False))}


def _alike(a: Any, b: Any) -> bool:
    leaves_a, spec_a = tc.pytree.tree_flatten(a)
    leaves_b, spec_b = tc.pytree.tree_flatten(b)
    if spec_a != spec_b:
        return False
    return all(_same_leaf(x, y) for x, y in zip(leaves_a, leaves_b))


def _same_leaf(x: Any, y: Any) -> bool:
    if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
        if x.shape != y.shape or x.dtype != y.dtype:
            return False
        x, y = x.detach(), y.detach()
        if torch.equal(x, y):  # the common case, and far cheaper than allclose
            return True
        if x.is_floating_point() or x.is_complex():
            return torch.allclose(x, y, rtol=_RTOL, atol=_ATOL, equal_nan=True)
        return torch.equal(x, y)
    if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
        return False
    try:
        return bool(type(x) is type(y) and x == y)
    except Exception:  # noqa: BLE001 (objects whose == raises or is ambiguous)
        return x is y


# --- reading and comparing what was written -----------------------------------------------

_MISSING = object()


def _read(model: torch.nn.Module, w: Written) -> Any:
    try:
        module = model.get_submodule(w.module)
    except AttributeError:
        return _MISSING
    if w.name == "training":
        return module.training
    for table in ("_parameters", "_buffers", "_modules"):
        held = vars(module).get(table, {})
        if w.name in held:
            return held[w.name]
    return vars(module).get(w.name, _MISSING)


def _frozen(value: Any, depth: int = 0) -> Any:
    """A comparable copy of ``value`` taken now: tensors by value, containers by contents,
    modules and functions by identity, other objects by their attributes (a few levels)."""
    if isinstance(value, torch.Tensor):
        return _TensorValue(value.detach().clone())
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_frozen(v, depth + 1) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((k, _frozen(v, depth + 1)) for k, v in value.items()))
    if isinstance(value, (set, frozenset)):
        return ("set", frozenset(value)) if all(_hashable(v) for v in value) else ("id", id(value))
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes, enum.Enum, type)):
        return value
    if isinstance(value, (torch.nn.Module, Callable)) or depth >= 3 or not hasattr(value, "__dict__"):  # type: ignore[arg-type]
        return ("id", id(value))
    return (type(value), _frozen(dict(vars(value)), depth + 1))


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


class _TensorValue:
    """A tensor compared by shape, dtype and values."""

    __slots__ = ("tensor",)

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _TensorValue) and _same_leaf(self.tensor, other.tensor)

    __hash__ = None  # type: ignore[assignment]
