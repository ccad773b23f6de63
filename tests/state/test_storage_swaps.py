"""``set_`` in forward. From a tensor onto an intermediate (or a ``.data`` alias) it is carried:
the target becomes an alias of the source, so a later write through it reaches the source, as
in eager. Onto a graph input or buffer, from a Storage, or with a source that requires grad
(eager's set_ has no derivative), it is our clear refusal naming the op and the user's line,
never torch's raw program check (``SpecViolationError``: "aten.set_ is not functional"), and
the caller's tensors and model are left as they were.

torch.export's non-functional program keeps the ``set_`` and equals eager where its
source is a tensor (a Storage source fails it too); a functional program has no
memory for the caller's tensor to share with another (docs/limits.md, ``STORAGE_SWAP``).
"""

import pytest
import torch
from torch import nn

import predispatch_func as pf
from tests.support.expect_refusal import refused
from tests.support.reference import assert_same_caller_state, caller_state, export_checked, mutations


class SetForm(nn.Module):
    def __init__(self, form):
        super().__init__()
        self.form = form
        self.register_buffer("buf", torch.zeros(3))

    def forward(self, x, y):
        if self.form == "tensor":
            x.set_(y)
        elif self.form == "storage":
            x.set_(y.untyped_storage())
        elif self.form == "storage_offset_size_stride":
            x.set_(y.untyped_storage(), 1, (2,), (2,))
        elif self.form == "empty":
            x.set_()
        elif self.form == "buffer":
            self.buf.set_(y)
            return self.buf * 2
        elif self.form == "under_no_grad":
            with torch.no_grad():
                x.set_(y)
        elif self.form == "through_data":
            x.data.set_(y)
        elif self.form == "intermediate_then_written":
            t = torch.empty(0)
            t.set_(y)
            t.add_(1)
            return t * 2
        return x * 2


FORMS = ["tensor", "storage", "storage_offset_size_stride", "empty", "buffer", "under_no_grad", "through_data",
         "intermediate_then_written"]
CARRIED = ["through_data", "intermediate_then_written"]


@pytest.mark.parametrize("form", CARRIED)
def test_set_onto_an_intermediate_is_carried(form):
    """verify replays with float inputs requiring grad where eager can backpropagate (through_data);
    eager's backward through set_ raises (intermediate_then_written), so only values compare there."""
    ep = export_checked(SetForm(form), (torch.randn(3), torch.randn(6)))
    assert "set_" not in ep.graph_module.code
    if form == "intermediate_then_written":  # t aliases y: t.add_(1) wrote y
        assert mutations(ep) == [("USER_INPUT_MUTATION", "y")]


def test_set_then_writes_through_either_alias():
    class M(nn.Module):
        def forward(self, x):
            t = x * 2
            u = x.sum(0)
            t.set_(u)
            t.mul_(3)  # u sees it
            u.add_(1)  # t sees it
            return t + 1, u

    export_checked(M(), (torch.randn(3, 4),))


def test_set_from_a_tensor_that_requires_grad_is_refused():
    class M(nn.Module):
        def forward(self, x):
            t = torch.empty(0)
            t.set_(x * 2)
            return t + 1

    with refused(pf.Refusal.STORAGE_SWAP, r"requires grad[\s\S]*no derivative[\s\S]*test_storage_swaps\.py"):
        pf.export(M(), (torch.randn(3, requires_grad=True),))


@pytest.mark.parametrize("form", [f for f in FORMS if f not in CARRIED])
def test_set_form_is_a_clear_refusal_that_changes_nothing(form):
    model, args = SetForm(form), (torch.randn(3), torch.randn(6))
    before = caller_state(model, args)
    with refused(pf.Refusal.STORAGE_SWAP, r"set_[\s\S]*test_storage_swaps\.py"):
        pf.export(model, args)
    assert_same_caller_state(before, caller_state(model, args), form)


def test_set_to_another_shape_then_indexed():
    """Indexing reads the tracing tensor's own sizes: after set_ they are the source's
    (tc.mirror_storage_swap), not the target's old ones."""
    class M(nn.Module):
        def forward(self, x):
            t = x * 2            # (3, 4)
            u = x.sum(0)         # (4,)
            t.set_(u)
            t[1:].mul_(3)        # reaches u
            return t.shape[0] * t, u

    export_checked(M(), (torch.randn(3, 4),))
