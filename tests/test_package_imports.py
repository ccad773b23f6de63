"""The package's import structure, read statically (tests/support/import_graph.py).

The command line sits on top: ``cli.py`` and ``commands/`` may import the
library; no library package imports them, nor the ``export`` front module that
assembles a program from the pipeline. The import cycles that remain are
printed, and pinned so a new one shows up here.
"""

from tests.support.import_graph import PACKAGE, import_cycles, import_graph, picture, upward_imports

# the front modules: the command line, and export() assembling the pipeline's output
FRONT = ("cli", "commands", "export")

# the one known cycle left (the schema audit's sample builders); none may be added
KNOWN_CYCLES = [
    ["schema_audit.layouts", "schema_audit.opinfo", "schema_audit.recipes", "schema_audit.samples"],
]


def test_no_library_package_imports_the_front_modules():
    graph = import_graph()
    assert graph[f"{PACKAGE}.commands.ops"], "the walker found no imports: it is broken, not the package"
    assert upward_imports(graph, FRONT, exempt=("commands",)) == []


def test_the_walker_sees_an_upward_import():
    graph = {f"{PACKAGE}.opsets.report": {f"{PACKAGE}.export"}, f"{PACKAGE}.commands.ops": {f"{PACKAGE}.export"}}
    assert upward_imports(graph, FRONT, exempt=("commands",)) == [(f"{PACKAGE}.opsets.report", f"{PACKAGE}.export")]


def test_the_command_line_is_in_no_cycle():
    cycles = import_cycles(import_graph())
    print(picture())
    assert not [c for c in cycles if any(m.split(".")[1] in FRONT for m in c)], cycles


def test_import_cycles_are_the_known_ones():
    found = [[m.removeprefix(PACKAGE + ".") for m in c] for c in import_cycles(import_graph())]
    assert found == KNOWN_CYCLES, picture()


def test_the_walker_finds_a_cycle_through_deferred_and_relative_imports(tmp_path):
    pkg = tmp_path / "toy"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "top.py").write_text("from .sub import low\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "low.py").write_text("def f():\n    from .. import top\n")
    (pkg / "sub" / "typed.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .. import top\n")
    graph = import_graph(tmp_path, "toy")
    assert graph["toy.sub.typed"] == set()  # never runs
    assert import_cycles(graph) == [["toy.sub.low", "toy.top"]]
