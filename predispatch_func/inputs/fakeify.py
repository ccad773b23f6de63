"""Fake-ify inputs: real (or meta) tensors become FakeTensors sharing one ShapeEnv.

State is always static. A user input dimension is symbolic only where
``dynamic_shapes`` (torch.export's format: per argument, a dict or sequence
mapping dim index -> ``torch.export.Dim``) says so. Dims with the same name
are one symbol; a derived Dim (``dx + 1``, ``2 * dx``) is that expression of
its root's symbol (a root no input has as a size gets a symbol of its own,
as torch.export's phantom roots). After tracing, :meth:`Fakeifier.range_constraints` checks
that the model kept every declared dimension symbolic, within the declared
``[min, max]``, and returns the ranges the ExportedProgram promises.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import sympy
import torch

from .. import _torch_compat as tc
from ..errors import DimHintError, DynamicShapesError, Refusal
from .dynamic_shapes_spec import IntDim, dims_per_leaf, leaf_paths


@dataclasses.dataclass
class _DeclaredDim:
    """One named ``Dim`` (or an anonymous ``Dim.DYNAMIC``/``AUTO`` hint) and its symbol."""

    name: str
    lower: int
    upper: Any
    strict: bool  # a named Dim: the trace must honour its range exactly
    may_specialise: bool  # Dim.AUTO: the model may fix the size (as torch.export allows)
    dynamic_hint: bool  # Dim.DYNAMIC: neither named nor allowed to specialise
    size: torch.SymInt | int  # an int: a phantom root torch specialised
    where: str
    example: int
    phantom: bool = False  # a derived Dim's root no input has as a size
    source: str = ""  # the input as torch.export names it: ``['x']`` (``L['x'].size()[0]``)
    index: int | None = None  # the dim of that input; None: the input is an int
    hint: Any = None  # the Dim.DYNAMIC / Dim.AUTO hint, whose bounds are met with the trace's
    order: int = -1  # the how-manieth declaration (input order); a phantom root: none
    initial: Any = None  # its symbol before tracing (one tensor passed twice: one symbol from the start)

    def torch_name(self, style: str) -> str:
        return _torch_name(self.source, self.index, style)


@dataclasses.dataclass
class _DerivedUse:
    """An input size declared as a derived Dim; related to its root once every input is fake."""

    dim: Any
    size: torch.SymInt
    where: str
    example: int
    order: int
    torch_name: str  # L['x'].size()[0]


class Fakeifier:
    """One fake mode per export; remembers which user dims are dynamic."""

    def __init__(self, dynamic_shapes: Any, mod: torch.nn.Module, args: tuple, kwargs: dict, *,
                 prefer_deferred_runtime_asserts_over_guards: bool = False):
        # as torch.export's shape env: a Python ``assert`` on a data-dependent value becomes a
        # runtime assert of the program (not a data-dependent error)
        self.shape_env = tc.ShapeEnv(
            trace_asserts=True,
            prefer_deferred_runtime_asserts_over_guards=prefer_deferred_runtime_asserts_over_guards)
        self.mode = tc.FakeTensorMode(shape_env=self.shape_env, allow_non_fake_inputs=True)
        self._dims_per_leaf = dims_per_leaf(dynamic_shapes, mod, args, kwargs)
        self._paths = leaf_paths(mod, args, kwargs)
        self._hint_conflicts: list[str] = []  # torch.export reports these after tracing, as ValueError
        self._declarations = 0
        self._user_index = 0
        self._declared: dict[str, _DeclaredDim] = {}
        self._derived: list[_DerivedUse] = []
        self._state_ids: set[int] = set()  # the state tensors faked so far
        self._respelled: dict[Any, Any] = {}  # a Dim's symbol -> its spelling in a new root the fixes declare

    def state(self, t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        self._state_ids.add(id(t))  # (the model holds each for the export's length)
        fake = tc.fake_of_plain_state(self.mode, t)
        return fake if fake is not None else self.mode.from_tensor(t, static_shapes=True)

    def user(self, value: Any) -> Any:
        leaf = self._user_index
        self._user_index += 1
        spec = self._dims_per_leaf[leaf] if leaf < len(self._dims_per_leaf) else None
        if isinstance(spec, IntDim) and _is_static_hint(spec.dim):
            self._static_bounds(spec.dim, value, self._path(leaf), None, f"user input {leaf} (an int)")
        if isinstance(spec, IntDim) and not _is_static_hint(spec.dim):
            if _is_named_dim(spec.dim):  # torch.export refuses these too
                raise DynamicShapesError(f"user input {leaf} is an int: a named Dim cannot make it dynamic "
                                         "(as in torch.export); use Dim.AUTO or Dim.DYNAMIC",
                                         kind=Refusal.DYNAMIC_SHAPES_SPEC)
            symbol = tc.symbolic_int(self.mode, value, leaf)
            self._declare(spec.dim, symbol, f"user input {leaf} (an int)", value, self._path(leaf), None)
            return symbol
        if not isinstance(value, torch.Tensor):
            return value
        if id(value) in self._state_ids:  # the model's own parameter or buffer, passed in
            value = _separate_alias(value)
        for i, d in (spec or {}).items():
            if isinstance(d, int) and d != value.shape[i]:
                raise DynamicShapesError(f"Static shape constraint of {d} does not match input size of "
                                         f"{value.shape[i]}, for user input {leaf}, dim {i}",
                                         kind=Refusal.DYNAMIC_SHAPES_SPEC)
        for i, d in (spec or {}).items():
            if _is_static_hint(d):
                self._static_bounds(d, value.shape[i], self._path(leaf), i, f"user input {leaf}, dim {i}")
        dims = {i: d for i, d in (spec or {}).items() if not _is_static_hint(d)}
        if not dims:
            return self.mode.from_tensor(value, static_shapes=True)
        fake = tc.fake_with_dynamic_dims(self.mode, value, set(dims), leaf)
        for i, dim in dims.items():
            self._declare(dim, fake.shape[i], f"user input {leaf}, dim {i}", value.shape[i],  # type: ignore[arg-type]
                          self._path(leaf), i)
        return fake

    def _static_bounds(self, dim: Any, example: int, source: str, index: int | None, where: str) -> None:
        """``Dim.STATIC(min=6, max=8)`` on an example of size 4: the bounds conflict with the static size."""
        if getattr(dim, "min", None) is None and getattr(dim, "max", None) is None:
            return
        if not int(dim.min or 0) <= example <= (tc.INT_OO if dim.max is None else dim.max):
            self._hint_conflicts.append(_range_conflict(dim, tc.value_range(example, example), source, index, where))

    def _path(self, leaf: int) -> str:
        return self._paths[leaf] if leaf < len(self._paths) else f"[{leaf}]"

    def _declare(self, dim: Any, size: torch.SymInt, where: str, example: int, source: str,
                 index: int | None) -> None:
        self._declarations += 1
        named = _is_named_dim(dim)
        auto = str(getattr(dim, "type", "")).endswith("AUTO")
        hint = None if named or _is_derived_dim(dim) else dim
        if not isinstance(size, torch.SymInt):  # torch specialises example sizes 0 and 1
            if auto:  # Dim.AUTO lets it: the program is static there, as torch.export's
                return
            if hint is not None:  # torch.export reports it with the other hint conflicts, as ValueError
                self._hint_conflicts.append(
                    f"- Received user-specified dim hint Dim.DYNAMIC(min={_bound(hint, 'min')}, max="
                    f"{_bound(hint, 'max')}), but export 0/1 specialized due to hint of {example} for dimension "
                    f"{_torch_name(source, index, 'inputs')} ({where}): torch specialises sizes 0 and 1; export with an example of size 2 or more "
                    "for a dynamic dim (or use Dim.AUTO)")
                return
            raise DynamicShapesError(f"{where}: the example size is {example}, and torch specialises sizes 0 and 1; "
                                     "export with an example of size 2 or more for a dynamic dim (or use Dim.AUTO)",
                                     kind=Refusal.DIM_NOT_DYNAMIC)
        name = dim.__name__ if named else f"_dynamic_{len(self._declared)}"
        if _is_derived_dim(dim):
            if not dim.min <= example <= dim.max:
                raise DynamicShapesError(f"{where}: example size {example} not in range [{dim.min}, {dim.max}] "
                                         f"(outside Dim {name!r})", kind=Refusal.DYNAMIC_SHAPES_SPEC)
            self._derived.append(_DerivedUse(dim, size, where, example, self._declarations,
                                             _torch_name(source, index, "L")))
            return
        # a named Dim's range, or the bounds of a hint (Dim.AUTO(min=3, max=8)); None: unbounded
        lower = int(getattr(dim, "min", None) or 0)
        upper = tc.INT_OO if getattr(dim, "max", None) is None else dim.max
        if named and not lower <= example <= upper:
            raise DynamicShapesError(f"{where}: example size {example} not in range [{lower}, {upper}] "
                                     f"(outside Dim {name!r})", kind=Refusal.DYNAMIC_SHAPES_SPEC)
        if name in self._declared:  # same Dim name: same symbol
            first = self._declared[name]
            if named and (first.lower, first.upper) != (lower, upper):  # torch.export's words and class
                raise DynamicShapesError(
                    f"Found different definitions {_readable_dim(name, first.lower, first.upper)} and "
                    f"{_readable_dim(name, lower, upper)} for the same symbolic dimension {name!r}!",
                    kind=Refusal.DYNAMIC_SHAPES_SPEC)
            tc.check(size == first.size)
            return
        # tracing assumes sizes >= 2 (0/1 are generalised, as torch.export does); a hint's bounds are
        # met with what the trace infers afterwards (so an example outside them is no error yet)
        if named:
            tc.narrow_symbol_range(self.shape_env, size.node.expr, _traced_lower(lower, example), upper)
        dynamic_hint = not named and not auto
        self._declared[name] = _DeclaredDim(name, lower, upper, named, auto, dynamic_hint, size, where, example,
                                            source=source, index=index, hint=hint, order=self._declarations,
                                            initial=_expr(size))

    def relate_derived_dims(self) -> None:
        """Make each derived Dim's size that expression of its root's symbol (call once every
        user input is fake: a derived Dim may come before its root in the inputs)."""
        for use in self._derived:
            root = self._declared.get(use.dim.root.__name__) or self._phantom_root(use)
            root_symbol = _expr(root.size)
            expected = use.dim.fn(root.example)
            if expected != use.example:
                raise DynamicShapesError(
                    f"Expected input size ({use.where}) to be equal to {use.dim.__name__}, where "
                    f"{root.name} = {root.example}, but got {use.example} ({root.name}: {root.where})",
                    kind=Refusal.DYNAMIC_SHAPES_SPEC)
            symbol = _expr(use.size)
            if symbol.is_symbol:
                self._guard_relation(symbol, use.dim.fn, root_symbol, phantom=root.phantom,
                                     root_first=0 <= root.order < use.order)
                tc.relate_symbol(self.shape_env, symbol, use.dim.fn(root_symbol))
            else:  # another use of the same derived Dim already fixed it
                tc.check(use.size == use.dim.fn(root.size))

    def _guard_relation(self, symbol: Any, fn: Any, root: Any, *, phantom: bool, root_first: bool) -> None:
        """What ``ep.module()`` checks of a derived size: its relation to its root's size (the earlier
        input's size on the left, as torch.export writes it: ``x.size()[0] == -1 + y.size()[0]``), or,
        when no input has the root, that it is of the form ``a*r + b`` at all."""
        if not phantom:
            inverse = sympy.solve(sympy.Eq(fn(root), symbol), root) if root_first else []
            if len(inverse) == 1 and all(c.is_Integer for c in sympy.Poly(inverse[0], symbol).coeffs()):
                tc.record_guard(self.shape_env, sympy.Eq(root, inverse[0]))
            else:
                tc.record_guard(self.shape_env, sympy.Eq(symbol, fn(root)))
            return
        free = sympy.Symbol("r", integer=True)
        form = sympy.expand(fn(free))
        scale, offset = form.coeff(free), form.subs(free, 0)
        if scale.is_Integer and offset.is_Integer and abs(int(scale)) > 1:
            tc.record_guard(self.shape_env, tc.divisible_by(symbol - offset, abs(int(scale))))

    def _phantom_root(self, use: _DerivedUse) -> _DeclaredDim:
        """The root of ``use`` when no input has it as a size: a symbol of its own, its hint solved
        from the example (``2 * dx`` of size 8: dx = 4)."""
        dim, root_dim = use.dim, use.dim.root
        unknown = sympy.Symbol("r", integer=True)
        solutions = [v for v in sympy.solve(sympy.Eq(dim.fn(unknown), use.example), unknown) if v.is_integer]
        if not solutions:
            raise DynamicShapesError(f"Expected shape ({use.where}) = {use.example} of input Tensor to be of the "
                                     f"form {dim.__name__}, where {root_dim.__name__} is an integer",
                                     kind=Refusal.DYNAMIC_SHAPES_SPEC)
        hint = int(solutions[0])
        size = tc.phantom_symbol(self.shape_env, hint, root_dim.__name__)
        lower, upper = int(root_dim.min or 0), root_dim.max
        if isinstance(size, torch.SymInt):  # a hint of 0 or 1 is specialised, as for an input's size
            tc.narrow_symbol_range(self.shape_env, size.node.expr, _traced_lower(lower, hint), upper)
        root = _DeclaredDim(root_dim.__name__, lower, upper, strict=True, may_specialise=False, dynamic_hint=False,
                            size=size, where=f"{dim.__name__}'s root", example=hint, phantom=True)
        self._declared[root.name] = root
        return root

    def range_constraints(self, gm: torch.fx.GraphModule) -> dict[Any, Any]:
        """Symbol (or derived expression) -> ValueRanges of the program; refuses, in one error that
        lists them all, a trace that specialised or narrowed a named Dim, or related one to dims it
        was not declared from."""
        out: dict[Any, Any] = {}
        violations = _Violations()
        named_symbols: dict[Any, _DeclaredDim] = {}
        for d in self._declared.values():
            expr = _expr(d.size)
            if expr.is_number and d.phantom:  # its derived Dims' lines say it; the fix names it
                violations.fix(f"{d.name} = {int(expr)}")
            elif expr.is_number and not d.may_specialise:
                violations.specialised(d.name if d.strict else d.torch_name("L"), d.where, expr, fix=d.strict)
            elif expr.is_symbol and d.hint is not None:
                hinted = self._hinted_range(d, expr)
                if hinted is not None:
                    out[expr] = hinted
            elif expr.is_symbol and d.phantom and expr in named_symbols:  # a named Dim is a derived Dim's root
                self._named_root(named_symbols[expr], d, violations)
            elif expr.is_symbol and d.strict and expr in named_symbols \
                    and named_symbols[expr].initial != d.initial:  # the model made two named Dims one
                other = named_symbols[expr]
                violations.add(d.name, f"The values of {d.name} = {d.torch_name('L')} ({d.where}) and {other.name} = "
                                       f"{other.torch_name('L')} ({other.where}) must always be equal",
                               f"{d.name} = {other.name}")
            elif expr.is_symbol and d.strict and (forced := tc.value_forced_by_guards(self.shape_env, expr)) is not None:
                self._forced(d, forced, violations)
            elif expr.is_symbol:
                divisible = d.strict and self._divisibility(d, expr, violations)
                out[expr] = self._declared_range(d, expr, violations, suggest=not divisible)
                if d.strict and not d.phantom:
                    named_symbols[expr] = d
            elif not expr.is_number and d.strict and _is_derived_dim_form(expr):
                self._undeclared_relation(d, expr, violations)
            # else a relation no Dim can declare (``dz = dx0*dx1``): torch.export keeps it as the
            # program's guard, and so do we (ep.module() checks it on every call)
        for use in self._derived:
            expr = _expr(use.size)
            if expr.is_number:  # the fix names the root, as torch.export's does
                violations.specialised(use.dim.__name__, use.where, expr, fix=False)
                continue
            root = _expr(self._declared[use.dim.root.__name__].size)
            if root.is_symbol:  # the derived Dim's range is its root's, mapped through it
                root_range = out.get(root) or tc.symbol_range(self.shape_env, root)
                ends = [use.dim.fn(root_range.lower), use.dim.fn(root_range.upper)]
                out.setdefault(expr, tc.value_range(min(ends), max(ends)))
        violations.raise_if_any()
        if self._hint_conflicts:
            raise DimHintError("Found the following conflicts between user-specified ranges and inferred ranges "
                               "from model tracing:\n" + "\n".join(self._hint_conflicts), kind=Refusal.DIM_NOT_DYNAMIC)
        for node in gm.graph.nodes:  # any other symbol a placeholder carries
            if node.op != "placeholder" or not isinstance(node.meta.get("val"), torch.Tensor):
                continue
            for size in node.meta["val"].shape:
                if isinstance(size, torch.SymInt):
                    for sym in size.node.expr.free_symbols:
                        out.setdefault(sym, tc.symbol_range(self.shape_env, sym))
        for node in gm.graph.nodes:  # unbacked symbols the program binds (a HOP's data-dependent
            for sym in node.meta.get("unbacked_bindings") or ():  # size): torch.export.load reads their ranges
                out.setdefault(sym, tc.symbol_range(self.shape_env, sym))
        return out

    def _hinted_range(self, d: _DeclaredDim, symbol: Any) -> Any:
        """A Dim.DYNAMIC / Dim.AUTO hint's bounds met with the range the trace inferred, as torch.export
        meets them: the program's range is both; none in common, or a single size for Dim.DYNAMIC, is a
        conflict (gathered, raised as ValueError after the constraint violations)."""
        traced = tc.symbol_range(self.shape_env, symbol)
        lower, upper = max(traced.lower, d.lower), min(traced.upper, d.upper)
        if lower > upper or not d.lower <= d.example <= d.upper:
            self._hint_conflicts.append(_range_conflict(d.hint, traced, d.source, d.index, d.where))
            return None
        if lower == upper and d.dynamic_hint:
            self._hint_conflicts.append(
                f"- Received user-specified dim hint Dim.DYNAMIC(min={_bound(d.hint, 'min')}, max="
                f"{_bound(d.hint, 'max')}), but tracing inferred a static shape of {lower} for dimension "
                f"{d.torch_name('inputs')} ({d.where})")
            return None
        if lower > traced.lower or upper < traced.upper:  # the program's guards check the hint's bounds too
            tc.narrow_symbol_range(self.shape_env, symbol, int(lower), upper)
        return tc.value_range(d.lower if lower <= 2 else lower, upper)

    def _named_root(self, named: _DeclaredDim, root: _DeclaredDim, violations: _Violations) -> None:
        """The model made a named Dim the root of derived Dims that no input has as a size: declare it so."""
        use = next(u for u in self._derived if u.dim.root.__name__ == root.name)
        violations.add(named.name, f"The values of {named.name} = {named.torch_name('L')} ({named.where}) must always "
                                   f"be related to the values of {use.dim.__name__} = {use.torch_name} ({use.where}) by "
                                   f"{named.name} = {root.name}", f"{named.name} = {root.name}")

    def _forced(self, d: _DeclaredDim, value: int, violations: _Violations) -> None:
        """A named Dim a guard of the trace allows one size of (``x.reshape(-1) + y`` with
        ``x: (dy - 6, 2)``, ``y: (dy,)``: 2*(dy - 6) == dy, so dy = 12), in torch.export's words:
        the derived Dim whose guards were solved, and the root's size as the fix."""
        use = next((u for u in self._derived if u.dim.root.__name__ == d.name), None)
        what, at, where = ((f"{use.dim.__name__} = {use.torch_name}", use.dim.fn(value), use.where) if use is not None
                           else (f"{d.name} = {d.torch_name('L')}", value, d.where))
        violations.specialisation(d.name, f"solving the guards generated for {what} resulted in a specialized "
                                          f"value of {at} ({where})", f"{d.name} = {value}")

    def _declared_range(self, d: _DeclaredDim, symbol: Any, violations: _Violations, *, suggest: bool) -> Any:
        traced = tc.symbol_range(self.shape_env, symbol)
        if d.strict and (traced.upper < d.upper or traced.lower > max(2, d.lower)):
            violations.add(d.name, f"Not all values of {d.name} ({d.where}) in the declared range "
                                   f"[{d.lower}, {d.upper}] satisfy the generated guard: the model only supports "
                                   f"[{traced.lower}, {traced.upper}]",
                           _dim_fix(d.name, max(d.lower, int(traced.lower)), traced.upper, d.lower) if suggest else None)
        lower = d.lower if traced.lower <= 2 else traced.lower
        return tc.value_range(lower, traced.upper if not d.strict else d.upper)

    def _divisibility(self, d: _DeclaredDim, symbol: Any, violations: _Violations) -> bool:
        """A named Dim the model only takes in multiples of k (``reshape(-1, k)``), or at one residue
        (``(dx + 1) % 3 == 0``): the program would fail on other sizes, so refuse with the derived Dim
        that says it (``dx = k*_dx``, ``dx = 3*_dx - 1``); dims related to it are then spelled in ``_dx``."""
        residues = {(k, -c % k) for guarded, k, c in tc.divisibility_guards(self.shape_env) if guarded == symbol}
        if not residues:
            return False
        if all(r == 0 for _, r in residues):
            k, shift = math.lcm(*(k for k, _ in residues)), 0
        elif len(residues) == 1:
            ((k, r),) = residues
            shift = k - r  # symbol = k*_d - shift
        else:  # several residues: the range the trace narrowed is what the fixes say
            return False
        traced, root = tc.symbol_range(self.shape_env, symbol), f"_{d.name}"
        lower, upper = max(d.lower, int(traced.lower)), min(d.upper, traced.upper)
        upper_root = (upper + shift) // k if upper < tc.INT_OO else upper
        violations.fix(_dim_fix(root, -(-(lower + shift) // k), upper_root, 1 if shift == 0 else 0))
        spelled = k * sympy.Symbol(root) - shift
        self._respelled[symbol] = spelled
        line = f"must always be divisible by {k}" if shift == 0 else f"must always satisfy ({d.name} + {shift}) % {k} == 0"
        violations.add(d.name, f"Not all values of {d.name} satisfy the generated guard: the values of {d.name} "
                               f"({d.where}) {line}", f"{d.name} = {spelled}", first=True)
        return True

    def _undeclared_relation(self, d: _DeclaredDim, expr: Any, violations: _Violations) -> None:
        """A named Dim the model made an expression of other dims: say which derived Dim to declare."""
        declared: dict[Any, _DeclaredDim] = {}  # symbol -> the first Dim declared with it (the one the fixes keep)
        for o in self._declared.values():
            if _expr(o.size).is_symbol:
                declared.setdefault(_expr(o.size), o)
        names = {symbol: o.name for symbol, o in declared.items()}
        new_roots = sorted((s for s in expr.free_symbols if s not in names), key=str)
        for i, symbol in enumerate(new_roots):  # a divisibility (3*s) introduces a root of its own
            names[symbol] = f"_{d.name}" if len(new_roots) == 1 else f"_{d.name}_{i}"
            traced = tc.symbol_range(self.shape_env, symbol)
            violations.fix(_dim_fix(names[symbol], int(traced.lower), traced.upper, 0))
        spelled = expr.subs({s: self._respelled.get(s, sympy.Symbol(names[s])) for s in expr.free_symbols})
        others = ", ".join(sorted(_spelled_with_input(declared[s]) if s in declared else names[s]
                                  for s in expr.free_symbols))
        violations.add(d.name, f"The values of {d.name} = {d.torch_name('L')} ({d.where}) must always be related to "
                               f"the values of {others} by {d.name} = {spelled}", f"{d.name} = {spelled}")


class _Violations:
    """What the trace did to the declared Dims, gathered into one error in torch.export's words and
    format (``Suggested fixes:`` lines that ``refine_dynamic_shapes_from_suggested_fixes`` reads)."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.lines: list[str] = []
        self.fixes: list[str] = []
        self.forced: dict[str, str] = {}  # name -> line: a Dim the trace allows one size of

    def specialisation(self, name: str, line: str, fix: str) -> None:
        self.forced[name] = f"  - {line}"
        self.fix(fix)

    def add(self, name: str, line: str, fix: str | None, *, first: bool = False) -> None:
        """``first``: a shape the model needs (a divisibility) is listed before the ranges it narrows,
        as torch.export lists them."""
        at = 0 if first else len(self.lines)
        self.names.insert(at, name)
        self.lines.insert(at, f"  - {line}")
        if fix is not None:
            self.fix(fix)

    def fix(self, fix: str) -> None:
        if fix not in self.fixes:
            self.fixes.append(fix)

    def specialised(self, name: str, where: str, expr: Any, *, fix: bool) -> None:
        """torch.export's line (its words, which users and tests match), then ours: where it is."""
        place = "" if name == where else f" ({where})"
        self.add(name, f"You marked {name} as dynamic but your code specialized it to be a constant "
                       f"({int(expr)}){place}. If you're using Dim.DYNAMIC, replace it with either Dim.STATIC "
                       "or Dim.AUTO; else make the dim static or remove the code that fixes it",
                 f"{name} = {int(expr)}" if fix else None)

    def raise_if_any(self) -> None:
        if not self.lines and not self.forced:
            return
        sections = []
        if self.lines:
            sections.append(f"Constraints violated ({', '.join(dict.fromkeys(self.names))})!\n" + "\n".join(self.lines))
        if self.forced:
            sections.append(f"Specializations unexpectedly required ({', '.join(self.forced)})!\n"
                            + "\n".join(self.forced.values()))
        fixes = "\nSuggested fixes:\n" + "\n".join(f"  {f}" for f in self.fixes) if self.fixes else ""
        raise DynamicShapesError("\n".join(sections) + fixes, kind=Refusal.DIM_NOT_DYNAMIC)


def _dim_fix(name: str, lower: int, upper: Any, declared_lower: int) -> str:
    """``name = Dim('name', min=.., max=..)``, leaving out what torch's default already says."""
    bounds = ([f"min={lower}"] if lower > 2 or declared_lower > 0 else []) + \
        ([f"max={upper}"] if upper < tc.INT_OO else [])
    return f"{name} = Dim({', '.join([repr(name), *bounds])})"


def _spelled_with_input(d: _DeclaredDim) -> str:
    return f"{d.name} = {d.torch_name('L')} ({d.where})"


def _is_derived_dim_form(expr: Any) -> bool:
    """``a*r + b`` of one symbol, the form a derived Dim can declare (a divisibility's new root too)."""
    if len(expr.free_symbols) != 1:
        return False
    (symbol,) = expr.free_symbols
    return bool(sympy.Poly(expr, symbol).degree() == 1) if expr.is_polynomial(symbol) else False


def _traced_lower(lower: int, example: int) -> int:
    """The least size the trace assumes: 2 (torch generalises 0 and 1), unless the example itself is
    0 or 1 and still symbolic (torch's ``backed_size_oblivious``): then the declared minimum."""
    return max(2, lower) if example >= 2 else lower


def _readable_dim(name: str, lower: int, upper: Any) -> str:
    """``Dim('C', min=3)`` as torch.export writes a Dim, bounds at their defaults left out."""
    bounds = ([f"min={lower}"] if lower != 0 else []) + ([f"max={upper}"] if upper != tc.INT_OO else [])
    return f"Dim({', '.join([repr(name), *bounds])})"


def _torch_name(source: str, index: int | None, style: str) -> str:
    """An input as torch.export's messages name it: ``L['x'].size()[0]`` (constraint violations,
    ``style="L"``) or ``inputs['x'].shape[0]`` (conflicts with a Dim hint's bounds)."""
    if style == "L":
        return f"L{source}" + ("" if index is None else f".size()[{index}]")
    return f"inputs{source}" + ("" if index is None else f".shape[{index}]")


def _bound(hint: Any, end: str) -> Any:
    return getattr(hint, end, None)


def _range_conflict(hint: Any, traced: Any, source: str, index: int | None, where: str) -> str:
    return (f"- Received user-specified min/max range of [{_bound(hint, 'min')}, {_bound(hint, 'max')}], "
            f"conflicting with the inferred min/max range of [{traced.lower}, {traced.upper}], "
            f"for {_torch_name(source, index, 'inputs')} ({where})")


def _expr(size: Any) -> Any:
    """The sympy expression of a size (an int where torch specialised it)."""
    return size.node.expr if isinstance(size, torch.SymInt) else sympy.Integer(size)


def _is_named_dim(dim: Any) -> bool:
    return hasattr(dim, "__name__") and hasattr(dim, "min") and hasattr(dim, "max")


def _is_derived_dim(dim: Any) -> bool:
    """``dx + 1``, ``2 * dx``: a Dim that is a function of another (its root)."""
    return hasattr(dim, "root") and hasattr(dim, "fn")


def _is_static_hint(dim: Any) -> bool:
    return dim is None or isinstance(dim, int) or str(getattr(dim, "type", "")).endswith("STATIC")


def _separate_alias(t: torch.Tensor) -> torch.Tensor:
    """A new tensor object over ``t``'s storage, for a user input that is the model's own
    parameter or buffer (``model(x, model.weight)``). Faked as the same object, the input
    and the state were one fake, and the graph read the input wherever ``forward`` read the
    state: called with any other tensor, the program computed with it in place of the
    weight (torch.export's program does, silently). Its own fake shares the state's fake
    storage, so a write through either is refused as a write to inputs that alias."""
    with torch.inference_mode(False):  # the caller's inference_mode would make it an inference tensor
        return t.detach().requires_grad_(t.requires_grad)
