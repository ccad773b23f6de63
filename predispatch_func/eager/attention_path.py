"""sdpa in a session takes its math path where the target has none of the device's fused kernels.

``scaled_dot_product_attention`` is a composite that asks the device which fused kernel to
run: on the CPU ``_scaled_dot_product_flash_attention_for_cpu``, on CUDA flash, memory-efficient
or cuDNN attention; none is in Core ATen. A backend that registers none of them is answered
"math" (``_scaled_dot_product_attention_math``: the matmuls and the softmax, which autograd
records op by op). A session whose target lacks the device's fused kernels now makes the same
choice, by running the composite with the fused backends switched off for the call
(``tc.fused_attention_switched_off``: what ``sdpa_kernel([SDPBackend.MATH])`` does), so what
the mode runs is what the backend would. The kernel doing it is C++ where this machine built the
session's kernels (``native/math_attention.cpp``: 60-150 us a call less than its Python twin).

It is also the cheap path: decomposing the fused kernel instead (its decomposition,
``opsets/decompositions/attention.py``, still serves a direct call of it) replayed some 50
Core ATen ops in Python for the forward and 60 for the backward, twice a layer. That direct
path stays for a target that holds the device's fused kernels, for nested tensors and for a
user who switched the math backend off.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .. import _torch_compat as tc

# the fused kernels sdpa's choice may name, by device type
FUSED_KERNELS: dict[str, tuple[str, ...]] = {
    "cpu": ("aten::_scaled_dot_product_flash_attention_for_cpu",),
    "cuda": ("aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_efficient_attention",
             "aten::_scaled_dot_product_cudnn_attention", "aten::_flash_attention_forward",
             "aten::_efficient_attention_forward", "aten::_cudnn_attention_forward"),
}


def devices_taking_math(target_op_names: frozenset[str]) -> frozenset[str]:
    """The device types whose fused attention kernels are all outside ``target_op_names``
    (overload names such as ``aten::_scaled_dot_product_flash_attention_for_cpu``); none where
    the target holds sdpa itself (the backend then answers the choice)."""
    packets = {name.partition(".")[0] for name in target_op_names}  # an op of any overload
    def outside(name: str) -> bool:
        return name not in packets
    if not outside("aten::scaled_dot_product_attention"):
        return frozenset()
    return frozenset(device for device, kernels in FUSED_KERNELS.items() if all(map(outside, kernels)))


def math_path_kernels(devices: frozenset[str], on_call: Callable[..., None] | None = None
                      ) -> list[tuple[tc.OpOverload, str, Callable[[], Any]]]:
    """sdpa's kernel for a session, with the keys it goes on and what builds it when a session
    registers it (``above_autograd.AutogradKernels``): the composite with the fused backends off
    on ``devices``, else the composite as it is. On each device's own Autograd key: a registration
    on the ``Autograd`` alias loses to sdpa's CompositeImplicitAutograd kernel. The C++ kernel
    (``native/math_attention.cpp``) where this machine built it, the Python one otherwise;
    ``on_call(op, count)`` counts the calls either served."""
    if not devices:
        return []
    sdpa = torch.ops.aten.scaled_dot_product_attention.default

    def build(key: str) -> Callable[[], Any]:
        def built() -> Any:
            from .native_registrations import native_math_attention  # (it imports the session's modules)

            return native_math_attention(key, devices, on_call) or python_kernel(devices, on_call)
        return built
    return [(sdpa, key, build(key)) for key in (f"Autograd{device.upper()}" for device in sorted(devices))]


def python_kernel(devices: frozenset[str], on_call: Callable[..., None] | None = None) -> Callable[..., Any]:
    """The math-path kernel in Python (where the C++ one is not built)."""
    sdpa = torch.ops.aten.scaled_dot_product_attention.default
    composite = sdpa.decompose  # the CompositeImplicitAutograd kernel, below this registration
    switched_off, allowed, strided = tc.fused_attention_switched_off, tc.math_attention_allowed, torch.strided

    def kernel(query: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if query.device.type in devices and query.layout is strided and not query.is_nested and allowed():
            if on_call is not None:
                on_call(sdpa, 1)
            with switched_off():
                return composite(query, *args, **kwargs)
        return composite(query, *args, **kwargs)
    return kernel
