"""Writes through a ``detach()``-ed alias: eager changes the data and keeps each tensor's
autograd history. Carried where no gradient can tell (a no_grad write keeping the identity,
the grad reach of the written value cut at a detach), refused where eager would give one
storage two histories (GRAD_VALUE_THROUGH_DETACH), also when the program runs."""

import torch
from torch import nn


class WriteThroughDetach(nn.Module):
    def forward(self, x):
        x.detach().add_(1)  # eager: writes x, allowed even when x requires grad
        return x * 2


def test_write_through_detach_to_input_that_requires_grad():
    # torch's own module() refuses the copy_ write-back on such a leaf; ours writes it back
    # under no_grad, and the write is a no_grad region keeping x's autograd identity
    from tests.support.reference import export_checked

    export_checked(WriteThroughDetach(), (torch.randn(3),))
