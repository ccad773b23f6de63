"""A traced kernel as a program the session's C++ replay runs (``native/graph_replay.cpp``).

A cached kernel (``replay.TracedKernel``) is the source of one straight-line function, written
by ``replay.write_out``: each line one op call on earlier values and constants, then a return.
The C++ replay cannot run Python, so the source is read back (with ``ast``: a kernel restored
from disk has no graph, only its source and constants) into slots and constants:

    (inputs, [(op name, overload, [argument, ...]), ...], [output, ...])

where an argument is ``(SLOT, i)``, ``(CONSTANT, value)`` or ``(LIST, [i or -1, ...])`` (a list
of values, -1 for None), every argument of the op's schema given, defaults filled in; an item
of an earlier result is ``("getitem", "", [(SLOT, i), (CONSTANT, index)])``. None where the
kernel holds anything else (a Python callable, a nested list of values): the Python replay
serves it as before.
"""

from __future__ import annotations

import ast
import functools
import operator
from typing import Any

from .. import _torch_compat as tc
from .replay import TracedKernel

SLOT, CONSTANT, LIST = 0, 1, 2

_NOT_A_PROGRAM = object()


class _Unsupported(Exception):
    pass


def program_of(kernel: TracedKernel, op: tc.OpOverload) -> tuple | None:
    """``kernel`` (a decomposition of ``op``) as the C++ replay's program; made once per kernel."""
    made = kernel.native
    if made is None:
        try:
            made = _read(kernel, op)
        except (_Unsupported, SyntaxError, IndexError, KeyError, ValueError, AttributeError):
            made = _NOT_A_PROGRAM
        kernel.native = made
    return None if made is _NOT_A_PROGRAM else made


def known_programs(kernels: dict[tuple, Any]) -> list[tuple[tuple[int, ...], tuple]]:
    """(C++ key, program) of each of an op's kernels the C++ replay ran, in this process or in
    the one that wrote them to disk: what a new registration of the replay starts with."""
    return [(key, kernel.native) for kernel in list(kernels.values())
            if isinstance(kernel, TracedKernel) and kernel.native is not None
            and kernel.native is not _NOT_A_PROGRAM for key in kernel.native_keys]


def _read(kernel: TracedKernel, op: tc.OpOverload) -> tuple:
    function = ast.parse(kernel.code).body[0]
    if not isinstance(function, ast.FunctionDef):
        raise _Unsupported(kernel.code)
    constants = kernel.constants
    slots = {argument.arg: i for i, argument in enumerate(function.args.args)}
    inputs = len(slots)
    instructions: list[tuple] = []
    outputs: list[tuple] | None = None
    for statement in function.body:
        if isinstance(statement, ast.Assign) and isinstance(statement.value, ast.Call):
            instructions.append(_instruction(statement.value, slots, constants))
            slots[_name(statement.targets[0])] = inputs + len(instructions) - 1
        elif isinstance(statement, ast.Return) and statement.value is not None and outputs is None:
            outputs = _outputs(statement.value, slots, constants, _returns(op))
        else:
            raise _Unsupported(ast.dump(statement))
    if outputs is None:
        raise _Unsupported("no return")
    return inputs, instructions, outputs


@functools.cache
def _returns(op: tc.OpOverload) -> int:
    return len(tc.schema_of(op).returns)


def _name(node: ast.expr) -> str:
    if not isinstance(node, ast.Name):
        raise _Unsupported(ast.dump(node))
    return node.id


def _instruction(call: ast.Call, slots: dict[str, int], constants: list[Any]) -> tuple:
    callee = _constant_named(_name(call.func), constants)
    if callee is operator.getitem:
        source, index = (_argument(a, slots, constants) for a in call.args)
        if source[0] != SLOT or index[0] != CONSTANT or call.keywords:
            raise _Unsupported("getitem")
        return "getitem", "", [source, index]
    if not isinstance(callee, tc.OpOverload):
        raise _Unsupported(repr(callee))
    name, overload, parameters = _parameters(callee)
    given = [_argument(a, slots, constants) for a in call.args]
    by_name = {keyword.arg: _argument(keyword.value, slots, constants) for keyword in call.keywords}
    arguments = []
    for i, (parameter, kwarg_only, default) in enumerate(parameters):
        if i < len(given) and not kwarg_only:
            arguments.append(given[i])
        elif parameter in by_name:
            arguments.append(by_name.pop(parameter))
        elif default is not _NO_DEFAULT:
            arguments.append((CONSTANT, default))
        else:
            raise _Unsupported(f"{name}: {parameter} missing")
    if by_name or len(given) > sum(not kwarg_only for _, kwarg_only, _ in parameters):
        raise _Unsupported(f"{name}: arguments beyond the schema")
    return name, overload, arguments


_NO_DEFAULT = object()


@functools.cache
def _parameters(op: tc.OpOverload) -> tuple[str, str, tuple[tuple[str, bool, Any], ...]]:
    """``op``'s name, overload and (name, keyword-only, default) per argument: read once (a
    schema's arguments are rebuilt as Python objects on each read)."""
    schema = tc.schema_of(op)
    return schema.name, schema.overload_name, tuple(
        (a.name, a.kwarg_only, a.default_value if a.has_default_value() else _NO_DEFAULT) for a in schema.arguments)


def _constant_named(name: str, constants: list[Any]) -> Any:
    if not name.startswith("c"):
        raise _Unsupported(name)
    return constants[int(name[1:])]


def _argument(node: ast.expr, slots: dict[str, int], constants: list[Any]) -> tuple:
    if isinstance(node, ast.Name):
        if node.id in slots:
            return SLOT, slots[node.id]
        return CONSTANT, _constant_named(node.id, constants)
    if isinstance(node, ast.Constant):
        return CONSTANT, node.value
    if isinstance(node, (ast.List, ast.Tuple)):
        items = [_argument(item, slots, constants) for item in node.elts]
        if all(kind == CONSTANT for kind, _ in items):
            values = [value for _, value in items]
            return CONSTANT, values if isinstance(node, ast.List) else tuple(values)
        if all(kind == SLOT or (kind == CONSTANT and value is None) for kind, value in items):
            return LIST, [value if kind == SLOT else -1 for kind, value in items]
        raise _Unsupported(ast.dump(node))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant) \
            and type(node.operand.value) is int:
        return CONSTANT, -node.operand.value  # a negative int, as repr writes it
    raise _Unsupported(ast.dump(node))


def _outputs(node: ast.expr, slots: dict[str, int], constants: list[Any], returns: int) -> list[tuple]:
    """One output per return: a value, a list of values, or None (a gradient a backward op's
    output mask did not ask for: an undefined tensor, as the Python kernel's None becomes)."""
    if returns == 1:
        outputs = [_argument(node, slots, constants)]
    elif isinstance(node, (ast.Tuple, ast.List)) and len(node.elts) == returns:
        outputs = [_argument(item, slots, constants) for item in node.elts]
    else:
        raise _Unsupported(ast.dump(node))
    if any(kind == CONSTANT and value is not None for kind, value in outputs):
        raise _Unsupported("a constant output")
    return outputs
