"""Refusals are data: every ``UnsupportedError`` carries a :class:`Refusal` kind, and the
known limits (``docs/limits.md``, generated from ``predispatch_func/known_limits.py``) list every kind."""

import ast
import pathlib

import pytest
import torch

import predispatch_func as pf
from predispatch_func import known_limits

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_limits_doc_is_generated_from_the_code():
    assert (ROOT / "docs" / "limits.md").read_text() == known_limits.render(), \
        "docs/limits.md is stale: run python scripts/gen_limits.py"


def test_limits_doc_lists_every_refusal_kind():
    section = (ROOT / "docs" / "limits.md").read_text()
    missing = [k.name for k in pf.Refusal if f"`{k.name}`" not in section]
    assert not missing, f"docs/limits.md does not list {missing}"
    torch_blocked = {k.name for k in pf.Refusal if k.torch_limit}
    marked = {k.name for k in pf.Refusal if f"| `{k.name}` | *(torch)*" in section}
    assert marked == torch_blocked


def test_a_kind_without_text_stops_the_generator(monkeypatch):
    texts = dict(known_limits.WHAT_IS_REFUSED)
    del texts[pf.Refusal.STORAGE_SWAP]
    monkeypatch.setattr(known_limits, "WHAT_IS_REFUSED", texts)
    with pytest.raises(ValueError, match="STORAGE_SWAP"):
        known_limits.render()


def test_every_unsupported_error_in_the_package_names_its_kind():
    unnamed = []
    for path in (ROOT / "predispatch_func").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None))
                    == "UnsupportedError" and not any(k.arg == "kind" for k in node.keywords)):
                unnamed.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not unnamed, unnamed


# --- a write to a view whose elements overlap ------------------------------------------------


class AbsInPlaceOnOverlappingUnfold(torch.nn.Module):
    """PyTorch's ``test_functionalization.py::test_mutation_overlapping_mem``: windows of 3 with
    a step of 2, so the views share one element each."""

    def forward(self, x):
        t1 = torch.add(x, x)
        t2 = t1.unfold(1, 3, 2)
        return t2.abs_()


class AbsOutOfPlaceOnOverlappingUnfold(torch.nn.Module):
    def forward(self, x):
        return torch.add(x, x).unfold(1, 3, 2).abs()


def test_write_to_a_view_whose_elements_overlap_is_refused_naming_the_line_and_the_fix():
    """Was torch's functionalization message wrapped as a generic ExportError."""
    with pytest.raises(pf.UnsupportedError) as info:
        pf.export(AbsInPlaceOnOverlappingUnfold(), (-torch.ones(1, 5),))
    assert info.value.kind is pf.Refusal.WRITE_TO_OVERLAPPING_VIEW
    message = str(info.value)
    assert "aten.abs_" in message, message
    assert "test_refusals.py" in message and "t2.abs_()" in message, message
    assert "out of place" in message and ".abs()" in message, message


def test_the_out_of_place_form_the_refusal_names_exports_and_equals_eager():
    from tests.support.reference import export_checked

    export_checked(AbsOutOfPlaceOnOverlappingUnfold(), (-torch.ones(1, 5),))
