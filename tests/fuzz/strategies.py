"""Hypothesis strategies for straight-line programs that run in eager.

:func:`programs` draws a :class:`~fuzz.program.Program` one statement at a
time while running each statement on real tensors (the *shadow*), so every
choice sees true shapes, dtypes, strides, aliasing and autograd state:

* a statement is only offered where it is valid by construction (no write to
  an expanded tensor, none to a leaf that requires grad or its views while
  grad mode is on, shapes that broadcast);
* a statement that still raises in the shadow is dropped, so every program
  that comes out runs in eager as written.

Shrinking works on the draws: fewer statements, earlier tensors (inputs
first), smaller shapes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import types
from collections.abc import Callable

import torch
from hypothesis import strategies as st

from .program import Program, Stmt, TensorInput

SCALARS = (0.5, 1.5, -2.0, 3.0)
INT_SCALARS = (2, -1, 3)
UNARY = ("sin", "cos", "tanh", "sigmoid", "relu", "neg", "abs", "clone")
REGION_HEADERS = (
    ("torch.no_grad()", "region:no_grad"),
    ("torch.enable_grad()", "region:enable_grad"),
    ("torch.set_grad_enabled(False)", "region:set_grad_enabled"),
    ("torch.set_grad_enabled(True)", "region:set_grad_enabled"),
    ('torch.autocast("cpu", dtype=torch.bfloat16)', "region:autocast"),
    ('torch.autocast("cpu", enabled=False)', "region:autocast"),
)


@dataclasses.dataclass(frozen=True)
class FuzzConfig:
    max_inputs: int = 3
    max_statements: int = 12
    max_rank: int = 3
    max_size: int = 4
    regions: bool = False
    max_region_depth: int = 2
    hops: bool = False  # torch.cond / while_loop / scan and custom autograd Functions
    state: bool = True  # .data, augmented assignment on state, view(dtype), whole copies into inputs
    # training steps are the point (``--joint``): the parameter ``w`` is always there and a value
    # that carries a gradient, where one does, is returned (else most programs cannot train)
    trains: bool = False


def programs(config: FuzzConfig = FuzzConfig()) -> st.SearchStrategy[Program]:
    return _programs(config)


@st.composite
def _programs(draw, config: FuzzConfig) -> Program:
    grad_before = torch.is_grad_enabled()
    builder = _Builder(draw, config)
    try:
        return builder.build()
    finally:
        builder.close_shadow_contexts()
        torch.set_grad_enabled(grad_before)


class _Builder:
    """Draws statements against a shadow environment of real tensors."""

    def __init__(self, draw, config: FuzzConfig):
        self.draw = draw
        self.config = config
        self.shadow_self = types.SimpleNamespace()
        self.ns: dict = {"torch": torch, "self": self.shadow_self}
        self.names: list[str] = []
        self.roots: dict[str, str] = {}  # input/buffer name -> "input" | "buffer"
        self.body: list[Stmt] = []
        self.open_contexts: list[tuple[contextlib.AbstractContextManager, int]] = []
        self.counter = 0
        self.detached: set[str] = set()  # detach() results and their aliases
        self.composite_aliases: set[str] = set()  # composite results that alias a tensor
        self.return_tags: tuple[str, ...] = ()
        self.cut_view_uses: list[str] = []  # results of cut_view_use, always returned

    # --- the shadow -----------------------------------------------------------------

    def value(self, name: str) -> torch.Tensor:
        return getattr(self.shadow_self, name[5:]) if name.startswith("self.") else self.ns[name]

    def close_shadow_contexts(self) -> None:
        while self.open_contexts:
            ctx, _ = self.open_contexts.pop()
            ctx.__exit__(None, None, None)

    def run(self, code: str) -> bool:
        try:
            exec(code, self.ns)
        except Exception:
            return False
        return True

    # --- drawing helpers ------------------------------------------------------------

    def pick(self, pred: Callable[[torch.Tensor], bool] = lambda t: True) -> str | None:
        names = [n for n in self.names if pred(self.value(n))]
        return self.draw(st.sampled_from(names)) if names else None

    def pick_target(self, pred: Callable[[torch.Tensor], bool] = lambda t: True) -> str | None:
        """A tensor an in-place op may write to."""
        names = [n for n in self.names if writable(self.value(n)) and pred(self.value(n))
                 and not writes_through_grad_alias(self, self.value(n))]
        return self.draw(st.sampled_from(names)) if names else None

    def one_of(self, values):
        return self.draw(st.sampled_from(values))

    def scalar_for(self, name: str):
        """A scalar an op on ``name`` accepts in place: an int one for an integer tensor."""
        return self.one_of(SCALARS if self.value(name).is_floating_point() else INT_SCALARS)

    def draw_shape(self) -> tuple[int, ...]:
        rank = self.draw(st.integers(1, self.config.max_rank))
        return tuple(self.draw(st.integers(1, self.config.max_size)) for _ in range(rank))

    # --- the program ----------------------------------------------------------------

    def build(self) -> Program:
        seed = self.draw(st.integers(0, 2**16))
        grad_inputs = self.draw(st.booleans())
        base = self.draw_shape()
        inputs = []
        for i in range(self.draw(st.integers(1, self.config.max_inputs))):
            shape = self.one_of([base, base[1:] or base, "fresh"])
            shape = self.draw_shape() if shape == "fresh" else shape
            dtype = self.one_of(["float32", "float32", "float64", "int64", "int32", "bool"])
            grad = grad_inputs and dtype.startswith("float")
            inputs.append(TensorInput(f"x{i}", shape, dtype, requires_grad=grad))
        state = {}  # buffer and parameter, made in this order from one generator, as the source does
        for name, kind in (("buf", "buffer"), ("w", "parameter")):
            if self.draw(st.booleans()) or (self.config.trains and kind == "parameter"):
                shape = self.one_of([base, "fresh"])
                state[name] = (kind, TensorInput(name, self.draw_shape() if shape == "fresh" else shape))
        gen = torch.Generator().manual_seed(seed)
        for spec in inputs:
            self.ns[spec.name] = eval(spec.constructor("gen"), {"torch": torch, "gen": gen})
            self.names.append(spec.name)
            self.roots[spec.name] = "input"
        gen_state = torch.Generator().manual_seed(seed + 1)
        for name, (kind, spec) in state.items():
            value = eval(spec.constructor("gen"), {"torch": torch, "gen": gen_state})
            setattr(self.shadow_self, name, torch.nn.Parameter(value) if kind == "parameter" else value)
            self.names.append(f"self.{name}")
            self.roots[f"self.{name}"] = kind
        buffer = state["buf"][1] if "buf" in state else None
        param = state["w"][1] if "w" in state else None

        for _ in range(self.draw(st.integers(0, self.config.max_statements))):
            self.step()
        while self.open_contexts:
            self.close_region()
        if not torch.is_grad_enabled():
            self.emit("torch.set_grad_enabled(True)", ("region:set_grad_enabled_call",))
        returns = self.draw_returns()
        return Program(tuple(inputs), buffer, tuple(self.body), returns, seed, self.return_tags, param)

    def draw_returns(self) -> tuple[str, ...]:
        count = self.draw(st.integers(1, 3))
        returns = tuple(self.one_of(self.names[::-1]) for _ in range(count))
        returns += tuple(n for n in self.cut_view_uses if n not in returns)  # their gradients are the point
        if self.config.trains and not any(self._carries_grad(n) for n in returns):
            carriers = [n for n in self.names[::-1] if self._carries_grad(n)]
            if carriers:
                returns = (self.one_of(carriers), *returns)
        for name in returns:
            kind = self.classify(name)
            self.return_tags += (f"returns:{kind}",)
        return returns

    def _carries_grad(self, name: str) -> bool:
        value = self.value(name)
        return isinstance(value, torch.Tensor) and value.is_floating_point() and value.requires_grad

    def step(self) -> None:
        actions = ["pure", "view", "composite", "inplace", "inplace"]
        if self.config.state:
            actions += ["state", "state"]
        if self.config.regions:
            if len(self.open_contexts) < self.config.max_region_depth:
                actions.append("open_region")
                actions.append("grad_call")
            if self.open_contexts:
                actions.append("close_region")
            elif torch.is_grad_enabled():
                actions.append("cut_view")
        if self.config.hops:
            actions.append("hop")
        action = self.one_of(actions)
        if action == "hop":
            from .hop_strategies import HOP_GENERATORS
            self.one_of(HOP_GENERATORS)(self)
        elif action == "open_region":
            self.open_region()
        elif action == "close_region":
            self.close_region()
        elif action == "cut_view":
            self.cut_view_use()
        elif action == "grad_call":
            flag = self.draw(st.booleans())
            self.emit(f"torch.set_grad_enabled({flag})", ("region:set_grad_enabled_call",))
        elif action == "state":
            made = GENERATORS["state"][self.one_of(range(len(GENERATORS["state"])))](self)
            if made is not None:
                code, tags = made
                if code.startswith("v = "):
                    self.bind_named(code, tags)
                else:
                    self.emit(code, ("state",) + tags)
        elif action == "inplace":
            made = GENERATORS["inplace"][self.one_of(range(len(GENERATORS["inplace"])))](self)
            if made is not None:
                target, code = made
                tags = ("inplace", f"inplace:{self.classify(target)}")
                if "out=" in code:
                    tags += ("inplace:out_variant",)
                if target in self.composite_aliases:
                    tags += ("inplace:through_composite_alias",)
                self.emit(code, tags)
        else:
            made = GENERATORS[action][self.one_of(range(len(GENERATORS[action])))](self)
            if made is not None:
                self.bind(action, made)

    def bind(self, action: str, made: str | Multi) -> None:
        """Emit ``name = expr`` (or ``a, b = expr`` for a :class:`Multi`) and record the names."""
        expr, count = (made.expr, made.count) if isinstance(made, Multi) else (made, 1)
        names = [f"v{self.counter + i}" for i in range(count)]
        if action == "composite":
            tags = (action, f"{action}:{_op_name(expr)}")
        elif action == "view":
            tags = (action, f"view:{_view_kind(expr)}") + (("view:multi_output",) if count > 1 else ())
        else:
            tags = (action,)
        if not self.emit(f"{', '.join(names)} = {expr}", tags):
            return
        self.counter += count
        for name in names:
            self.names.append(name)
            if action == "composite" and self.aliases_earlier(name):
                self.composite_aliases.add(name)
            if self.is_detached_alias(expr, self.value(name)):
                self.detached.add(name)

    def bind_named(self, code: str, tags: tuple[str, ...]) -> None:
        """Emit ``vN = expr`` drawn by a state generator (``.data``, ``view(dtype)``)."""
        name = f"v{self.counter}"
        code = name + code[code.index(" = "):]
        if not self.emit(code, ("state",) + tags):
            return
        self.counter += 1
        self.names.append(name)
        if self.is_detached_alias(code, self.value(name)):
            self.detached.add(name)

    def aliases_earlier(self, name: str) -> bool:
        storage = self.value(name).untyped_storage().data_ptr()
        return any(self.value(n).untyped_storage().data_ptr() == storage for n in self.names if n != name)

    def is_detached_alias(self, expr: str, value: torch.Tensor) -> bool:
        if ".detach()" in expr or ".data" in expr or ".view(torch." in expr:
            return True  # aliases autograd does not see
        storage = value.untyped_storage().data_ptr()
        return any(self.value(d).untyped_storage().data_ptr() == storage for d in self.detached)

    def operands_allowed(self, target: str) -> bool:
        """Whether an in-place op on ``target`` may read tensors: the exporter refuses a
        value that may require grad written through a detach()-ed alias."""
        return target not in self.detached

    @property
    def indent(self) -> int:
        return len(self.open_contexts)

    def emit(self, code: str, tags: tuple[str, ...]) -> bool:
        if not self.run(code):
            return False
        self.body.append(Stmt(code, tags, self.indent))
        return True

    def open_region(self) -> None:
        header, tag = self.one_of(REGION_HEADERS)
        ctx = eval(header, {"torch": torch})
        ctx.__enter__()
        self.body.append(Stmt(f"with {header}:", (tag,), self.indent))
        self.open_contexts.append((ctx, len(self.body)))

    def close_region(self) -> None:
        ctx, body_start = self.open_contexts.pop()
        ctx.__exit__(None, None, None)
        if len(self.body) == body_start:
            self.body.append(Stmt("pass", (), self.indent + 1))

    def cut_view_use(self) -> None:
        """A tensor written in place, viewed under a grad-off region, the view then read with
        grad on (issue 39: the view carries no autograd history in eager; a program that
        rebuilt it with grad on sent gradient through it)."""
        source = (self.pick(lambda t: is_float(t) and t.dim() >= 1 and t.requires_grad)
                  or self.pick(lambda t: is_float(t) and t.dim() >= 1))
        if source is None:
            return
        self.bind("pure", f"{source} * 1.5")  # an activation: it has autograd history where source has
        target = self.names[-1]
        t = self.value(target)
        write = self.one_of([f"{target}.mul_(1.5)", f"{target}.relu_()", f"{target}[..., :1] = 0.5",
                             f"{target}.copy_({target} * 2)"])
        if not self.emit(write, ("inplace", f"inplace:{self.classify(target)}")):
            return
        views = [f"{target}[..., :1]", f"{target}.unsqueeze(0)", f"{target}.narrow(-1, 0, 1)",
                 f"{target}.expand(2, *{target}.shape)", f"{target}.view(-1)"]
        if t.dim() >= 2:
            views += [f"{target}.mT", f"{target}.transpose(0, -1)", f"{target}[0]"]
        header, tag = self.one_of([("torch.no_grad()", "region:no_grad"),
                                   ("torch.set_grad_enabled(False)", "region:set_grad_enabled")])
        name, view_code = f"v{self.counter}", self.one_of(views)
        with eval(header, {"torch": torch}):
            if not self.run(f"{name} = {view_code}"):
                return
        self.body.append(Stmt(f"with {header}:", (tag, "cut_view"), self.indent))
        self.body.append(Stmt(f"{name} = {view_code}", ("view", f"view:{_view_kind(view_code)}"), self.indent + 1))
        self.counter += 1
        self.names.append(name)
        consumers = [f"{name} * 2.0", f"torch.softmax({name}, -1)", f"torch.cat([{name}, {name}])", f"{name}.sum()",
                     f"torch.matmul({name}.reshape(1, -1), {name}.reshape(-1, 1))",
                     f"torch.einsum('...i,...i->...', {name}, {name})"]
        # a kept composite whose other operand carries the gradient (the issue's `h @ target.T`)
        if self.value(name).dim() >= 2:
            consumers += [f"torch.matmul({name}, {name}.mT)",
                          f"({source}.sum() * torch.ones(1, {name}.shape[-2])) @ {name}"]
        else:
            consumers.append(f"torch.matmul({source}.sum() * torch.ones_like({name}), {name})")
        other = self.pick(lambda o: is_float(o) and o.requires_grad and broadcasts_to(o, self.value(name).shape))
        if other is not None:
            consumers.append(f"{name} * {other}")
        count = self.counter
        self.bind("pure", self.one_of(consumers))
        if self.counter > count:
            self.cut_view_uses.append(self.names[-1])

    def classify(self, name: str) -> str:
        """What an in-place target is: an input, a buffer, a view of one, or an intermediate."""
        t = self.value(name)
        if name in self.roots:
            return self.roots[name]
        storage = t.untyped_storage().data_ptr()
        for root, kind in self.roots.items():
            if self.value(root).untyped_storage().data_ptr() == storage:
                return f"{kind}_view"
        return "intermediate_view" if t._base is not None else "intermediate"


@dataclasses.dataclass(frozen=True)
class Multi:
    """An expression giving ``count`` tensors, bound to as many names (``a, b = x.chunk(2)``)."""

    expr: str
    count: int


def _view_kind(expr: str) -> str:
    """``x0.split(2, 1)[0]`` -> ``split``; ``x0[1::2]`` -> ``slice``."""
    if expr.endswith("[...]"):
        return "ellipsis"
    head = expr.split("(", 1)[0]
    if "[" in head:
        return "slice"
    return head.rsplit(".", 1)[-1]


def _op_name(expr: str) -> str:
    """``x0.type_as(v1)`` -> ``type_as``; ``torch.einsum(...)`` -> ``einsum``."""
    head = expr.split("(", 1)[0]
    return head.rsplit(".", 1)[-1]


# --- predicates ---------------------------------------------------------------------


def is_float(t: torch.Tensor) -> bool:
    return t.is_floating_point()


def is_numeric(t: torch.Tensor) -> bool:
    """Float or integer (comparisons make bool tensors, which arithmetic refuses)."""
    return t.dtype != torch.bool


def writable(t: torch.Tensor) -> bool:
    """Writable in eager with a defined result: numeric, and no two elements in one memory
    location (an expanded dim, an overlapping as_strided window: eager's result would
    depend on its loop order). A grad leaf or a view of one under grad mode is excluded
    by :func:`writes_through_grad_alias`."""
    return is_numeric(t) and not overlaps_itself(t)


def overlaps_itself(t: torch.Tensor) -> bool:
    offsets = torch.zeros((), dtype=torch.long)
    for d, (size, stride) in enumerate(zip(t.shape, t.stride())):
        shape = [1] * t.dim()
        shape[d] = size
        offsets = offsets + (torch.arange(size) * stride).view(shape)
    return offsets.numel() != offsets.flatten().unique().numel()


def writes_through_grad_alias(b: _Builder, t: torch.Tensor) -> bool:
    """A write eager refuses: to a leaf that requires grad, or a view of one, under grad mode
    (a write through ``detach()`` is allowed, and stays in)."""
    if not torch.is_grad_enabled() or not t.requires_grad:
        return False
    base = t._base if t._base is not None else t
    return base.is_leaf


def broadcasts_to(src: torch.Tensor, shape: torch.Size) -> bool:
    try:
        return torch.broadcast_shapes(src.shape, shape) == shape
    except RuntimeError:
        return False


def shape_str(shape) -> str:
    """Sizes as call arguments: ``(2, 3)``; the empty shape as ``(())``."""
    return f"({', '.join(map(str, shape))})" if len(shape) else "(())"


def divisors(n: int) -> list[int]:
    return [d for d in range(2, n + 1) if n % d == 0]


def draw_shape_with_numel(b: _Builder, n: int) -> tuple[int, ...]:
    dims = []
    while n > 1 and len(dims) < 3 and b.draw(st.booleans()):
        d = b.one_of(divisors(n))
        dims.append(d)
        n //= d
    dims.append(n)
    return tuple(b.draw(st.permutations(dims)))


# --- pure ops: new tensors ---------------------------------------------------------------


def gen_unary(b: _Builder):
    a = b.pick(is_numeric)
    if a is None:
        return None
    form = b.one_of(["method", "scalar"])
    if form == "method":
        return f"{a}.{b.one_of(UNARY)}()"
    return f"{a} {b.one_of(['+', '*', '-'])} {b.one_of(SCALARS + INT_SCALARS)}"


def gen_binary(b: _Builder):
    a = b.pick(is_numeric)
    if a is None:
        return None
    ta = b.value(a)
    other = b.pick(lambda t: is_numeric(t) and _broadcastable(t.shape, ta.shape))
    if other is None:
        return None
    form = b.one_of(["+", "-", "*", "maximum", "where"])
    if form == "maximum":
        return f"torch.maximum({a}, {other})"
    if form == "where":
        return f"torch.where({a} > 0, {a}, {other})"
    return f"{a} {form} {other}"


def _broadcastable(s1, s2) -> bool:
    try:
        torch.broadcast_shapes(s1, s2)
        return True
    except RuntimeError:
        return False


def gen_reduction(b: _Builder):
    a = b.pick(lambda t: is_numeric(t) and t.dim() >= 1)
    if a is None:
        return None
    dim = b.draw(st.integers(-b.value(a).dim(), b.value(a).dim() - 1))
    fn = b.one_of(["sum", "mean", "amax"])
    keep = b.draw(st.booleans())
    return f"{a}.{fn}({dim}{', keepdim=True' if keep else ''})"


def gen_matmul(b: _Builder):
    a = b.pick(lambda t: is_float(t) and t.dim() in (2, 3))
    if a is None:
        return None
    k = b.value(a).shape[-1]
    form = b.one_of(["matmul", "linear"])
    if form == "matmul":
        w = b.pick(lambda t: is_float(t) and t.dim() == 2 and t.shape[0] == k)
        return None if w is None else f"{a} @ {w}"
    w = b.pick(lambda t: is_float(t) and t.dim() == 2 and t.shape[1] == k)
    return None if w is None else f"torch.nn.functional.linear({a}, {w})"


def gen_cat(b: _Builder):
    a = b.pick(lambda t: is_float(t) and t.dim() >= 1)
    if a is None:
        return None
    ta = b.value(a)
    dim = b.draw(st.integers(0, ta.dim() - 1))
    other = b.pick(lambda t: is_float(t) and t.dim() == ta.dim()
                   and all(x == y for i, (x, y) in enumerate(zip(t.shape, ta.shape)) if i != dim))
    return None if other is None else f"torch.cat([{a}, {other}], dim={dim})"


def gen_factory(b: _Builder):
    """Constants, and random draws (the program must draw from eager's RNG stream in
    eager's order, also inside regions whose results go unused)."""
    a = b.pick(is_float)
    if a is None or b.draw(st.booleans()):
        return f"torch.{b.one_of(['zeros', 'ones', 'randn', 'rand'])}{shape_str(b.draw_shape())}"
    return f"torch.{b.one_of(['zeros_like', 'ones_like', 'rand_like', 'randn_like'])}({a})"


def gen_compare(b: _Builder):
    a = b.pick(is_float)
    return None if a is None else f"{a} > {b.one_of([0.0, 0.5])}"


# --- views --------------------------------------------------------------------------------


def gen_view(b: _Builder):
    a = b.pick(lambda t: t.dim() >= 1)
    if a is None:
        return None
    t = b.value(a)
    nd = t.dim()
    choices = ["unsqueeze", "slice", "detach", "getitem_ellipsis", "expand"]
    if t.numel() > 0:
        choices.append("select")
    if nd >= 2:
        choices += ["transpose", "permute", "diagonal"]
    if nd == 2:
        choices.append("t")
    if 1 in t.shape:
        choices.append("squeeze")
    if t.is_contiguous():
        choices += ["view", "view_flat"]
    if t.numel() > 0:
        choices += ["split", "chunk", "unbind", "split_with_sizes", "as_strided"]
    kind = b.one_of(choices)
    dim = lambda: b.draw(st.integers(-nd, nd - 1))  # noqa: E731
    if kind == "unsqueeze":
        return f"{a}.unsqueeze({b.draw(st.integers(-nd - 1, nd))})"
    if kind == "select":
        d = dim()
        return f"{a}.select({d}, {b.draw(st.integers(-t.shape[d], t.shape[d] - 1))})"
    if kind == "slice":
        d = b.draw(st.integers(0, nd - 1))
        start = b.draw(st.integers(0, t.shape[d]))
        step = b.one_of([1, 2])
        index = ", ".join([":"] * d + [f"{start}::{step}"])
        return f"{a}[{index}]"
    if kind == "detach":
        return f"{a}.detach()"
    if kind == "getitem_ellipsis":
        return f"{a}[...]"
    if kind == "expand":
        sizes = [b.one_of([s, 3]) if s == 1 else s for s in t.shape]
        if b.draw(st.booleans()):
            sizes = [2] + sizes
        return f"{a}.expand{shape_str(sizes)}"
    if kind == "transpose":
        return f"{a}.transpose({dim()}, {dim()})"
    if kind == "permute":
        return f"{a}.permute{shape_str(b.draw(st.permutations(range(nd))))}"
    if kind == "diagonal":
        return f"{a}.diagonal()"
    if kind == "t":
        return f"{a}.t()"
    if kind == "squeeze":
        return f"{a}.squeeze({t.shape.index(1)})"
    if kind == "view":
        return f"{a}.view{shape_str(draw_shape_with_numel(b, t.numel()))}"
    if kind in ("split", "chunk", "unbind", "split_with_sizes"):
        return _multi_output_view(b, a, t, kind)
    if kind == "as_strided":
        return _as_strided(b, a, t)
    return f"{a}.view(-1)"


def _multi_output_view(b: _Builder, a: str, t: torch.Tensor, kind: str):
    """One piece (``x.split(2, 1)[0]``) or every piece (``v3, v4 = x.chunk(2, 1)``)."""
    d = b.draw(st.integers(0, t.dim() - 1))
    n = t.shape[d]
    if kind == "split":
        expr = f"{a}.split({b.draw(st.integers(1, max(n, 1)))}, {d})"
    elif kind == "chunk":
        expr = f"{a}.chunk({b.draw(st.integers(1, 3))}, {d})"
    elif kind == "unbind":
        expr = f"{a}.unbind({d})"
    else:
        first = b.draw(st.integers(0, n))
        expr = f"torch.split({a}, [{first}, {n - first}], {d})"
    try:
        pieces = len(eval(expr, b.ns))
    except Exception:
        return None
    if pieces == 0:
        return None
    if 2 <= pieces <= 3 and b.draw(st.booleans()):
        return Multi(expr, pieces)
    return f"{expr}[{b.draw(st.integers(0, pieces - 1))}]"


def _as_strided(b: _Builder, a: str, t: torch.Tensor):
    """A read-mostly window into ``a``'s storage, inside what ``a`` itself spans."""
    if not t.is_contiguous():
        return None
    rank = b.draw(st.integers(1, 2))
    size = [b.draw(st.integers(1, 3)) for _ in range(rank)]
    stride = [b.draw(st.integers(0, 3)) for _ in range(rank)]
    span = sum((s - 1) * st_ for s, st_ in zip(size, stride)) + 1
    if span > t.numel():
        return None
    offset = t.storage_offset() + b.draw(st.integers(0, t.numel() - span))
    return f"{a}.as_strided({shape_str(size)}, {shape_str(stride)}, {offset})"


# --- composites that may return their input ------------------------------------------------


def gen_composite(b: _Builder):
    a = b.pick()
    if a is None:
        return None
    t = b.value(a)
    nd = t.dim()
    choices = ["type_as", "to_dtype", "to_other", "float", "double", "contiguous", "reshape",
               "reshape_flat", "flatten", "sum_to_size", "expand_as", "reshape_as", "view_as",
               "cpu", "to_device", "to_same_dtype"]
    if 2 <= nd <= 3:
        choices.append("einsum")
    kind = b.one_of(choices)
    if kind == "type_as":
        return f"{a}.type_as({b.pick(is_float) or a})"
    if kind == "to_dtype":
        return f"{a}.to(torch.{b.one_of(['float32', 'float64'])})"
    if kind == "to_other":
        return f"{a}.to({b.pick(is_float) or a})"
    if kind in ("float", "double", "contiguous", "cpu"):
        return f"{a}.{kind}()"
    if kind == "to_device":
        return f'{a}.to("cpu")'
    if kind == "to_same_dtype":
        return f"{a}.to({_dtype(t)})"
    if kind == "reshape":
        return f"{a}.reshape{shape_str(draw_shape_with_numel(b, t.numel()))}"
    if kind == "reshape_flat":
        return f"{a}.reshape(-1)"
    if kind == "flatten":
        if nd >= 2 and b.draw(st.booleans()):
            return f"{a}.flatten({b.draw(st.integers(0, nd - 2))})"
        return f"{a}.flatten()"
    if kind == "sum_to_size":
        if not is_numeric(t):
            return None
        target = [b.one_of([s, 1]) for s in t.shape]
        if b.draw(st.booleans()):
            target = list(t.shape)
        while target and target[0] == 1 and b.draw(st.booleans()):
            target = target[1:]
        return f"{a}.sum_to_size{shape_str(target)}"
    if kind == "expand_as":
        other = b.pick(lambda o: broadcasts_to(t, o.shape))
        return None if other is None else f"{a}.expand_as({other})"
    if kind in ("reshape_as", "view_as"):
        other = b.pick(lambda o: o.numel() == t.numel())
        if kind == "view_as" and other is not None and b.value(other).shape != t.shape and not t.is_contiguous():
            return None
        return None if other is None else f"{a}.{kind}({other})"
    letters = "ijk"[:nd]
    perm = "".join(b.draw(st.permutations(letters)))
    return f'torch.einsum("{letters}->{perm}", {a})'


# --- in-place ops: (target, statement) --------------------------------------------------------


def _operand(b: _Builder, name: str) -> str:
    """A scalar, or a numeric tensor that broadcasts to the target ``name``."""
    target = b.value(name)
    other = None
    if b.operands_allowed(name) and b.draw(st.booleans()):
        other = b.pick(lambda o: is_numeric(o) and broadcasts_to(o, target.shape) and disjoint_or_same(o, target))
    return other if other is not None else str(b.scalar_for(name))


def disjoint_or_same(o: torch.Tensor, target: torch.Tensor) -> bool:
    """An operand overlapping its target makes eager's result depend on the loop order."""
    return o is target or o.untyped_storage().data_ptr() != target.untyped_storage().data_ptr()


def gen_binary_inplace(b: _Builder):
    t = b.pick_target()
    if t is None:
        return None
    op = b.one_of(["add_", "mul_", "sub_"])
    return t, f"{t}.{op}({_operand(b, t)})"


def gen_unary_inplace(b: _Builder):
    t = b.pick_target()
    if t is None:
        return None
    kind = b.one_of(["zero_", "clamp_", "sin_"])
    if kind == "clamp_":
        bounds = "min=-0.5, max=0.5" if b.value(t).is_floating_point() else "min=-1, max=2"
        return t, f"{t}.clamp_({bounds})"
    return t, f"{t}.{kind}()"


def gen_copy(b: _Builder):
    t = b.pick_target()
    if t is None or not b.operands_allowed(t):
        return None
    tv = b.value(t)
    # a source sharing memory with the target makes eager's result depend on its copy order
    src = b.pick(lambda o: broadcasts_to(o, tv.shape)
                 and o.untyped_storage().data_ptr() != tv.untyped_storage().data_ptr())
    return None if src is None else (t, f"{t}.copy_({src})")


def gen_masked_fill(b: _Builder):
    t = b.pick_target()
    if t is None:
        return None
    shape = b.value(t).shape
    m = b.pick(lambda o: is_numeric(o) and broadcasts_to(o, shape)) or t
    return t, f"{t}.masked_fill_({m} > 0, {b.scalar_for(t)})"


def gen_index_put(b: _Builder):
    t = b.pick_target(lambda o: o.dim() >= 1 and o.shape[0] > 0)
    if t is None:
        return None
    tv = b.value(t)
    rows = sorted(set(b.draw(st.lists(st.integers(0, tv.shape[0] - 1), min_size=1, max_size=3))))
    index = f"torch.tensor({rows})"
    form = b.one_of(["index_put_", "accumulate", "setitem", "setitem_tensor"])
    if form == "setitem":
        return t, f"{t}[{rows[0]}] = {b.scalar_for(t)}"
    if form == "setitem_tensor" and b.operands_allowed(t):
        # tv[row]'s shape, without indexing: a view of a split's output written in place cannot be
        # made (eager raises), and the generator must not (found by the fuzz_long run)
        src = b.pick(lambda o: is_numeric(o) and broadcasts_to(o, tv.shape[1:])
                     and o.untyped_storage().data_ptr() != tv.untyped_storage().data_ptr())
        return None if src is None else (t, f"{t}[{rows[0]}] = {src}")
    if form == "setitem_tensor":
        return None
    values = f"torch.tensor({b.scalar_for(t)}, dtype=torch.{str(tv.dtype).split('.')[1]})"
    accumulate = ", accumulate=True" if form == "accumulate" else ""
    return t, f"{t}.index_put_(({index},), {values}{accumulate})"


def gen_out(b: _Builder):
    """``torch.add(a, b, out=t)`` and kin: a write to ``t`` through an ``out=`` overload."""
    t = b.pick_target()
    if t is None or not b.operands_allowed(t):
        return None
    tv = b.value(t)
    a = b.pick(lambda o: is_numeric(o) and o.shape == tv.shape and disjoint_or_same(o, tv))
    if a is None:
        return None
    form = b.one_of(["add", "mul", "sin", "clamp", "neg"])
    if form in ("add", "mul"):
        return t, f"torch.{form}({a}, {_operand(b, t)}, out={t})"
    if form == "clamp":
        return t, f"torch.clamp({a}, -1, 2, out={t})"
    return t, f"torch.{form}({a}, out={t})"


# --- state outside the functional view: .data, augmented assignment, view(dtype) -------------


def _dtype(t: torch.Tensor) -> str:
    return f"torch.{str(t.dtype).split('.')[1]}"


def _roots_state(b: _Builder) -> list[str]:
    return [n for n, kind in b.roots.items() if kind in ("buffer", "parameter")]


def gen_augmented_state(b: _Builder):
    """``self.buf += v`` / ``self.w *= s`` (rebinding the attribute to the same tensor): a
    parameter only with grad off (eager refuses it otherwise), else ``self.w.data *= s``."""
    names = [n for n in _roots_state(b) if writable(b.value(n))]
    if not names:
        return None
    t = b.one_of(names)
    op = b.one_of(["+=", "*=", "-="])
    kind = b.roots[t]
    if kind == "parameter" and torch.is_grad_enabled():
        return f"{t}.data {op} {b.scalar_for(t)}", ("state:augmented_param_data",)
    return f"{t} {op} {_operand(b, t)}", (f"state:augmented_{kind}",)


def gen_data_read(b: _Builder):
    a = b.pick(lambda t: True)
    return None if a is None else (f"v = {a}.data", ("state:data_read",))


def gen_data_write_to_a_result(b: _Builder):
    """``v.data.mul_(s)`` on an op's result: eager's backward of an op that saved its result
    (``tanh``, ``sigmoid``, ``relu``) reads the written value (no version bump); found missing
    when such writes were silently wrong."""
    t = b.pick_target(lambda t: t.is_floating_point() and t._base is None)
    if t is None or t in b.roots:
        return None
    return f"{t}.data.mul_({b.scalar_for(t)})", ("state:data_write_result",)


def gen_data_write(b: _Builder):
    """``t.data.copy_(src)`` (a write autograd does not see) or ``t.data = src`` (same shape
    and dtype) on a root; the value written carries no grad."""
    roots = [n for n in b.roots if writable(b.value(n))]
    if not roots:
        return None
    t = b.one_of(roots)
    tv = b.value(t)
    src = b.pick(lambda o: o.shape == tv.shape and o.dtype == tv.dtype and not o.requires_grad
                 and o.untyped_storage().data_ptr() != tv.untyped_storage().data_ptr())
    if src is None:
        return f"{t}.data.mul_({b.scalar_for(t)})", ("state:data_write",)
    how = b.one_of(["copy", "assign_clone", "assign"])
    if how == "copy":
        return f"{t}.data.copy_({src})", ("state:data_write",)
    # `t.data = v` while aliases of t are live, or with v kept and written later, is refused
    # (DATA_ASSIGN_ALIASED): eager's aliases keep the old storage, and t then shares v's
    aliased = any(n != t and b.value(n).untyped_storage().data_ptr() == tv.untyped_storage().data_ptr()
                  for n in b.names)
    tags = ("state:data_assign",) + (("state:data_assign_aliased",) if aliased else ())
    if how == "assign":
        return f"{t}.data = {src}", tags + ("state:data_assign_shared",)
    return f"{t}.data = {src}.clone()", tags


def gen_view_dtype(b: _Builder):
    a = b.pick(lambda t: t.dim() >= 1)
    return None if a is None else (f"v = {a}.view({_dtype(b.value(a))})", ("state:view_dtype",))


def gen_whole_copy_into_input(b: _Builder):
    """``x.copy_(y)`` over the whole of an input; later writes through its aliases follow."""
    inputs = [n for n, kind in b.roots.items() if kind == "input" and writable(b.value(n))
              and not writes_through_grad_alias(b, b.value(n))]
    if not inputs:
        return None
    t = b.one_of(inputs)
    tv = b.value(t)
    src = b.pick(lambda o: is_numeric(o) and o.shape == tv.shape
                 and o.untyped_storage().data_ptr() != tv.untyped_storage().data_ptr())
    return None if src is None else (f"{t}.copy_({src})", ("state:whole_copy_into_input",))


def gen_buffer_new_shape(b: _Builder):
    """``self.buf = ...`` with a value of another shape (the buffer grows or shrinks)."""
    if "self.buf" not in b.roots:
        return None
    t = b.value("self.buf")
    if t.dim() >= 1 and b.draw(st.booleans()):
        return "self.buf = self.buf.sum(0)", ("state:buffer_new_shape",)
    return "self.buf = torch.cat([self.buf.reshape(-1), self.buf.reshape(-1)])", ("state:buffer_new_shape",)


GENERATORS = {
    "pure": [gen_unary, gen_binary, gen_reduction, gen_matmul, gen_cat, gen_factory, gen_compare],
    "view": [gen_view],
    "composite": [gen_composite],
    "inplace": [gen_binary_inplace, gen_unary_inplace, gen_copy, gen_masked_fill, gen_index_put, gen_out],
    "state": [gen_augmented_state, gen_data_read, gen_data_write, gen_data_write_to_a_result, gen_view_dtype,
              gen_whole_copy_into_input,
              gen_buffer_new_shape],
}
