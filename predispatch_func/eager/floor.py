"""The runtime floor: what eager execution needs besides a functional op set.

A backend's op set (Core ATen, or Core ATen plus its fused ops) is functional:
every op returns fresh tensors. Eager execution also writes into existing
memory, allocates, and hands out views that share memory with their base, and
no decomposition can express those in functional ops. So a backend runs
eagerly on its set only if it also implements this floor. Each entry says why
it cannot be decomposed away; ``tests/eager/test_eager_floor.py`` takes each one out
and shows what then fails.

``pf.eager.on(target)`` runs on ``target | RUNTIME_FLOOR`` (the floor is not
part of a functional set by definition, so asking users to add it would only
make every call longer); ``pf.eager.register(key, target)`` refuses, up front
and by name, a backend that has no kernel for a floor op.
"""

from __future__ import annotations

import torch

from ..opsets import OpSet

aten = torch.ops.aten

WHY: dict[str, str] = {
    "aten.copy_.default": "the write: an in-place or out= op outside the set runs as its functional "
                          "form, whose result is then written into the destination's memory",
    "aten.resize_.default": "out= tensors of another size are resized before the write, as eager's "
                            "out= kernels do (a functional op cannot change a tensor's size in place)",
    "aten.as_strided_.default": "in-place view ops (transpose_, squeeze_, unsqueeze_, t_) change the "
                                "geometry of the tensor the caller holds, keeping its memory",
    "aten.empty.memory_format": "allocation: out= results, autograd's zero gradients and most "
                                "decompositions' outputs start as uninitialised memory",
    "aten.empty_strided.default": "allocation with a given layout (empty_like of a strided tensor, "
                                  "autograd's gradient buffers)",
    "aten.as_strided.default": "the universal view: decompositions of view ops (unfold, diagonal, "
                               "narrow...) land on it, and its result must share memory",
    "aten.view.default": "reshaping views (reshape, flatten, _unsafe_view land on it); a copy would break "
                         "eager's aliasing of later writes",
    "aten.set_.source_Storage": "a tensor given existing memory (deepcopy, torch.load, Tensor.set_): "
                                "sharing memory is what it does, a copy would not",
    "aten.set_.source_Storage_storage_offset": "the same with an offset, sizes and strides "
                                              "(deepcopy of a view, Tensor.set_(storage, offset, size))",
    "aten.view_as_real.default": "a complex tensor's memory read as pairs of reals: a view that changes the dtype "
                                 "(as_strided keeps it), and writes through it must reach the complex tensor "
                                 "(fft's real transforms, stft, .imag and our complex decompositions use it)",
    "aten.view_as_complex.default": "pairs of reals read as one complex tensor, the same memory: the other direction "
                                    "of view_as_real (complex(), polar() and complex conjugation are built on it)",
    "aten._local_scalar_dense.default": "Python reading a value (.item(), if x: ...): the value leaves the "
                                        "device, no tensor op can return it",
}
_RANDOM_FILLS = ("aten.uniform_.default", "aten.normal_.default", "aten.bernoulli_.float", "aten.bernoulli_.Tensor",
                 "aten.random_.default", "aten.random_.from", "aten.random_.to", "aten.exponential_.default",
                 "aten.geometric_.default", "aten.log_normal_.default", "aten.cauchy_.default")
WHY.update({name: "random fills: torch's random ops (rand_like, dropout, bernoulli, randint...) draw "
                  "through them, so a backend that has them draws from the generator as eager does"
            for name in _RANDOM_FILLS})
WHY["aten.bernoulli_.float"] += (" (a probability p with 1 - (1 - p) == p lowers to Core ATen's native_dropout, "
                                 "whose CPU mask is the same draws; any other p needs the fill)")


def _floor() -> OpSet:
    return OpSet.from_names(sorted(WHY), name="runtime_floor")


RUNTIME_FLOOR: OpSet = _floor()


def lacking(ops: OpSet) -> list[str]:
    """The floor ops ``ops`` does not hold, by name."""
    return [name for name in RUNTIME_FLOOR.names() if name not in ops.names()]
