"""Print the package's import picture: cycles among its modules and imports that point upward.

Reads the source with ``ast`` (imports inside functions included), so what it
shows is what the code says, not what one run happened to import. "Upward"
means a stage package importing one that sits later in the pipeline
(``trace/`` reaching into ``regions/``, ``passes/`` into ``program/``): ``STAGES``
is that order, written once.

    python scripts/import_picture.py [package_dir]
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

# the stage packages in the order data flows; a stage imports only earlier ones
STAGES = ("inputs", "state", "trace", "regions", "passes", "program")


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, root: Path, known: set[str]) -> dict[str, bool]:
    """Module -> whether some import of it sits inside a function (True) or only at the top (False)."""
    this = module_name(path, root)
    package = this if path.name == "__init__.py" else this.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    found: dict[str, bool] = {}

    def add(name: str, nested: bool) -> None:
        while name and name not in known:  # `from .x import y`: y may be a name, not a module
            name = name.rpartition(".")[0]
        if name and name != this:
            found[name] = found.get(name, False) or nested

    def visit(node: ast.AST, nested: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = nested or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                for alias in child.names:
                    add(alias.name, inner)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")[:len(package.split(".")) - child.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                for alias in child.names:
                    add(f"{base}.{alias.name}" if base else alias.name, inner)
            visit(child, inner)

    visit(tree, False)
    return found


def graph_of(root: Path) -> dict[str, dict[str, bool]]:
    files = sorted(root.rglob("*.py"))
    known = {module_name(f, root) for f in files}
    return {module_name(f, root): imports_of(f, root, known) for f in files}


def cycles(graph: dict[str, dict[str, bool]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            strong(v)
    return sorted(found)


def stage_of(module: str, top: str) -> int | None:
    """The position of ``module``'s stage package in :data:`STAGES`; None outside the stages."""
    parts = module.split(".")
    return STAGES.index(parts[1]) if parts[0] == top and len(parts) > 1 and parts[1] in STAGES else None


def upward(graph: dict[str, dict[str, bool]], top: str) -> list[tuple[str, str, bool]]:
    """(importer, imported, nested) for each import of a later stage by an earlier one."""
    out = []
    for src, targets in sorted(graph.items()):
        here = stage_of(src, top)
        if here is None:
            continue
        for dst, nested in sorted(targets.items()):
            there = stage_of(dst, top)
            if there is not None and there > here:
                out.append((src, dst, nested))
    return out


def main() -> None:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent.parent / "predispatch_func").resolve()
    graph = graph_of(root)
    found = cycles(graph)
    print(f"{len(graph)} modules, {sum(len(t) for t in graph.values())} internal imports, "
          f"{sum(nested for t in graph.values() for nested in t.values())} of them inside functions")
    print(f"import cycles: {len(found)}")
    for component in found:
        print("  " + " <-> ".join(component))
    ups = upward(graph, root.name)
    print(f"upward imports: {len(ups)}")
    for src, dst, nested in ups:
        print(f"  {src} -> {dst}{' (inside a function)' if nested else ''}")


if __name__ == "__main__":
    main()
