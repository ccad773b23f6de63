"""Texts of torch's error messages that we translate into refusals.

Each entry is torch's half of a translation: the exception type torch raises
and the text(s) its message must hold. Our half (the ``Refusal`` kind and what
to write instead) lives with the code that translates: ``trace/refusals.py``
(failures while an op is traced) and ``trace/extensions/torch_limits.py`` (failures while
torch captures a higher-order op's body).

What breaks here on a torch upgrade: torch rewords a message, or raises another
type. The refusal then no longer fires and the user gets torch's raw error (or,
where torch fixed the limit, nothing: the case exports). Every entry is
provoked on the installed torch by ``tests/torch_compat/test_torch_error_texts.py``, which
also checks that no entry goes without a provoking program.
"""

from __future__ import annotations

from dataclasses import dataclass

from .reexports import UNCAPTURED_HOP_ERROR


@dataclass(frozen=True)
class TorchErrorText:
    """An error torch raises: its type, and texts that must all be in its message."""

    exc_type: type[BaseException]
    texts: tuple[str, ...] = ()

    def matches(self, exc: BaseException) -> bool:
        return isinstance(exc, self.exc_type) and all(t in str(exc) for t in self.texts)


# functionalization cannot grow a graph input or buffer with resize_()
RESIZE_VIEW_TO_LARGER = TorchErrorText(RuntimeError, ("Attempted to resize a view tensor to a larger size",))

# functionalization rebuilding a view(dtype), under no_grad, of a tensor written before:
# the fake tensor's storage check refuses the meta storage
SET_STORAGE_OTHER_DEVICE = TorchErrorText(RuntimeError, ("Attempted to set the storage of a tensor on device",))

# functionalization of an in-place op on a view whose elements overlap (t.unfold(1, 3, 2).abs_())
MUTATION_WITH_INTERNAL_OVERLAP = TorchErrorText(
    RuntimeError, ("encountered a tensor being mutated that has internal overlap",))

# functionalization replaying .view() on a value written through a non-contiguous alias
CANNOT_VIEW = TorchErrorText(ValueError, ("Cannot view a tensor",))

# functionalization of a write through as_strided() of another view (pytorch/pytorch#104505)
AS_STRIDED_IN_VIEW_CHAIN = TorchErrorText(RuntimeError, ("where view 1 was an as_strided() call",))

# fill.Tensor / masked_fill.Tensor under autograd with an integer self and a value requiring grad
AUTOGRAD_NOT_SUPPORT_DTYPE = TorchErrorText(RuntimeError, ("Autograd not support dtype",))

# dynamo's capture of a HOP's operands, one of which is a while_loop result computed with
# grad on (its storage offset holds the unbacked trip count); raised from inside
# torch/_higher_order_ops/ (the path is in the message's traceback)
WHILE_LOOP_RESULT_AS_HOP_OPERAND = TorchErrorText(
    RuntimeError, ("'<' not supported between instances of 'NoneType' and 'int'", "torch/_higher_order_ops/"))

# dynamo could not capture a HOP body whole because it writes its operands or a closed-over
# tensor (other reasons, a graph break in the body, raise the same type with another text)
HOP_BODY_INPUT_MUTATION = TorchErrorText(UNCAPTURED_HOP_ERROR,
                                         ("Encountered input mutation during higher order op tracing",))

# torch.vmap (or another torch.func transform) inside a HOP body captured by dynamo, at pre-dispatch
FUNCTIONAL_TENSOR_ON_ITS_OWN = TorchErrorText(RuntimeError, ("Attempting to use FunctionalTensor on its own",))

# functionalization of a HOP body re-runs it without the autocast region inside it
TENSOR_DTYPE_MISMATCH = TorchErrorText(AssertionError, ("Tensor dtype mismatch",))


ENTRIES: dict[str, TorchErrorText] = {
    name: value for name, value in globals().items() if isinstance(value, TorchErrorText)}
"""Every entry, by its name here."""

__all__ = ["TorchErrorText", "ENTRIES", *ENTRIES]
