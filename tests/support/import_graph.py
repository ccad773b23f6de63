"""The package's import graph, read from source (ast) without importing anything.

Every ``import``/``from ... import`` counts, also those made inside a function
(a deferred import hides a dependency, it does not remove it); only those under
``if TYPE_CHECKING:`` are left out, since they never run. ``from . import x``
names the submodule ``x`` where one exists. An edge goes to the module that is
named, not to the packages above it that Python also initialises, so a cycle
reported here is a cycle a reader sees in the code.

Run it to print the picture: ``python -m tests.support.import_graph``.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

PACKAGE = "predispatch_func"
ROOT = Path(__file__).resolve().parents[2]


def module_files(root: Path = ROOT, package: str = PACKAGE) -> dict[str, Path]:
    """Dotted module name -> file, for every module of ``package`` (``__init__`` names the package)."""
    files = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        files[".".join(parts)] = path
    return files


def _is_type_checking_block(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _import_nodes(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        for child in ast.iter_child_nodes(node):
            if not _is_type_checking_block(child):
                stack.append(child)


def _owner(name: str, modules: dict[str, Path]) -> str | None:
    """The longest module of ours that ``name`` is or lies in (an attribute import names its module)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def imports_of(module: str, modules: dict[str, Path]) -> set[str]:
    """The modules of ours that ``module`` imports."""
    path = modules[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in _import_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            # ``from pkg import sub`` imports the submodule where one exists
            targets = [f"{prefix}.{alias.name}" if f"{prefix}.{alias.name}" in modules else prefix
                       for alias in node.names]
        for target in targets:
            owner = _owner(target, modules)
            if owner is not None and owner != module:
                found.add(owner)
    return found


def import_graph(root: Path = ROOT, package: str = PACKAGE) -> dict[str, set[str]]:
    modules = module_files(root, package)
    return {module: imports_of(module, modules) for module in modules}


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module, each sorted (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(components)


def subpackage(module: str, package: str = PACKAGE) -> str | None:
    """``predispatch_func.hop.ops`` -> ``hop``, ``predispatch_func.hop`` -> ``hop``;
    None for a top-level module (``predispatch_func.cli``) or the package itself."""
    parts = module.split(".")
    if len(parts) > 2 or (len(parts) == 2 and f"{package}.{parts[1]}" in _packages(package)):
        return parts[1]
    return None


@functools.cache
def _packages(package: str = PACKAGE) -> frozenset[str]:
    return frozenset(name for name, path in module_files(ROOT, package).items() if path.name == "__init__.py")


def upward_imports(graph: dict[str, set[str]], names: tuple[str, ...],
                   package: str = PACKAGE, exempt: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """(importer, imported) where a module inside a subpackage (other than ``exempt`` ones)
    imports one of the top-level modules ``names``, or anything inside them."""
    banned = tuple(f"{package}.{name}" for name in names)
    return sorted((src, dst) for src, targets in graph.items() for dst in targets
                  if subpackage(src) not in (None, *exempt)
                  and any(dst == b or dst.startswith(b + ".") for b in banned))


def picture(graph: dict[str, set[str]] | None = None) -> str:
    """The cycles and the imports from subpackages up to top-level modules, as text."""
    graph = import_graph() if graph is None else graph
    lines = [f"{len(graph)} modules, {sum(map(len, graph.values()))} import edges"]
    cycles = import_cycles(graph)
    lines.append(f"{len(cycles)} import cycle(s):")
    lines += ["  " + " <-> ".join(m.removeprefix(PACKAGE + ".") for m in c) for c in cycles]
    up = sorted((s, d) for s, ds in graph.items() for d in ds
                if subpackage(s) not in (None, "commands") and subpackage(d) is None and d != PACKAGE)
    lines.append(f"{len(up)} import(s) from a library subpackage up to a top-level module:")
    lines += [f"  {s.removeprefix(PACKAGE + '.')} -> {d.removeprefix(PACKAGE + '.')}" for s, d in up]
    return "\n".join(lines)


if __name__ == "__main__":
    print(picture())
