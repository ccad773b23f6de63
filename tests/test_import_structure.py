"""The package's import structure, read statically (scripts/import_picture.py; imports
inside functions and under TYPE_CHECKING count): the direction the pipeline promises."""

import ast
import importlib.util
from pathlib import Path

import predispatch_func

PACKAGE = Path(predispatch_func.__file__).parent
_spec = importlib.util.spec_from_file_location("import_picture", PACKAGE.parent / "scripts" / "import_picture.py")
picture = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(picture)

def test_no_import_cycle():
    assert picture.cycles(picture.graph_of(PACKAGE)) == []


# the front modules: the command line, export() assembling the pipeline's output, and joint/
# (export_joint: an entry point built on export(), as the command line is)
_FRONT = ("cli", "commands", "export", "joint")


def _front_imports_below_the_top(graph: dict[str, dict[str, bool]]) -> list[tuple[str, str]]:
    """(importer, imported): a module of a library package (every one but ``commands/``, the
    front itself) importing the command line or ``export``."""
    top = PACKAGE.name
    library = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists() and p.name not in _FRONT}
    front = tuple(f"{top}.{name}" for name in _FRONT)
    return sorted((src, dst) for src, targets in graph.items() for dst in targets
                  if src.split(".")[1:2] and src.split(".")[1] in library
                  and any(dst == f or dst.startswith(f + ".") for f in front))


def test_no_library_package_imports_the_command_line_or_export():
    graph = picture.graph_of(PACKAGE)
    assert graph["predispatch_func.commands.ops"], "the walk found no imports: it is broken, not the package"
    assert _front_imports_below_the_top(graph) == []


def test_the_check_finds_an_import_of_the_front():
    graph = {"predispatch_func.opsets.report": {"predispatch_func.export": False}}
    assert _front_imports_below_the_top(graph) == [("predispatch_func.opsets.report", "predispatch_func.export")]


def test_no_stage_imports_a_later_stage():
    # the stage packages in pipeline order (import_picture.STAGES); the driver (aot.py, pipeline.py)
    # hands an earlier stage what it needs from a later one (pipeline.TraceSettings.trace_body)
    assert picture.upward(picture.graph_of(PACKAGE), PACKAGE.name) == []


def test_the_stages_are_the_packages_ls_shows():
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert set(picture.STAGES) <= packages


def test_the_stage_check_finds_an_import_of_a_later_stage():
    graph = {"predispatch_func.trace.stack": {"predispatch_func.regions.frames": False},
             "predispatch_func.regions.frames": {"predispatch_func.trace.ambient": False}}
    assert picture.upward(graph, "predispatch_func") == [
        ("predispatch_func.trace.stack", "predispatch_func.regions.frames", False)]


def test_the_walk_sees_imports_inside_functions():
    graph = picture.graph_of(PACKAGE)
    assert graph["predispatch_func.trace.extensions.function_trace"]["predispatch_func.mode_capabilities"] is False
    assert any(nested for targets in graph.values() for nested in targets.values())


def _getattr_on_a_mode(tree: ast.AST) -> list[int]:
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
            and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
            and "mode" in ast.unparse(node.args[0]).lower()]


def test_no_capability_of_a_mode_is_looked_up_by_name():
    # a mode's optional capabilities are Protocols (mode_capabilities.py); _torch_compat may probe torch's modes
    found = {str(path.relative_to(PACKAGE)): lines for path in PACKAGE.rglob("*.py")
             if "_torch_compat" not in path.parts and (lines := _getattr_on_a_mode(ast.parse(path.read_text())))}
    assert found == {}


def test_the_check_finds_a_lookup_by_name():
    assert _getattr_on_a_mode(ast.parse('observe = getattr(tc.active_functional_mode(), "observe_opaque_call", None)'))


def test_eager_reads_only_the_op_set_the_op_facts_the_errors_and_the_compat_layer():
    # pf.eager runs beside the trace, not on it: one place for op facts (op_schema.py) keeps it so
    graph = picture.graph_of(PACKAGE)
    allowed = ("predispatch_func.eager", "predispatch_func.opsets", "predispatch_func.op_schema",
               "predispatch_func.errors", "predispatch_func._torch_compat",
               "predispatch_func.disk_cache")  # where every cache file lives (a leaf: torch only)
    reached = sorted({dst for src, targets in graph.items() if src.startswith("predispatch_func.eager")
                      for dst in targets if not dst.startswith(allowed)})
    assert reached == []
