"""Lifting: the model's parameters, buffers and tensor constants become inputs.

The functional program reads all state from placeholders (as torch.export
does), so the trace never holds a reference to a real weight and the user's
module is never written to.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

import torch

from .. import _torch_compat as tc
from ..artifacts import Inputs, InputSlot, SlotKind


def collect_inputs(mod: torch.nn.Module, args: tuple, kwargs: dict) -> Inputs:
    """The graph inputs of ``mod(*args, **kwargs)``: its parameters, buffers and
    tensor attributes, then the flattened user inputs, each named."""
    flat_user, in_spec = tc.pytree.tree_flatten((args, kwargs))
    user_names, arg_names = user_input_names(mod, args, kwargs)
    state, constant_aliases = _state_slots(mod)
    slots = (*state, *(InputSlot(SlotKind.USER, n, v) for n, v in zip(user_names, flat_user)))
    return Inputs(slots, len(state), in_spec, tuple(arg_names), _aliases(mod) + constant_aliases)


def _aliases(mod: torch.nn.Module) -> tuple[tuple[str, str], ...]:
    """(alias, first name) for each parameter or buffer registered under more than one
    name (tied weights, a module shared by two parents): ``named_parameters()`` and
    ``named_buffers()`` list the first name only, ``state_dict()`` every name."""
    first: dict[int, str] = {}
    aliases = []
    for name, value in (*mod.named_parameters(remove_duplicate=False),
                        *mod.named_buffers(remove_duplicate=False)):
        if id(value) in first:
            aliases.append((name, first[id(value)]))
        else:
            first[id(value)] = name
    return tuple(aliases)


def _state_slots(mod: torch.nn.Module) -> tuple[list[InputSlot], tuple[tuple[str, str], ...]]:
    """The state's slots, and (alias, first name) for each tensor constant held under more than
    one name (``m1.foo`` and ``m1.m2.foo``): one input, every name among the program's constants,
    as torch.export lists them."""
    non_persistent = {
        f"{prefix}.{name}" if prefix else name
        for prefix, sub in mod.named_modules()
        for name in tc.non_persistent_buffer_names(sub)
    }
    slots = [InputSlot(SlotKind.PARAMETER, k, v) for k, v in mod.named_parameters()]
    slots += [InputSlot(SlotKind.BUFFER, k, v, k not in non_persistent) for k, v in mod.named_buffers()]
    known = {id(s.value) for s in slots}
    constants: dict[int, str] = {}
    aliases = []
    for prefix, sub in mod.named_modules():
        for name, value in vars(sub).items():
            fqn = f"{prefix}.{name}" if prefix else name
            if isinstance(value, torch.Tensor) and id(value) in constants:
                aliases.append((fqn, constants[id(value)]))
            elif isinstance(value, torch.Tensor) and id(value) not in known:
                # a tensor kept of an earlier call with grad on: the program holds its value, not
                # the history of a call that is over (a constant does not train; deepcopy and
                # torch.export.save refuse a tensor with history)
                slots.append(InputSlot(SlotKind.CONSTANT, fqn, value if value.is_leaf else value.detach()))
                known.add(id(value))
                constants[id(value)] = fqn
    return slots, tuple(aliases)


def _sanitize(name: str) -> str:
    name = re.sub(r"[^0-9a-zA-Z_]+", "_", name).strip("_")
    return name if name and not name[0].isdigit() else f"_{name}"


_CAMEL_HUMP = re.compile(r"(?<=[a-z])([A-Z])")


def placeholder_name(slot: InputSlot) -> str:
    """torch.export's placeholder names: the user's argument names, p_/b_/c_<fqn> for state,
    in snake case as torch names them (``unflatten`` regenerates and matches these names:
    ``p_encoder_layer_norm_weight`` for ``encoder.LayerNorm.weight``)."""
    if slot.kind is SlotKind.USER:
        return slot.target
    snake = _CAMEL_HUMP.sub(r"_\1", slot.target).lower()
    return f"{slot.kind.prefix}_{_sanitize(snake)}"


def user_input_names(mod: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[list[str], list[str]]:
    """Names for the flat user inputs (from ``forward``'s signature) and the forward arg names.

    The forward arg names list the keyword arguments after the positional ones,
    as torch.export does: ``ExportedProgram.module()`` rebuilds ``forward``'s
    signature from them, so a missing keyword makes the module uncallable.
    """
    try:
        bound_names = _bound_names(inspect.signature(mod.forward), args, kwargs)
    except (TypeError, ValueError):
        bound_names = [f"arg{i}" for i in range(len(args))] + list(kwargs)
    arg_names = bound_names[: len(args)]
    names = []
    leaves, _ = tc.pytree.tree_flatten_with_path((tuple(args), dict(kwargs)))
    for path, _leaf in leaves:
        top, rest = path[0], path[1:]
        first = path[1] if len(path) > 1 else None
        if getattr(top, "idx", None) == 0 and first is not None:  # positional
            idx = first.idx  # type: ignore[attr-defined]
            base = arg_names[idx] if idx < len(arg_names) else f"arg{idx}"
            rest = path[2:]
        else:
            base = str(getattr(first, "key", "kwarg"))
            rest = path[2:]
        suffix = "".join(_path_piece(p) for p in rest)
        names.append(_sanitize(base + suffix))
    return _unique(names), arg_names + [k for k in kwargs if k not in arg_names]


def _bound_names(sig: inspect.Signature, args: tuple, kwargs: dict) -> list[str]:
    """One name per argument of the call: ``*args`` become ``args_0, args_1, ...``
    and ``**kwargs`` their keys, as torch.export names them, so ``module()``'s
    rebuilt signature takes the same call."""
    names: list[str] = []
    for name, value in sig.bind(*args, **kwargs).arguments.items():
        kind = sig.parameters[name].kind
        if kind is inspect.Parameter.VAR_POSITIONAL:
            names += [f"{name}_{i}" for i in range(len(value))]
        elif kind is inspect.Parameter.VAR_KEYWORD:
            names += list(value)
        else:
            names.append(name)
    return names


def _path_piece(entry: Any) -> str:
    for attr in ("idx", "key", "name"):
        if hasattr(entry, attr):
            return f"_{getattr(entry, attr)}"
    return "_x"


def _unique(names: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for n in names:
        if n in seen:
            seen[n] += 1
            n = f"{n}_{seen[n]}"
        else:
            seen[n] = 0
        out.append(n)
    return out
