"""Refusals are data: every ``UnsupportedError`` carries a :class:`Refusal` kind, and the
README's known limits list every kind."""

import ast
import pathlib

import predispatch_func as pf

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _known_limits_section() -> str:
    readme = (ROOT / "README.md").read_text()
    start = readme.index("## Known limits")
    end = readme.find("\n## ", start + 1)
    return readme[start:end if end >= 0 else None]


def test_readme_lists_every_refusal_kind():
    section = _known_limits_section()
    missing = [k.name for k in pf.Refusal if f"`{k.name}`" not in section]
    assert not missing, f"README's known limits do not list {missing}"
    torch_blocked = {k.name for k in pf.Refusal if k.torch_limit}
    marked = {k.name for k in pf.Refusal if f"| `{k.name}` | *(torch)*" in section}
    assert marked == torch_blocked


def test_every_unsupported_error_in_the_package_names_its_kind():
    unnamed = []
    for path in (ROOT / "predispatch_func").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None))
                    == "UnsupportedError" and not any(k.arg == "kind" for k in node.keywords)):
                unnamed.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not unnamed, unnamed
