"""Generators of torch HOP calls and custom autograd Functions for the fuzzer.

Each draws against the builder's shadow environment (real tensors) and emits a
block of source lines: a ``torch.cond`` over a float tensor with a tensor
predicate, a ``while_loop``, a ``scan``, or a custom ``torch.autograd.Function``
(defined inside ``forward``) whose backward differs from autograd of its
forward, so a lost backward shows as a gradient difference. Bodies may hold
grad regions and in-place ops on their own tensors; Functions may write their
operand in place under ``mark_dirty``, save tensors for backward, return their
operand as-is (eager: a view of it) or turn ``set_materialize_grads`` off.
"""

from __future__ import annotations

import textwrap

from hypothesis import strategies as st

from .program import Stmt

_UNARY = ("{a}.sin()", "{a}.cos() * 2", "({a} * 0.5).tanh()", "{a}.exp() * 0.1", "({a} + 1).abs()")


def _body_expr(b, a: str) -> str:
    return b.one_of(_UNARY).format(a=a)


def emit_block(b, code: str, tags: tuple[str, ...]) -> bool:
    """Exec ``code`` (several lines) in the shadow, then append its lines to the body."""
    code = textwrap.dedent(code).strip("\n")
    if not b.run(code):
        return False
    for line in code.splitlines():
        stripped = line.lstrip(" ")
        extra = (len(line) - len(stripped)) // 4
        b.body.append(Stmt(stripped, tags, b.indent + extra))
    return True


def _fresh_names(b, count: int) -> list[str]:
    names = [f"v{b.counter + i}" for i in range(count)]
    b.counter += count
    return names


def _float_operand(b) -> str | None:
    return b.pick(lambda t: t.is_floating_point() and t.numel() > 0)


def gen_cond(b) -> bool:
    a = _float_operand(b)
    if a is None:
        return False
    (out,) = _fresh_names(b, 1)
    n = b.counter
    pred = b.one_of([f"{a}.sum() > 0", f"{a}.mean() < 0.25", f"{a}.abs().max() > 1"])
    region = b.draw(st.booleans())
    inplace = b.draw(st.booleans())
    true_lines = [f"def cond_true_{n}(t):"]
    if region:
        true_lines += ["    with torch.no_grad():", f"        s = {_body_expr(b, 't')}", "    t = t + s"]
    if inplace:
        true_lines += ["    u = t.clone()", "    u.mul_(1.5)", "    t = u"]
    true_lines += [f"    return {_body_expr(b, 't')}"]
    false_lines = [f"def cond_false_{n}(t):", f"    return {_body_expr(b, 't')}"]
    code = "\n".join(true_lines + false_lines + [f"{out} = torch.cond({pred}, cond_true_{n}, cond_false_{n}, ({a},))"])
    tags = ("hop", "hop:cond") + (("hop:region_in_body",) if region else ()) + (("hop:inplace_in_body",) if inplace else ())
    if not emit_block(b, code, tags):
        return False
    b.names.append(out)
    return True


def gen_while_loop(b) -> bool:
    a = _float_operand(b)
    if a is None:
        return False
    i, out = _fresh_names(b, 2)
    steps = b.draw(st.integers(0, 3))
    code = (f"{i}, {out} = torch._higher_order_ops.while_loop(lambda i, t: i < {steps}, "
            f"lambda i, t: (i + 1, {_body_expr(b, 't')}), (torch.zeros((), dtype=torch.int64), {a}))")
    if not emit_block(b, code, ("hop", "hop:while_loop")):
        return False
    b.names += [out]
    return True


def gen_scan(b) -> bool:
    a = b.pick(lambda t: t.is_floating_point() and t.dim() >= 2 and t.shape[0] > 0)
    if a is None:
        return False
    carry, ys = _fresh_names(b, 2)
    n = b.counter
    code = "\n".join([
        f"def combine_{n}(c, x):",
        f"    new = c * 0.5 + {_body_expr(b, 'x')}",
        "    return new, (new * x).clone()",
        f"{carry}, {ys} = torch._higher_order_ops.scan(combine_{n}, {a}[0] * 0, {a})",
    ])
    if not emit_block(b, code, ("hop", "hop:scan")):
        return False
    b.names += [carry, ys]
    return True


def gen_function(b) -> bool:
    """A custom autograd.Function whose backward is not autograd of its forward."""
    a = _float_operand(b)
    if a is None:
        return False
    (out,) = _fresh_names(b, 1)
    n = b.counter
    kind = b.one_of(["saved", "saved_output", "ctx_output", "dirty", "region", "identity", "no_materialize"])
    scale = b.one_of([2.0, -1.0, 0.5])
    grads, pick = "g", ""
    if kind == "saved":
        forward = ["        ctx.save_for_backward(a)", f"        return {_body_expr(b, 'a')}"]
        backward = ["        (a,) = ctx.saved_tensors", f"        return g * a.cos() * {scale}"]
    elif kind == "saved_output":  # the backward reads the output (a hand-written sigmoid or exp)
        forward = [f"        y = {_body_expr(b, 'a')}", "        ctx.save_for_backward(y)", "        return y"]
        backward = ["        (y,) = ctx.saved_tensors", f"        return g * (y + {scale})"]
    elif kind == "ctx_output":  # the same, kept as a ctx attribute instead of saved
        forward = [f"        y = {_body_expr(b, 'a')}", "        ctx.y = y", "        return y"]
        backward = [f"        return g * (ctx.y * {scale} + 1.0)"]
    elif kind == "dirty":
        forward = ["        a.mul_(2)", "        ctx.mark_dirty(a)", "        return a"]
        backward = [f"        return g * {scale}"]
    elif kind == "identity":  # eager returns a view of the operand, with this backward
        forward = ["        return a"]
        backward = [f"        return g * {scale}"]
    elif kind == "no_materialize":  # eager passes None for the non-differentiable output
        forward = ["        ctx.set_materialize_grads(False)", "        i = (a > 0).long()",
                   "        ctx.mark_non_differentiable(i)", f"        return {_body_expr(b, 'a')}, i"]
        backward = [f"        return g * ({scale} if g_i is None else 100.0)"]
        grads, pick = "g, g_i", "[0]"
    else:
        forward = ["        with torch.enable_grad():", f"            b = {_body_expr(b, 'a')}", "        return b + a"]
        backward = [f"        return g * {scale}"]
    operand = f"({a} * 1.0)" if kind in ("dirty", "identity") else a  # a non-leaf, as eager needs
    code = "\n".join([
        f"class Fn{n}(torch.autograd.Function):",
        "    @staticmethod",
        "    def forward(ctx, a):", *forward,
        "    @staticmethod",
        f"    def backward(ctx, {grads}):", *backward,
        f"{out} = Fn{n}.apply({operand}){pick}",
    ])
    if not emit_block(b, code, ("function", f"function:{kind}")):
        return False
    b.names.append(out)
    return True


HOP_GENERATORS = (gen_cond, gen_cond, gen_while_loop, gen_scan, gen_function, gen_function)
