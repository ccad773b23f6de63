"""Backend op sets: ``OpSet``, lowering a trace into one, and the ops report."""

from .lowering import (
                       Lowering,
                       MissingOp,
                       TargetMemberDecomposed,
                       TargetUnreachableError,
                       is_infrastructure,
)
from .opset import OpSet

__all__ = ["Lowering", "MissingOp", "OpSet", "TargetMemberDecomposed", "TargetUnreachableError",
           "is_infrastructure"]
