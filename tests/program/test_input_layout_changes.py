"""In-place layout changes of inputs and buffers (``t_``, ``unsqueeze_``, ``as_strided_``,
``resize_``, ...): a static new layout is carried, ``ep.module()`` giving the input eager's
layout before writing it back; a symbolic new layout has no write-back and is refused."""

import torch
from expecttest import TestCase
from torch import nn

import predispatch_func as pf
from tests.support.expect_refusal import at_line, refused


class TestMetadataMutationOfInputs(TestCase):
    """Static layout changes are carried (test_conformance_regressions.py); a symbolic
    new layout has no write-back."""

    def test_t_inplace_on_dynamic_input_is_refused(self):
        class M(nn.Module):
            def forward(self, x):
                x.t_()
                return x + 1

        with refused(pf.Refusal.INPUT_METADATA_MUTATION, r"in-place metadata[\s\S]*aten\.t_\.default[\s\S]*"
                                    + at_line(__file__, r"x\.t_\(\)")):
            pf.export(M(), (torch.randn(2, 3),), dynamic_shapes=({0: torch.export.Dim("a"), 1: torch.export.Dim("b")},))

    def test_unsqueeze_inplace_on_dynamic_input_is_refused(self):
        class M(nn.Module):
            def forward(self, x):
                y = x * 2
                x.unsqueeze_(0)
                return y

        with refused(pf.Refusal.INPUT_METADATA_MUTATION, r"aten\.unsqueeze_\.default[\s\S]*"
                                    + at_line(__file__, r"x\.unsqueeze_\(0\)")):
            pf.export(M(), (torch.randn(3),), dynamic_shapes=({0: torch.export.Dim("n")},))
