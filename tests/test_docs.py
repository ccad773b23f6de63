"""The docs stay true to the code: names quoted in ``docs/architecture.md`` exist, paths
it and the README name exist, and every relative link in the README and ``docs/`` resolves."""

import importlib
import re
from pathlib import Path

import pytest

from tests.test_import_structure import picture

ROOT = Path(__file__).resolve().parents[1]
STAGES = picture.STAGES
ARCHITECTURE = ROOT / "docs" / "architecture.md"
# what the architecture doc calls modules by a short name (the compat layer is imported as ``tc``)
ALIASES = {"tc": ["predispatch_func._torch_compat"], "pf": ["predispatch_func"]}

_QUOTED = re.compile(r"`([^`\n]+)`")
_DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")
_PATH = re.compile(r"[\w./-]+\.(?:py|json|md|txt)")
_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _modules_by_short_name() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {key: list(value) for key, value in ALIASES.items()}
    for path in sorted((ROOT / "predispatch_func").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found.setdefault(name.rpartition(".")[2], []).append(name)
    return found


def _resolves(dotted: str, modules: list[str]) -> bool:
    """``dotted`` minus its head is an attribute path of one of ``modules`` (a module, or
    ``module.Class``)."""
    head, *attrs = dotted.split(".")
    for module in modules:
        mod_name, _, cls = module.partition(":")
        obj = importlib.import_module(mod_name)
        if cls:
            obj = getattr(obj, cls)
        for attr in attrs:
            if hasattr(obj, attr):
                obj = getattr(obj, attr)
            else:
                try:  # a submodule not imported by its package
                    obj = importlib.import_module(f"{obj.__name__}.{attr}")
                except (ImportError, AttributeError):
                    break
        else:
            return True
    return False


def _quoted(text: str) -> list[str]:
    return [m.group(1).strip() for m in _QUOTED.finditer(text)]


def _defining_modules(name: str, modules: list[str]) -> list[str]:
    """The modules of ours that have ``name`` at their top level (a class the doc names bare)."""
    return [m for m in modules if hasattr(importlib.import_module(m), name)]


def test_architecture_names_every_stage_and_every_observer():
    text = ARCHITECTURE.read_text()
    named = [f"{stage}/" for stage in STAGES if f"{stage}/" not in text]
    observer_types = {type(o).__name__ for o in _observers_of_a_pre_dispatch_mode()}
    assert observer_types, "no observer found: the check is broken"
    named += [name for name in sorted(observer_types) if f"`{name}`" not in text]
    assert not named, f"docs/architecture.md does not name: {named}"


def _observers_of_a_pre_dispatch_mode() -> tuple:
    from predispatch_func.trace import CompositePolicy
    from predispatch_func.trace.differentiable_copy import CopyTarget
    from predispatch_func.trace.stack import PolicyFunctionalMode

    return PolicyFunctionalMode(CompositePolicy(), pre_dispatch=True, copy_target=CopyTarget())._observers


def test_architecture_names_of_ours_resolve():
    short = _modules_by_short_name()
    every_module = [m for ms in short.values() for m in ms]
    names = {token.split("(")[0] for token in _quoted(ARCHITECTURE.read_text())}
    dotted = sorted(n for n in names if _DOTTED.fullmatch(n) and not _PATH.fullmatch(n))
    by_module = [n for n in dotted if n.split(".")[0] in short]
    assert len(by_module) >= 5, "the doc quotes module.function names; finding none means this test is broken"
    missing = [n for n in by_module if not _resolves(n, short[n.split(".")[0]])]
    # ``Class.method``: checked where the class is ours (torch's and the tests' are not looked up)
    by_class = [n for n in dotted if n.split(".")[0] not in short and n[0].isupper()]
    for name in by_class:
        owners = _defining_modules(name.split(".")[0], every_module)
        if owners and not _resolves(name, [f"{m}:{name.split('.')[0]}" for m in owners]):
            missing.append(name)
    assert not missing, f"docs/architecture.md names what does not exist: {missing}"


@pytest.mark.parametrize("doc", ["README.md", *sorted(p.relative_to(ROOT).as_posix()
                                                     for p in (ROOT / "docs").glob("*.md"))])
def test_paths_named_in_the_doc_exist(doc):
    text = (ROOT / doc).read_text()
    bases = [ROOT, ROOT / "predispatch_func", *(ROOT / "predispatch_func" / stage for stage in STAGES)]
    paths = {p for token in _quoted(text) for p in _PATH.findall(token) if "<" not in p and "*" not in p}
    # a bare or partial path is said inside a sentence that names its folder: it must end some real path
    ours = [f.relative_to(ROOT).as_posix() for d in ("predispatch_func", "tests", "scripts", "docs", ".ci")
            for f in (ROOT / d).rglob("*")]
    missing = sorted(p for p in paths if not any((base / p).exists() for base in bases)
                     and not any(f.endswith("/" + p) for f in ours))
    assert not missing, f"{doc} names paths that do not exist: {missing}"


def test_relative_links_resolve():
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = [f"{doc.relative_to(ROOT)}: {target}" for doc in docs for target in _LINK.findall(doc.read_text())
              if "://" not in target and not (doc.parent / target).exists()]
    assert not broken, broken


def test_the_readme_is_a_front_door():
    size = len((ROOT / "README.md").read_bytes())
    assert size <= 11_000, f"the README has {size} bytes: it is an overview, details go to docs/"
