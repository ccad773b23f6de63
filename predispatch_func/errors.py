"""Errors that name the op and the user's source line.

A compiler user who gets "RuntimeError deep inside torch" cannot act on it.
Every error we raise says which op was involved and which line of *their*
model made it, found by walking the stack past torch's and our own frames.
"""

from __future__ import annotations

import enum
import os
import re
import sys
import traceback
from types import FrameType, TracebackType

import torch

from . import _torch_compat as tc

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep  # this package's frames are never the user's
_SKIP_DIRS = (os.path.dirname(torch.__file__) + os.sep, PACKAGE_DIR)
_STDLIB_DIR = os.path.dirname(os.__file__) + os.sep


def _is_user_frame(filename: str) -> bool:
    if filename.startswith(_SKIP_DIRS) or filename.startswith("<"):
        return False
    return not (filename.startswith(_STDLIB_DIR) and "site-packages" not in filename)


def _format(frame: traceback.FrameSummary) -> str:
    line = f"{frame.filename}:{frame.lineno} in {frame.name}"
    return f"{line}\n    {frame.line}" if frame.line else line


def user_source_line(tb: TracebackType | None = None) -> str | None:
    """The innermost user frame, from a traceback if given, else the live stack.

    The live stack is walked frame by frame and only the frame found is read
    from its file: observers call this for every op they note, where
    extracting the whole stack would cost a tenth of the export.
    """
    if tb is not None:
        for summary in reversed(traceback.extract_tb(tb)):
            if _is_user_frame(summary.filename):
                return _format(summary)
        return None
    frame: FrameType | None = sys._getframe(1)  # noqa: SLF001  (CPython's frame walk)
    while frame is not None:
        code = frame.f_code
        if _is_user_frame(code.co_filename):
            return _format(traceback.FrameSummary(code.co_filename, frame.f_lineno, code.co_name))
        frame = frame.f_back
    return None


_RECORDED_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(.*)')


def user_line_of_recorded(stack_trace: str | None) -> str | None:
    """The innermost user frame of a node's recorded ``stack_trace``, as :func:`user_source_line`."""
    frames = _RECORDED_FRAME.findall(stack_trace or "")
    for filename, lineno, name, code in reversed(frames):
        if _is_user_frame(filename):
            return f"{filename}:{lineno} in {name}\n    {code.strip()}"
    return None


class ExportError(RuntimeError):
    """Exporting failed; the message names the op and the user's source line.

    ``reason`` is the message alone (``str()`` adds the op and the line); ``hint`` says what
    to do next, for the command line (``cli.py``), which prints these instead of a traceback.
    """

    def __init__(self, message: str, *, op: object = None, source: str | None = None):
        self.reason = message
        self.op = op
        self.source = source
        parts = [message]
        if op is not None:
            parts.append(f"op: {op}")
        if source:
            parts.append(f"at: {source}")
        # not super(): a subclass may also derive from a torch error class with another __init__
        RuntimeError.__init__(self, "\n".join(parts))

    @property
    def hint(self) -> str:
        return ("this is not a known limit: if torch.export.export runs the model, it is a bug of "
                "predispatch_func; please report it with the traceback")

    @classmethod
    def wrapping(cls, exc: BaseException, *, op: object = None, source: str | None = None) -> ExportError:
        """Our error for a torch exception we do not translate: our message (the op, the user's line)
        on an instance of the exception's own class too, so an ``except`` written for torch.export
        (``except MetadataMismatchError``, ``except IndexError``) still catches it."""
        return _catchable_as(type(exc))(f"tracing failed: {type(exc).__name__}: {exc}", op=op, source=source)


_CATCHABLE_AS: dict[type, type] = {}


def _catchable_as(torch_error: type[BaseException]) -> type[ExportError]:
    """``ExportError`` that is also a ``torch_error`` (one class per torch error, made once)."""
    if torch_error not in _CATCHABLE_AS:
        _CATCHABLE_AS[torch_error] = _combined(torch_error)
    return _CATCHABLE_AS[torch_error]


def _combined(torch_error: type[BaseException]) -> type[ExportError]:
    if issubclass(ExportError, torch_error) or not issubclass(torch_error, Exception):
        return ExportError
    try:
        return type(f"ExportError({torch_error.__name__})", (ExportError, torch_error),
                    {"__module__": __name__, "__reduce__": _reduce_wrapped, "wrapped_error_class": torch_error})
    except TypeError:  # C exception types whose layouts cannot be combined
        return ExportError


def _reduce_wrapped(self: ExportError) -> tuple:
    """Pickle as the torch class and message: the class itself is made at run time."""
    return _rebuild_wrapped, (type(self).wrapped_error_class, str(self))  # type: ignore[attr-defined]


