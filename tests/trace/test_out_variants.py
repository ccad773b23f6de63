"""``out=`` overloads: run as their functional overload plus the writes, keeping the autograd
identity of what they write (a keyword-only ``out=`` is a write too)."""

import torch
from expecttest import TestCase

from tests.support.reference import export_checked


class OutVariantWriteUnderNoGrad(torch.nn.Module):
    def forward(self, x):
        v = x.view_as(x)
        with torch.no_grad():
            torch.clamp(v, -1, 2, out=v)  # out= is keyword-only: once not seen as a write
        return v


class TestWritesFoundByExtendedGenerator(TestCase):
    def test_out_variant_write_under_no_grad_keeps_autograd_identity(self):
        export_checked(OutVariantWriteUnderNoGrad(), (torch.randn(2, 3),))
