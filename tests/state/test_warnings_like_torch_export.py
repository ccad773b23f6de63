"""Warnings torch.export gives about state the program cannot carry, given by ours too.

A drop-in user's pipeline may watch for them (torch's own TestExport does): a
tensor attribute assigned in ``forward``, and, when
``torch._export.config.detect_non_strict_fake_tensor_leaks`` is set, traced
tensors the model keeps past export.
"""

from __future__ import annotations

import gc
import re
import warnings

import pytest
import torch
import torch._export.config as export_config

import predispatch_func as pf
from predispatch_func.errors import Refusal, UnsupportedError
from tests.support.reference import export_checked

_ASSIGNED = "The tensor attribute self.{} was assigned during export"


class AssignsTensorAttribute(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.t = torch.ones(2, 3)

    def forward(self, x):
        y = self.t
        self.t = self.t + 3
        return x + y + self.t


def test_assigned_tensor_attribute_warns_as_torch_export():
    model = AssignsTensorAttribute()
    # eager's second call sees t + 3 again: a program would repeat the first call, so by default
    # the change is judged and refused (torch.export only warns and replays the first call)
    with pytest.warns(UserWarning, match=re.escape(_ASSIGNED.format("t"))):
        with pytest.raises(UnsupportedError, match="assigns tensor attribute 't'") as refused:
            pf.export(model, (torch.randn(2, 3),))
    assert refused.value.kind is Refusal.PYTHON_STATE_CHANGED
    with pytest.warns(UserWarning, match=re.escape(_ASSIGNED.format("t"))):
        ep = export_checked(model, (torch.randn(2, 3),), python_state="warn")  # replays the first call
    with pytest.warns(UserWarning, match=re.escape(_ASSIGNED.format("t"))):
        torch.export.export(AssignsTensorAttribute(), (torch.randn(2, 3),))
    assert torch.equal(model.t, torch.ones(2, 3)), "exporting changed the model"
    assert ep is not None


def test_tensors_assigned_in_a_list_attribute_are_named_by_index():
    class InList(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tensors = [torch.ones(2), torch.ones(2)]

        def forward(self, x):
            self.tensors[0] = x + 1
            self.tensors[1] = x + 2
            return x * 2

    with pytest.warns(UserWarning, match=re.escape("The tensor attributes self.tensors[0], self.tensors[1] were "
                                                   "assigned during export")):
        export_checked(InList(), (torch.randn(2),), python_state="warn")


def test_buffers_and_untouched_attributes_do_not_warn():
    class Fine(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("buf", torch.zeros(2))
            self.t = torch.ones(2)

        def forward(self, x):
            self.buf.add_(x)
            return x + self.t

    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="The tensor attribute")
        export_checked(Fine(), (torch.randn(2),))


def keeps_traced_tensors(bank: list) -> torch.nn.Module:
    class KeepsTracedTensors(torch.nn.Module):
        def forward(self, x, y):
            z = x + y
            bank.append(lambda: z)  # a closure in a list the model does not own keeps z alive
            return z.sin()

    return KeepsTracedTensors()


def test_leaked_tensors_are_reported_with_the_line_that_made_them():
    bank: list = []
    with export_config.patch(detect_non_strict_fake_tensor_leaks=True), \
            pytest.warns(UserWarning, match=r"Detected 1 fake tensors that are still alive after export") as got:
        export_checked(keeps_traced_tensors(bank), (torch.randn(3), torch.randn(3)))
    text = "\n".join(str(w.message) for w in got)
    assert re.search(r'test_warnings_like_torch_export\.py", line \d+, in forward\n\s*z = x \+ y', text), text
    bank.clear()
    # the switch and the phrase are torch.export's: it still reads one and says the other
    with export_config.patch(detect_non_strict_fake_tensor_leaks=True), \
            pytest.warns(UserWarning, match=r"Detected 1 fake tensors that are still alive after export"):
        torch.export.export(keeps_traced_tensors(bank), (torch.randn(3), torch.randn(3)), strict=False)
    bank.clear()


def test_no_leak_report_when_nothing_is_kept_or_the_switch_is_off():
    class Clean(torch.nn.Module):
        def forward(self, x):
            return (x + 1).relu()

    with export_config.patch(detect_non_strict_fake_tensor_leaks=True), warnings.catch_warnings():
        warnings.filterwarnings("error", message="Detected")
        export_checked(Clean(), (torch.randn(3),))
    bank: list = []
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="Detected")
        export_checked(keeps_traced_tensors(bank), (torch.randn(3), torch.randn(3)))
    bank.clear()
    gc.collect()