def _rebuild_wrapped(torch_error: type[BaseException], message: str) -> ExportError:
    return _catchable_as(torch_error)(message)


class Refusal(enum.Enum):
    """Why a model was refused: one kind per limit, each listed in docs/limits.md (text: known_limits.py).

    Tests, the fuzz harness and callers match on the kind, never on message text,
    so a reworded message cannot change what counts as a known refusal. ``torch_limit``
    marks the kinds torch 2.13 itself blocks (each has a strict-xfail test that
    turns green when torch is fixed); the others the IR cannot express.
    """

    GRAD_MODE_AFTER_AUTOGRAD = ("a grad-mode change with pre_dispatch=False", False)
    MODE_LEFT_CHANGED = ("autocast (or a mode region) left enabled when forward returns", False)
    INPUT_METADATA_MUTATION = ("an in-place shape/stride change of a graph input", False)
    WRITE_TO_ALIASED_INPUTS = ("a write to an input that shares memory with another input", False)
    WRITE_TO_TENSOR_ATTRIBUTE = ("a write to a tensor attribute that is not a buffer", False)
    STATE_REPLACED = ("a parameter, or a buffer of another shape/dtype, replaced by assignment", False)
    IDENTITY_IN_NESTED_GRAD_REGION = ("a tensor written under no_grad read in a grad-on region nested in it",
                                      False)
    OUT_WITH_OTHER_WRITES = ("an out= overload that writes other arguments too, without a twin lacking out=",
                             True)
    OVERLAPPING_WRITES = ("one tensor passed as two arguments an op writes", False)
    WRITE_TO_OVERLAPPING_VIEW = ("an in-place write to a view whose elements overlap (unfold)", False)
    WRITE_TO_SPARSE = ("an in-place write to a sparse tensor", False)
    GRAD_VALUE_THROUGH_DETACH = ("a value that requires grad written through a detach()-ed alias", False)
    GRAD_VALUE_INTO_INTEGER = ("a value that requires grad written into an integer tensor", True)
    VIEW_REPLAY_AFTER_STRIDED_WRITE = (".view() of a tensor written through a non-contiguous alias", True)
    WRITE_THROUGH_AS_STRIDED_OF_VIEW = ("a write through as_strided() of another view", True)
    VIEW_DTYPE_REBUILD = ("a view(dtype) made under no_grad of a tensor written before", True)
    PYTHON_STATE_CHANGED = ("a Python attribute, buffer, parameter or submodule set in forward", False)
    RNG_STATE_SET = ("torch.manual_seed, torch.seed or a changed set_rng_state in forward", False)
    RNG_STREAM_NOT_REPRODUCIBLE = ("random numbers a kernel draws from a generator state no program op reads "
                                   "(cuDNN's RNN dropout)", True)
    DATA_ASSIGN_NEW_METADATA = ("tensor.data = value with another shape, dtype or device", False)
    DATA_ASSIGN_ALIASED = ("tensor.data = value while an alias tells the copy from eager's storage swap", False)
    DATA_WRITE_AFTER_SAVED_READ = ("a .data write to a tensor an op read for backward at an intermediate value",
                                   False)
    WRITE_AFTER_UNCHECKED_HOP_READ = ("an in-place write to a tensor while_loop or scan read with grad on", False)
    DYNAMIC_SHAPES_SPEC = ("a dynamic_shapes spec that does not fit the call or its example", False)
    DIM_NOT_DYNAMIC = ("a declared Dim that the model specialises, derives or narrows", False)
    AUTOGRAD_FUNCTION_AFTER_AUTOGRAD = ("a custom autograd.Function with pre_dispatch=False", False)
    AUTOGRAD_FUNCTION_NOT_TRACEABLE = ("an autograd.Function whose forward/backward cannot be traced", False)
    AUTOGRAD_FUNCTION_IN_HOP_BODY = ("a custom autograd.Function inside a torch HOP's body", True)
    UNMATERIALIZED_GRADS = ("set_materialize_grads(False) in a Function with several differentiable outputs",
                            False)
    TENSOR_HOOK_NOT_EXPRESSIBLE = ("a tensor hook removed inside forward, or one returning None", False)
    MODULE_BACKWARD_HOOK = ("a module's full backward hook (register_full_backward_hook / _pre_hook)", False)
    REQUIRES_GRAD_OFF_ON_INPUT = ("requires_grad_(False) on a parameter, buffer or input in forward", False)
    HOP_BODY_WRITES_OPERANDS = ("a torch HOP body that writes its operands or a closed-over tensor", True)
    FUNC_TRANSFORM_IN_HOP_BODY = ("torch.vmap or another torch.func transform inside a torch HOP's body", True)
    AUTOCAST_IN_HOP_BODY = ("an autocast region inside a torch HOP's body", True)
    HOP_NOT_REPRESENTABLE = ("a torch HOP whose traced call no ExportedProgram accepts", True)
    HOP_OPERAND_OF_WHILE_LOOP = ("a while_loop result computed with grad on, passed to another torch HOP", True)
    STORAGE_SWAP = ("x.set_(...): a tensor given another tensor's (or a Storage's) memory", False)
    DATA_DEPENDENT_BRANCH = ("Python control flow or a size that depends on tensor data, unconstrained", False)
    OP_NOT_IN_TARGET = ("an op that cannot be lowered into the export's target op set", False)
    EAGER_OP_UNREACHABLE = ("an op run under pf.eager.on with no path into the target op set", False)
    EAGER_BACKEND_LACKS_FLOOR = ("pf.eager.register on a backend without kernels for the runtime floor", False)
    REGION_NOT_INLINABLE = ("inline_regions on an autocast region or a malformed region", False)
    TENSOR_SUBCLASS_IN_FORWARD = ("a write through a tensor subclass's inner tensors, or a subclass use the "
                                  "program cannot name", False)
    OUTPUT_NOT_A_PYTREE = ("an output of a type pytree does not know (not a registered pytree node)", False)
    AUTOGRAD_CALL_IN_FORWARD = ("torch.autograd.grad or backward() called inside forward, before autograd", False)
    DTENSOR_BOUNDARY_IN_FORWARD = ("DTensor.from_local, to_local or redistribute in forward (parallelize_module's "
                                   "hooks)", True)
    FULLY_SHARDED_MODULE = ("a module sharded by FSDP2's fully_shard", True)
    SUBGRAPH_IN_PIPELINE_STAGE = ("an autocast region, a torch HOP, or a tensor updated in place under no_grad, in a "
                                  "model split by torch.distributed.pipelining", True)

    def __init__(self, summary: str, torch_limit: bool):
        self.summary = summary
        self.torch_limit = torch_limit


