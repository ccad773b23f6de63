"""A returned view of a written input is a view of that input, as eager returns it.

Eager's ``self.b.add_(1); return self.b[1:]`` returns the buffer's own memory: the next
call's write, or an optimizer step, shows through it, and writing into it writes the buffer.
The functional program returns ``slice(add)``, a view of the *new value*, which ``module()``
then copies into the buffer; the two hold equal numbers but are different memory. So
``module()`` hands out the same view of the written tensor instead (torch.export's module
runs the mutating program and keeps this by itself).

Which outputs are such views the trace knows (``Mutations.output_views``: functional
tensors of one base share one storage, a ``copy_`` into an input joins none). Where the graph
makes the output from the written value by view ops, ``module()`` applies the same ops to the
written input (whatever its layout: an input ``x.t_()`` relaid); where a region or a HOP
returned it, the tensors say at run time where in the value it lies (``as_strided`` over the
destination, which holds the value in the same layout).
"""

from __future__ import annotations

import torch

from ..output_aliasing import memory_of


def view_of_destination(out: torch.Tensor, value: torch.Tensor, destination: torch.Tensor) -> torch.Tensor:
    """``out`` (a view of ``value``) as the same view of ``destination`` after ``value`` was
    written into it; ``out`` itself where that view cannot be told (another layout, no
    storage to compare: fake or meta tensors while the module is traced again)."""
    if memory_of(out) is not None and memory_of(out) == memory_of(destination):
        return out  # already the destination's memory (the same output returned twice)
    if memory_of(out) is not None and memory_of(value) is not None and memory_of(out) != memory_of(value):
        return _view_of_the_whole_memory(out, destination)
    if (memory_of(out) is None or value.shape != destination.shape or value.dtype != destination.dtype
            or destination.device != value.device):
        return out
    if not _laid_out_alike(value, destination):
        return out
    offset = destination.storage_offset() + out.storage_offset() - value.storage_offset()
    return adopt_memory(out, destination.detach().as_strided(out.shape, out.stride(), offset))


def _laid_out_alike(a: torch.Tensor, b: torch.Tensor) -> bool:
    """One memory layout: the same strides wherever a dimension has more than one element (a
    size-1 dimension's stride addresses nothing; a region's result may carry another one)."""
    return all(x == y for n, x, y in zip(a.shape, a.stride(), b.stride()) if n > 1)


def _view_of_the_whole_memory(out: torch.Tensor, destination: torch.Tensor) -> torch.Tensor:
    """``out`` where its memory as a whole is what ``destination.data = v`` gave the input (the
    value is no output of the program to compare with): the same view of the destination,
    laid out alike (contiguous, as a fresh value is); ``out`` itself otherwise."""
    size = destination.numel() * destination.element_size()
    if (not destination.is_contiguous() or out.dtype != destination.dtype or out.device != destination.device
            or out.untyped_storage().nbytes() != size):
        return out
    view = destination.detach().as_strided(out.shape, out.stride(), destination.storage_offset() + out.storage_offset())
    return adopt_memory(out, view)


def adopt_memory(out: torch.Tensor, view: torch.Tensor) -> torch.Tensor:
    """``view`` (the same values as ``out``, in the written input's memory) with ``out``'s autograd
    history: the program's history, checked against eager's gradients, and eager's memory."""
    if not out.requires_grad:
        return view
    if type(out) is not torch.Tensor or type(view) is not torch.Tensor:  # traced again: fakes, proxies
        return out
    with torch.no_grad():
        out.data = view
    return out
