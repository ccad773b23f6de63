"""Keep autograd's saved tensors intact when the program writes inputs back.

Eager ``batch_norm`` updates ``running_mean`` in place *inside* the op, then
autograd saves it. In the functional program the op reads the old buffer and
the write-back (``copy_`` by the caller, after the forward) bumps the buffer's
version, so backward fails with "modified by an inplace operation". torch's
own ``run_decompositions`` program has this bug. The fix: a node that reads a
mutated input, records autograd history, and computes that input's new value
reads a clone instead, also when it reads the input through a view
(``buf[0::1].mul_(x)``), and also when the input itself requires grad and the
op's own derivative reads it (``x.sin_()`` on an activation). Nodes without
autograd history save nothing and are left alone, so plain ``buf.add_(1)``
costs no copy.
"""

from __future__ import annotations

import functools

import torch

from ..autograd_facts import Fact, has, may_carry_grad, nodes_that_may_carry_grad
from ..graphs import calls_view_op, graph_pass
from ..regions.ops import pf_grad_region


def _may_save_self_for_itself(node: torch.fx.Node) -> bool:
    """Whether ``node``'s gradient for its first input may read that input's value."""
    return may_carry_grad(node.meta.get("val")) and not has(node.target, Fact.OWN_GRAD_IGNORES_SELF)


def _saves_nothing(node: torch.fx.Node) -> bool:
    """True when ``node`` cannot have saved the old value for backward: a no_grad
    region records no history, and some ops' derivatives never read ``self``."""
    if node.target is pf_grad_region and node.args[0] is False:
        return True
    return has(node.target, Fact.SELF_NOT_SAVED)


def _feeds(node: torch.fx.Node, final: torch.fx.Node, position: dict[torch.fx.Node, int]) -> bool:
    """Whether ``final`` is ``node`` or depends on it: a search forward from ``node`` that stops
    at nodes after ``final`` (a graph is in topological order). An op that saves a written
    input mostly feeds that input's new value directly (batch norm's running statistics), so
    this ends in a step or two where the set of all of ``final``'s ancestors took a walk over
    the whole graph per written input (a twentieth of a training-mode MobileNet's export)."""
    limit = position[final]
    seen, stack = {node}, [node]
    while stack:
        current = stack.pop()
        if current is final:
            return True
        for user in current.users:
            if user not in seen and position.get(user, limit) <= limit:  # a clone made here: its op follows
                seen.add(user)
                stack.append(user)
    return False


def _view_chain(placeholder: torch.fx.Node) -> list[torch.fx.Node]:
    """``placeholder`` and every node that views it through view ops only: reading any
    of them reads the value the write-back later overwrites."""
    chain, stack = [], [placeholder]
    while stack:
        node = stack.pop()
        chain.append(node)
        stack += [u for u in node.users if calls_view_op(u)]
    return chain


@graph_pass
def guard_saved_mutated_inputs(gm: torch.fx.GraphModule,
                               written: dict[torch.fx.Node, torch.fx.Node],
                               grad_sources: set[torch.fx.Node],
                               rebound: frozenset[torch.fx.Node] = frozenset()) -> None:
    """``written`` maps a mutated placeholder to the node holding its final value;
    ``grad_sources`` are the placeholders that may require grad. A ``rebound`` placeholder
    (a buffer replaced by assignment) guards every op that may save it: eager never writes
    the old tensor, so those ops' backward reads it as it was, where the write-back would
    give it the new value."""
    may_need_grad = nodes_that_may_carry_grad(gm.graph, grad_sources)
    position = {node: i for i, node in enumerate(gm.graph.nodes)}
    for placeholder, final in written.items():
        aliases = _view_chain(placeholder)
        for alias in aliases:
            if not isinstance(alias.meta.get("val"), torch.Tensor):  # split's list: its pieces are aliases
                continue
            for user in list(alias.users):
                if (user.op != "call_function" or calls_view_op(user) or _saves_nothing(user)
                        or not (placeholder in rebound or _feeds(user, final, position))):
                    continue
                others_need_grad = any(i in may_need_grad for i in user.all_input_nodes if i not in aliases)
                itself_needs_grad = alias in may_need_grad and _may_save_self_for_itself(user)
                if not (others_need_grad or itself_needs_grad):
                    continue
                with gm.graph.inserting_before(user):
                    clone = gm.graph.call_function(torch.ops.aten.clone.default, (alias,))
                clone.meta["val"] = alias.meta.get("val")
                user.replace_input_with(alias, clone)


@graph_pass
def clone_relaid_inputs(gm: torch.fx.GraphModule, relaid: list[torch.fx.Node]) -> None:
    """Every use of an input whose layout the program changes (``x.t_()``) reads a clone.

    Its new value is a view of the input (``permute(x)``); ``ep.module()`` relays the
    input out (``as_strided_``, which bumps its version) before writing that value
    back, so any view of the input an op saved for backward would read as modified
    (eager relaid it before the op saved it). One copy per relaid input.
    """
    if not relaid:
        return
    first_op = next(n for n in gm.graph.nodes if n.op != "placeholder")
    for placeholder in relaid:
        with gm.graph.inserting_before(first_op):
            clone = gm.graph.call_function(torch.ops.aten.clone.default, (placeholder,))
        clone.meta["val"] = placeholder.meta.get("val")
        placeholder.replace_all_uses_with(clone, delete_user_cb=functools.partial(_is_not, clone))


def _is_not(node: torch.fx.Node, user: torch.fx.Node) -> bool:
    return user is not node