class UnsupportedError(ExportError):
    """The model does something the exporter cannot honour (never silently changed).

    ``kind`` says which limit, as data (see :class:`Refusal`).
    """

    def __init__(self, message: str, *, kind: Refusal, op: object = None, source: str | None = None):
        self.kind = kind
        super().__init__(message, op=op, source=source)

    @property
    def hint(self) -> str:
        blocked = ", which torch itself blocks" if self.kind.torch_limit else ""
        return (f"a known limit ({self.kind.name}: {self.kind.summary}{blocked}); the message says what "
                "to write instead, and docs/limits.md lists every limit")


class DynamicShapesError(UnsupportedError, tc.TorchUserError, tc.ConstraintViolationError):
    """A refusal about ``dynamic_shapes`` (kinds ``DYNAMIC_SHAPES_SPEC``, ``DIM_NOT_DYNAMIC``), also
    catchable as what torch.export raises there: ``torch._dynamo.exc.UserError`` (a spec that does
    not fit the call, a Dim the model specialises) and ``ConstraintViolationError`` (an example
    outside its Dim's range), so a pipeline written for torch.export keeps its ``except``."""

    def __init__(self, message: str, *, kind: Refusal, op: object = None, source: str | None = None):
        super().__init__(message, kind=kind, op=op, source=source)
        self.error_type = tc.TorchUserErrorType.CONSTRAINT_VIOLATION  # what UserError carries
        self.message = self.msg = str(self)  # torch's UserError has both; refine_dynamic_shapes_... reads .msg


class DimHintError(DynamicShapesError, ValueError):
    """A ``Dim.DYNAMIC`` / ``Dim.AUTO`` / ``Dim.STATIC`` hint whose bounds the trace contradicts (no size in
    common with the range it inferred, or one size only for ``Dim.DYNAMIC``), or a ``Dim.DYNAMIC`` on an
    example of size 0 or 1: torch.export raises ``ValueError`` there, so this is one too."""


class DataDependentError(UnsupportedError, tc.GuardOnDataDependentSymNode):
    """The model branches on (or sizes a tensor by) a value read from tensor data, with nothing
    telling the tracer which way it goes (kind ``DATA_DEPENDENT_BRANCH``); also catchable as
    torch's ``GuardOnDataDependentSymNode``, which torch.export raises there."""

    def __init__(self, message: str, *, cond: object, op: object = None, source: str | None = None):
        super().__init__(message, kind=Refusal.DATA_DEPENDENT_BRANCH, op=op, source=source)
        self.cond = cond


class VerificationError(AssertionError):
    """The exported program broke the contract or differs from eager."""
