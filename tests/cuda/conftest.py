"""Fixtures of the CUDA tests.

cuBLAS reads ``CUBLAS_WORKSPACE_CONFIG`` when it creates its first handle, so it is set here,
before any test touches the GPU; it only takes effect where a test asks for deterministic kernels.
"""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


@pytest.fixture
def deterministic_kernels():
    """Deterministic CUDA kernels for the reference and the program alike: in bf16, the backward of
    attention and of scatter-like ops accumulates with atomics, so eager differs from itself from
    run to run (vit's bf16 parameter gradients by up to 1.0 on the H200), and a replay could
    not tell our error from eager's noise. Ops with no deterministic kernel only warn."""
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
