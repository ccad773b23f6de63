"""PyTorch's ``TestExport.test_state_tensors``, in our words: tensors assigned to module state in
``forward``. Registered buffers replaced by assignment are buffer mutations (exported, equal to
eager over three calls, the program's module updating its own buffers as eager's does); a plain
tensor attribute or a list of tensors replaced in ``forward`` drifts from the first call in eager
(torch.export warns and bakes the first call's values), so ours refuses it by default and keeps
torch's behaviour with ``python_state="warn"``."""

import pytest
import torch
from torch import nn

import predispatch_func as pf
from tests.support.reference import export_checked


class BufferReplacedTwice(nn.Module):
    def __init__(self):
        super().__init__()
        self.buf = nn.Buffer(torch.ones(2, 3), persistent=False)

    def forward(self, x):
        y = self.buf
        w1, w2, w3 = self.buf + 3, self.buf + 4, self.buf + 5
        self.buf = w1
        z = self.buf
        self.buf = w3
        return x + y + z + w2


class BuffersSetThroughHelpers(nn.Module):
    def __init__(self):
        super().__init__()
        for i in range(2):
            self.register_buffer(f"buf_{i}", torch.ones(2, 3), persistent=False)

    def get_tensor(self, i):
        return getattr(self, f"buf_{i}")

    def set_tensor(self, i, val):
        setattr(self, f"buf_{i}", val)

    def forward(self, x):
        y = self.get_tensor(0) + self.get_tensor(1)
        self.set_tensor(0, torch.ones(2, 3) + 2)
        self.set_tensor(1, torch.ones(2, 3) + 2)
        return x + y + self.get_tensor(0) + self.get_tensor(1)


class PlainAttributeReplaced(nn.Module):
    def __init__(self):
        super().__init__()
        self.buf = torch.ones(2, 3)

    def forward(self, x):
        y = self.buf
        self.buf = self.buf + 3
        return x + y + self.buf


class ListOfTensorsReplaced(nn.Module):
    def __init__(self):
        super().__init__()
        self.tensors = [torch.ones(2, 3), torch.ones(2, 3)]

    def forward(self, x):
        y = self.tensors[0] + self.tensors[1]
        self.tensors[0] = torch.ones(2, 3) + 2
        self.tensors[1] = torch.ones(2, 3) + 2
        return x + y + self.tensors[0] + self.tensors[1]


@pytest.mark.parametrize("model_cls, mutated", [(BufferReplacedTwice, ["buf"]),
                                                (BuffersSetThroughHelpers, ["buf_0", "buf_1"])])
def test_buffers_replaced_in_forward_are_buffer_mutations(model_cls, mutated):
    ep = export_checked(model_cls(), (torch.randn(2, 3),))
    assert list(ep.graph_signature.buffers_to_mutate.values()) == mutated
    eager, program = model_cls(), ep.module()
    for _ in range(3):  # the second call reads what the first wrote, in both
        x = torch.randn(2, 3)
        torch.testing.assert_close(program(x), eager(x))


def test_first_call_as_torch_states_it():
    ep = pf.export(BufferReplacedTwice(), (torch.randn(2, 3),))
    torch.testing.assert_close(ep.module()(torch.ones(2, 3) + 1), torch.ones(2, 3) * 12)


@pytest.mark.parametrize("model_cls, names", [(PlainAttributeReplaced, r"self\.buf was"),
                                              (ListOfTensorsReplaced, r"self\.tensors\[0\], self\.tensors\[1\] were")])
def test_plain_tensor_attributes_replaced_in_forward(model_cls, names):
    """Eager's second call differs from its first, so a program cannot replay it: refused, after
    torch.export's own warning (same text). python_state="warn" keeps torch.export's program."""
    with pytest.warns(UserWarning, match=names + " assigned during export"):
        with pytest.raises(pf.UnsupportedError) as info:
            pf.export(model_cls(), (torch.randn(2, 3),))
    assert info.value.kind is pf.Refusal.PYTHON_STATE_CHANGED
    with pytest.warns(UserWarning):
        ep = pf.export(model_cls(), (torch.randn(2, 3),), python_state="warn")
    x = torch.randn(2, 3)
    torch.testing.assert_close(ep.module()(x), model_cls()(x))  # the first call only
