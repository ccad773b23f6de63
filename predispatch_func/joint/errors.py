"""What ``export_joint`` refuses, as data: a :class:`JointProblem` kind on each error."""

from __future__ import annotations

import enum

from ..errors import ExportError
from ..inputs.input_check import InputError


class JointProblem(enum.Enum):
    """Why a joint export was refused (tests match on the kind, never on message text)."""

    NO_SCALAR_LOSS = "the loss is not a scalar floating-point tensor"
    LOSS_WITHOUT_GRAD = "the loss does not require grad"
    FOREIGN_OPTIMIZER_PARAMETERS = "the optimizer updates tensors that are not the model's parameters"
    UNSUPPORTED_OPTIMIZER = "an optimizer (or an option of it) the joint program cannot carry"
    BAD_ARGUMENT = "an argument of export_joint out of its range (clip_grad_norm not positive, or without an optimizer)"
    SAVED_VALUE_NOT_RECOMPUTABLE = "the backward reads a value a kept op made that cannot be recomputed"
    UNSUPPORTED_MODEL = ("a model the joint export cannot take yet (an fx GraphModule, a tensor subclass built or "
                         "read apart in forward)")
    UNSUPPORTED_HOOK = "a hook on a parameter the joint program cannot run (post-accumulate-grad)"
    UNSUPPORTED_HOP = "a torch control-flow op whose backward the joint program cannot record (a value its body reads unrecorded)"
    STATE_WRITTEN_WITH_HISTORY = ("a buffer or input written with a value that requires grad: eager's next "
                                  "step backpropagates through it into this step's graph")


class JointError(InputError):
    """Bad input to ``export_joint`` (a loss that is no loss, a foreign optimizer), or a forward whose
    backward cannot be recorded; ``kind`` names which (:class:`JointProblem`)."""

    def __init__(self, message: str, *, kind: JointProblem | str):
        self.kind = kind if isinstance(kind, JointProblem) else JointProblem[kind]
        ExportError.__init__(self, message)


__all__ = ["JointError", "JointProblem"]
