"""Hand our programs to consumers that cannot read region HOPs yet.

Some importers (torch-mlir's FX importer, for one) reject any higher-order
op they do not know, ours included. :func:`inline_regions` gives them a
program with the same placeholders, outputs and signature, but no region
HOPs: each grad region's body is spliced into its parent, and every value
the body computed with grad disabled is followed by ``aten.detach``, so an
autograd-aware consumer still sees eager's gradient flow::

    with torch.no_grad():          s = pf_grad_region(False, (-1,), body, x)
        s = x.sum()          ->    s = aten.detach(aten.sum(x))

The consequence, spelled out:

* Values are unchanged; the grad-mode *region* becomes a set of ``detach``
  nodes, so a consumer cannot tell a region from an ordinary detach any more.
* A tensor updated in place under ``no_grad`` that requires grad (an
  ``identity_of`` result, see ``regions/ops.py``) keeps its new value but loses
  eager's identity gradient: gradients reaching it stop there instead of
  flowing to the tensor it updated. Programs without such updates (every
  model of ``tests/models``) train exactly as before.
* Autocast regions are refused: their casts happen only when the region runs
  under autocast, so dropping the region would silently change numerics. Use
  ``ep.run_decompositions()``, which materialises the casts in core ATen.
"""

from __future__ import annotations

import copy
import operator
import warnings

import torch
from torch.export.graph_signature import ExportGraphSignature, OutputSpec, TensorArgument

from .autograd_facts import may_carry_grad
from .errors import Refusal, UnsupportedError
from .regions.ops import pf_autocast_region, pf_grad_region

_GRAD_ENABLED = "_pf_inlined_grad_enabled"  # meta key: grad mode the node ran under


def inline_regions(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """A copy of ``ep`` with every grad region inlined (see the module docstring)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        ep = copy.deepcopy(ep)
    gm = ep.graph_module
    _inline_in(gm)
    _detach_grad_off_values(gm.graph)
    gm.graph.lint()
    gm.recompile()
    return type(ep)(
        root=gm, graph=gm.graph, graph_signature=_outputs_renamed(ep.graph_signature, gm.graph),
        state_dict=ep.state_dict, range_constraints=ep.range_constraints,
        module_call_graph=ep.module_call_graph, example_inputs=ep.example_inputs,
        constants=ep.constants)


def _inline_in(gm: torch.fx.GraphModule) -> None:
    """Inline the region calls of ``gm``, and of their bodies first."""
    for node in list(gm.graph.nodes):
        if node.op != "call_function":
            continue
        if node.target is pf_autocast_region:
            raise UnsupportedError(
                "inline_regions cannot drop an autocast region without changing numerics; "
                "use ep.run_decompositions() to materialise its casts", kind=Refusal.REGION_NOT_INLINABLE,
                op="pf_autocast_region",
                source=(node.meta.get("stack_trace") or "").strip() or None)
        if node.target is pf_grad_region:
            _splice(gm, node)
    for name in [n for n, c in gm.named_children() if isinstance(c, torch.fx.GraphModule)]:
        if not any(n.op == "get_attr" and n.target == name for n in gm.graph.nodes):
            delattr(gm, name)


def _splice(gm: torch.fx.GraphModule, call: torch.fx.Node) -> None:
    enabled, _identity_of, body_attr, *operands = call.args
    body = getattr(gm, str(body_attr.target))
    _inline_in(body)  # nested regions first, so their nodes carry their own mode
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    placeholders = iter(operands)
    with gm.graph.inserting_before(call):
        for node in body.graph.nodes:
            if node.op == "placeholder":
                env[node] = next(placeholders)  # type: ignore[assignment]
            elif node.op == "output":
                results = torch.fx.node.map_arg(node.args[0], env.__getitem__)
            else:
                if node.op == "get_attr":
                    raise UnsupportedError(f"region body reads attribute {node.target!r}",
                                           kind=Refusal.REGION_NOT_INLINABLE)
                copied = gm.graph.node_copy(node, env.__getitem__)
                copied.meta.setdefault(_GRAD_ENABLED, bool(enabled))
                env[node] = copied
    for user in list(call.users):
        if user.target is not operator.getitem:
            raise UnsupportedError(f"region result used directly by {user.format_node()}",
                                   kind=Refusal.REGION_NOT_INLINABLE)
        user.replace_all_uses_with(results[user.args[1]])
        gm.graph.erase_node(user)
    gm.graph.erase_node(call)
    if not body_attr.users:
        gm.graph.erase_node(body_attr)  # type: ignore[arg-type]


def _detach_grad_off_values(graph: torch.fx.Graph) -> None:
    """Follow every floating tensor computed with grad disabled by ``aten.detach``."""
    for node in list(graph.nodes):
        if node.meta.pop(_GRAD_ENABLED, True):
            continue
        val = node.meta.get("val")
        if not may_carry_grad(val):
            continue
        with graph.inserting_after(node):
            detached = graph.call_function(torch.ops.aten.detach.default, (node,))
        detached.meta["val"] = val
        detached.meta["stack_trace"] = node.meta.get("stack_trace")
        node.replace_all_uses_with(detached, delete_user_cb=lambda user: user is not detached)  # noqa: B023 (called here)


def _outputs_renamed(sig: ExportGraphSignature, graph: torch.fx.Graph) -> ExportGraphSignature:
    """The same output specs, naming the nodes the graph now returns."""
    returned = list(next(n for n in reversed(graph.nodes) if n.op == "output").args[0])
    outputs = [OutputSpec(s.kind, TensorArgument(r.name), s.target)
               if isinstance(s.arg, TensorArgument) and isinstance(r, torch.fx.Node) else s
               for s, r in zip(sig.output_specs, returned)]
    return ExportGraphSignature(list(sig.input_specs), outputs)
