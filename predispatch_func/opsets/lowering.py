"""Lowering a trace into a target :class:`OpSet`, while it is traced.

torch lowers to Core ATen with ``ep.run_decompositions()``, after autograd,
which drops grad-mode and autocast regions. Here the lowering happens inside
the pre-dispatch trace, so regions, functionalization and trainability stay.
Each op outside the target is decomposed (torch's core ATen decomposition
first, then another ATen-level decomposition torch registers, then its
CompositeImplicitAutograd one), and the decomposition's own
ops come back through the same rule, so lowering repeats until every op is in
the target or has no decomposition left. It happens at two levels:

* in our functional mode (:meth:`Lowering.functional_decomposition`,
  :meth:`Lowering.forces_decomposition`): pure, non-view ops and composites,
  so the decomposition's body is functionalized like user code;
* in make_fx's proxy mode (:meth:`Lowering.proxy_table`): what
  functionalization itself emits (the functional twin of an in-place op,
  a view replayed from its base), which never comes back to our mode.

Composites in the target are kept when the composite policy keeps them (the
schema audit says they are honest); one it decomposes anyway is named in a
warning. After tracing, :meth:`Lowering.check` refuses a program that still
holds an op outside the target, listing every such op and the user's line.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch

from .. import _torch_compat as tc
from ..errors import Refusal, UnsupportedError
from ..graphs import all_graph_modules
from .opset import OpSet

aten = torch.ops.aten

# Bookkeeping ops torch.export's own verifier allows in any dialect: shapes and asserts.
_INFRASTRUCTURE = frozenset({
    aten.sym_size.int, aten.sym_stride.int, aten.sym_numel.default,
    aten.sym_storage_offset.default, aten._assert_scalar.default,
    aten._assert_tensor_metadata.default, aten.sym_constrain_range.default,
    aten.sym_constrain_range_for_size.default, aten._assert_async.msg,
})
# Kept out of the proxy table: copy has our own differentiable decomposition (trace/).
_NEVER_DECOMPOSED_BY_US = frozenset({aten.copy.default})
# Kept under every target: the program still trains, and ``detach`` cuts its gradients. torch's
# Core ATen decomposition (``alias``) is right only after autograd (run_decompositions): here it
# sent gradients through every detached value (tests/opsets/test_detach_kept.py). A backend
# runs it as an alias; the ops report lists it.
AUTOGRAD_BOUNDARIES = frozenset({aten.detach.default})


def _ours() -> Any:
    """Our decompositions (``decompositions``: ``TABLE``, ``FALLBACK``, ``READS_DATA``). Their
    thirty modules load on first use: an export without ``target=`` never needs them, and a
    first export in a fresh process paid 10 ms importing them."""
    from . import decompositions

    return decompositions


def is_infrastructure(target: Any) -> bool:
    """Not an operator a backend implements: getitem, symbolic arithmetic, HOPs, asserts."""
    if isinstance(target, tc.HigherOrderOperator):
        return True
    if isinstance(target, tc.OpOverload):
        return target in _INFRASTRUCTURE
    return callable(target) and getattr(target, "__module__", None) in (
        operator.__name__, "_operator", "builtins", "math", "torch", "torch.fx.experimental.sym_node")


class Lowering:
    """Everything one export needs to stay inside ``target``.

    ``above_autograd``: the program is traced above autograd and still trains, so ops that
    only mean something to autograd (``AUTOGRAD_BOUNDARIES``) stay; ``pf.eager`` runs below
    autograd, where they lower as torch lowers them."""

    __slots__ = ("_core", "_functional_cache", "above_autograd", "target")

    def __init__(self, target: OpSet, *, above_autograd: bool = True):
        self.target = target
        self.above_autograd = above_autograd
        self._core: dict[tc.OpOverload, Callable] | None = None  # built on first use: a second's imports
        self._functional_cache: dict[tc.OpOverload, Callable | None] = {}

    def _table(self) -> dict[tc.OpOverload, Callable]:
        if self._core is None:
            self._core = core_decompositions()
        return self._core

    def allows(self, op: Any) -> bool:
        return op in self.target or is_infrastructure(op) or (self.above_autograd and op in AUTOGRAD_BOUNDARIES)

    def decomposition(self, op: tc.OpOverload) -> Callable | None:
        """The decomposition lowering uses for ``op`` (None: in the target, or none exists)."""
        if self.allows(op) or op in _NEVER_DECOMPOSED_BY_US:
            return None
        if op in self.target.decompositions:
            return self.target.decompositions[op]
        core = self._table()
        if op in core:
            return core[op]
        if tc.has_composite_implicit_kernel(op):
            return functools.partial(_decompose_composite, op)
        return None

    # --- the functional-mode level ---------------------------------------------

    def forces_decomposition(self, op: tc.OpOverload) -> bool:
        """A composite outside the target: decompose it whatever the audit says."""
        return not self.allows(op) and tc.has_composite_implicit_kernel(op)

    def functional_decomposition(self, op: Any) -> Callable | None:
        """Torch's core decomposition of a pure, non-view op outside the target.

        Run by our functional mode, so in-place ops inside the decomposition
        are functionalized. Views and in-place ops are left to
        functionalization (their functional forms meet :meth:`proxy_table`);
        annotated composites to the composite policy (their own decomposition
        keeps the aliasing eager has), and so are ops torch tags unsafe
        (``native_batch_norm`` lies about writing its running stats).
        """
        if not isinstance(op, tc.OpOverload):
            return None
        if op not in self._functional_cache:
            schema = tc.schema_of(op)
            plain = not (schema.is_mutable or op.is_view or tc.torch_tags_unsafe(op)
                         or any(a.alias_info for a in (*schema.arguments, *schema.returns)))
            self._functional_cache[op] = (
                self.target.decompositions.get(op) or self._table().get(op)
                if plain and not self.allows(op) and op not in _ours().READS_DATA else None)
            if op is _SDPA and not self.allows(op):
                self._functional_cache[op] = _sdpa_lowered
        return self._functional_cache[op]

    # --- the proxy-mode level ---------------------------------------------------

    def proxy_table(self) -> dict[tc.OpOverload, Callable]:
        """make_fx's decomposition table: every known op outside the target that decomposes."""
        return _proxy_table(self.target, self.above_autograd)

    # --- after tracing ------------------------------------------------------------

    def warn_decomposed_members(self, decisions: Mapping[str, tuple[str, str]]) -> None:
        """Name each composite of the target that the policy decomposed anyway."""
        for name, (decision, why) in sorted(decisions.items()):
            if decision == "decompose" and name in _names(self.target):
                warnings.warn(
                    f"{name} is in the target op set but was decomposed ({why}): it does not "
                    "behave as its schema says, so keeping it could lose a mutation",
                    TargetMemberDecomposed, stacklevel=3)

    def outside(self, gm: torch.fx.GraphModule) -> list[tuple[str, torch.fx.Node]]:
        """(graph path, node) for every call outside the target, in every graph."""
        return [(where, node) for where, sub in all_graph_modules(gm) for node in sub.graph.nodes
                if node.op == "call_function" and not self.allows(node.target)]

    def missing(self, gm: torch.fx.GraphModule) -> dict[str, MissingOp]:
        """Each op outside the target, by name: why it was not lowered and where it is called."""
        found: dict[str, MissingOp] = {}
        for where, node in self.outside(gm):
            name = str(node.target)
            if name not in found:
                found[name] = MissingOp(name, self.why_missing(name), [])
            line = _user_line(node) or "(no user source line recorded)"
            line += "" if where == "<top>" else f" [in {where}]"
            if line not in found[name].lines:
                found[name].lines.append(line)
        return found

    def check(self, gm: torch.fx.GraphModule) -> None:
        """Refuse a program that still holds ops outside the target (never a partial program)."""
        missing = self.missing(gm)
        if missing:
            raise TargetUnreachableError(self.target.name, missing)

    def why_missing(self, name: str) -> str:
        ops = OpSet.from_names([name]) if "." in name else None
        op = next(iter(ops), None) if ops else None
        if op is None:
            return "not an ATen operator overload"
        if op in _ours().READS_DATA:
            return ("its decomposition reads tensor data for a size or a value (.item()), which a program "
                    "cannot hold; pf.eager runs it")
        if self.decomposition(op) is None:
            if op in tc.prims_decomposition_ops():
                return ("torch decomposes it only into prims (torch._refs), not into ATen; "
                        "run_decompositions() keeps it too")
            return "torch has no decomposition for it (core ATen table nor CompositeImplicitAutograd)"
        declines = getattr(self.decomposition(op), "declines", None)
        if declines is not None:
            return f"its decomposition declines {declines}"
        return "its decomposition did not take effect (it is emitted below the level decompositions run at)"


