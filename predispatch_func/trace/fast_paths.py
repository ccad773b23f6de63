"""Module fast paths that eager takes and a trace cannot, replaced by what they compute.

``nn.TransformerEncoder`` in eval mode, with grad off (``torch.no_grad()`` or
``inference_mode`` around the call) and a ``src_key_padding_mask``, packs the
batch into a nested tensor, runs the layers on the valid tokens only and pads
back with zeros: padded positions come out as 0 (before the final norm). A
nested tensor's sizes depend on the mask's values, which a fake trace cannot
hold, so tracing (ours and torch.export's) runs the dense path, where padded
positions hold whatever the layers computed there (up to 2.2 away in our
test). :func:`eager_fast_paths` makes the trace compute eager's result: the
dense path, then padded rows zeroed exactly when eager's nested path would run
(the mask left-aligned, eager's ``mask_check``, decided in the graph).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from .. import _torch_compat as tc


def _takes_nested_path(encoder: torch.nn.TransformerEncoder, src: torch.Tensor, mask: Any,
                       key_padding_mask: Any) -> bool:
    """The conditions of ``TransformerEncoder.forward``'s nested path known at trace time.

    With grad on, eager takes it only if no weight requires grad; a trainable
    model's weights do, so a trace with grad on keeps the dense path.
    """
    first = encoder.layers[0]
    return (torch.backends.mha.get_fastpath_enabled() and getattr(encoder, "use_nested_tensor", False)
            and not first.training and src.dim() == 3 and key_padding_mask is not None
            and mask is None and not src.is_nested and not torch.is_autocast_enabled()
            and not torch.is_autocast_enabled(src.device.type)
            and src.device.type in ("cpu", "cuda") and not torch.is_grad_enabled())


def _encoder_forward(original: Any) -> Any:
    def forward(self: torch.nn.TransformerEncoder, src: torch.Tensor, mask: Any = None,
                src_key_padding_mask: Any = None, is_causal: Any = None) -> torch.Tensor:
        if not _takes_nested_path(self, src, mask, src_key_padding_mask):
            return original(self, src, mask, src_key_padding_mask, is_causal)
        norm = self._modules.get("norm")
        self._modules["norm"] = None
        try:
            out = original(self, src, mask, src_key_padding_mask, is_causal)
        finally:
            self._modules["norm"] = norm
        canonical = tc.canonical_key_padding_mask(src_key_padding_mask, src.dtype)
        valid = canonical.logical_not()  # as eager's _nested_tensor_from_mask reads it
        zeroed = out.masked_fill(valid.logical_not().unsqueeze(-1), 0.0)
        if getattr(self, "mask_check", True):  # eager: dense path unless the mask is left-aligned
            as_int = valid.to(torch.int32)
            left_aligned = (as_int.cummin(dim=1).values == as_int).all()
            zeroed = torch.where(left_aligned, zeroed, out)
        return norm(zeroed) if norm is not None else zeroed
    return forward


@contextlib.contextmanager
def eager_fast_paths() -> Iterator[None]:
    """While tracing, modules with an untraceable fast path compute what it computes."""
    with tc.method_replaced(torch.nn.TransformerEncoder, "forward", _encoder_forward):
        yield
