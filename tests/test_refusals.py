"""Refusals are data: every ``UnsupportedError`` carries a :class:`Refusal` kind, and the
known limits (``docs/limits.md``, generated from ``predispatch_func/known_limits.py``) list every kind."""

import ast
import pathlib

import pytest

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
