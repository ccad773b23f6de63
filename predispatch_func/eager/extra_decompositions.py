"""ATen decompositions torch lacks, or gets wrong for eager, for ops eager kernels call.

export never meets these: ``_index_put_impl`` (the functional twin of what
autograd's index backward writes with) has only a kernel that calls its
in-place form back. (``new_empty_strided``, with which autograd allocates
gradient buffers, is in the shared table now: a model may call it too.)
Each is a one-line restatement in ops of Core ATen; the op_db coverage run
checks each against the reference.

``CORRECTED``: CPU flash attention (opsets/decompositions/attention.py, shared with export): torch returns the
attention weights as its second output where the kernel returns the
logsumexp (in the kernel's layout); a caller of the op reads it, so ours
returns the logsumexp, computed in the same pass as the output.

``SAME_KERNEL``: ops torch decomposes into a dozen ops where a Core ATen op runs the very
kernel eager runs (``native_batch_norm`` -> ``_native_batch_norm_legit``): the result is
eager's bit for bit, and a BatchNorm layer costs one op instead of five passes over its input.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .. import _torch_compat as tc
from ..opsets.decompositions import attention
from . import random_decompositions

aten = torch.ops.aten


def _index_put_impl(x: torch.Tensor, indices: Any, values: torch.Tensor, accumulate: bool = False,
                    unsafe: bool = False) -> torch.Tensor:
    return aten.index_put.default(x, indices, values, accumulate)


def _native_batch_norm(input: torch.Tensor, weight: Any, bias: Any, running_mean: Any, running_var: Any,
                       training: bool, momentum: float, eps: float) -> Any:
    """Eager's batch norm, as the Core ATen op with its kernel: ``native_batch_norm`` and
    ``_native_batch_norm_legit`` run the same kernel on the CPU and on CUDA (writing the running
    statistics where given and training). torch's decomposition spells the normalisation out in
    a dozen ops over the input, six times the kernel's time a call (tests/eager pins both)."""
    if running_mean is None and running_var is None:
        return aten._native_batch_norm_legit.no_stats(input, weight, bias, training, momentum, eps)
    if running_mean is None or running_var is None:  # as eager's kernel refuses it
        raise ValueError("running_mean and running_var must either both be None or neither be None")
    return aten._native_batch_norm_legit.default(input, weight, bias, running_mean, running_var, training,
                                                 momentum, eps)


TABLE: dict[Any, Callable] = {
    # autograd's index backward writes with _index_put_impl_ when no Python mode is active; the only
    # kernel of its functional twin clones and calls the in-place op back, a cycle
    tc.resolve_overload("aten", "_index_put_impl.default"): _index_put_impl,
}

# Ops torch does decompose, into far more work than one Core ATen op that runs the same kernel.
SAME_KERNEL: dict[Any, Callable] = {
    aten.native_batch_norm.default: _native_batch_norm,  # every BatchNorm layer of a model, each step
}


# CPU flash attention: shared with export's lowering (opsets/decompositions/attention.py)
CORRECTED: dict[Any, Callable] = dict(attention.DECOMPOSITIONS)


def for_op(op: Any) -> Callable | None:
    return (TABLE.get(op) or CORRECTED.get(op) or SAME_KERNEL.get(op)
            or random_decompositions.DECOMPOSITIONS.get(op))