_SDPA = torch.ops.aten.scaled_dot_product_attention.default


def _sdpa_lowered(query: Any, key: Any, value: Any, attn_mask: Any = None, dropout_p: float = 0.0,
                  is_causal: bool = False, scale: Any = None, enable_gqa: bool = False) -> Any:
    """sdpa outside the target: its composite picks a fused kernel by device, and on CUDA the
    flash and memory-efficient kernels have no decomposition (found on the GPU), so a call
    without dropout on a GPU tensor is lowered through the math kernel, which decomposes. CPU
    calls (their fused kernel decomposes) and dropout (eager's kernel draws its own numbers)
    keep the composite's own choice."""
    if query.device.type == "cpu" or dropout_p:
        return _SDPA.decompose(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        # sdpa turns a boolean mask into an additive one before it picks a kernel; the math kernel
        # adds whatever mask it is given (a boolean one as 0/1: found on the GPU, gpt2 and llama)
        attn_mask = torch.zeros_like(attn_mask, dtype=query.dtype).masked_fill(attn_mask.logical_not(), -math.inf)
    return torch.ops.aten._scaled_dot_product_attention_math.default(
        query, key, value, attn_mask, dropout_p, is_causal, None, scale=scale, enable_gqa=enable_gqa)[0]


@dataclasses.dataclass
class MissingOp:
    """An op left outside the target: why, and the user's lines that call it."""

    name: str
    why: str
    lines: list[str]


class TargetUnreachableError(UnsupportedError):
    """The program needs ops the target lacks and torch cannot decompose into it.

    ``missing`` maps each op's name to a :class:`MissingOp`.
    """

    def __init__(self, target_name: str, missing: dict[str, MissingOp]):
        self.missing = missing
        parts = [f"cannot lower {len(missing)} op(s) into the target op set {target_name!r}:"]
        for name, op in sorted(missing.items()):
            parts.append(f"  {name}: {op.why}")
            parts.extend(f"      at {line}" for line in op.lines[:3])
            if len(op.lines) > 3:
                parts.append(f"      ... and {len(op.lines) - 3} more")
        parts.append("add these ops to the target, give each a decomposition "
                     "(target.with_decompositions({op: function})), or rewrite the code that calls them")
        super().__init__("\n".join(parts), kind=Refusal.OP_NOT_IN_TARGET)


class TargetMemberDecomposed(UserWarning):
    """A composite in the target op set was decomposed because it lies about its schema."""


def _decompose_composite(op: tc.OpOverload, *args: Any, **kwargs: Any) -> Any:
    return op.decompose(*args, **kwargs)


def _names(target: OpSet) -> frozenset[str]:
    return frozenset(target.names())


def _user_line(node: torch.fx.Node) -> str | None:
    """The innermost user frame of the node's recorded stack trace."""
    trace = node.meta.get("stack_trace")
    if not trace:
        return None
    lines = [ln.strip() for ln in trace.strip().splitlines()]
    frames = [(ln, lines[i + 1] if i + 1 < len(lines) else "") for i, ln in enumerate(lines)
              if ln.startswith("File ")]
    user = [f for f in frames if _is_user_file(f[0])]
    chosen = (user or frames)[-1] if (user or frames) else None
    return f"{chosen[0]}: {chosen[1]}" if chosen else None


def _is_user_file(frame_line: str) -> bool:
    from ..errors import _is_user_frame

    path = frame_line.split('"')[1] if '"' in frame_line else frame_line
    return _is_user_frame(path)


@functools.lru_cache(maxsize=1)
def core_decompositions() -> dict[tc.OpOverload, Callable]:
    """torch's core ATen decompositions, then any other ATen-level one torch registers
    for an op that table lacks, then ours for ops torch leaves without one
    (``decompositions``; its ``FALLBACK`` only where this torch has none): the one table both
    export and eager lower with."""
    ours = _ours()
    return {**ours.FALLBACK, **tc.aten_decomposition_table(), **tc.core_aten_decomposition_table(), **ours.TABLE}


@functools.lru_cache(maxsize=1)
def _composite_aten_ops() -> tuple[tc.OpOverload, ...]:
    ops = []
    for full in tc.all_op_names():
        namespace, _, rest = full.partition("::")
        if namespace == "aten":
            op = tc.resolve_overload(namespace, rest)
            if op is not None and tc.has_composite_implicit_kernel(op):
                ops.append(op)
    return tuple(ops)


@functools.lru_cache(maxsize=8)
def _proxy_table(target: OpSet, above_autograd: bool) -> dict[tc.OpOverload, Callable]:
    lowering = Lowering(target, above_autograd=above_autograd)
    table = {}
    for op in (*core_decompositions(), *_composite_aten_ops(), *target.decompositions):
        decomposition = lowering.decomposition(op)
        if decomposition is not None and op not in _ours().READS_DATA:
            table[op] = decomposition
    return table
