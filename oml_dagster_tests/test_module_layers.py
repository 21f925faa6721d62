"""The core's modules stack at most four deep: the longest chain of imports inside
`oml_dagster.lake` (counted in modules, the importing one included) is computed from the source."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

LAKE = Path(__file__).resolve().parents[1] / "oml_dagster" / "lake"
DEEPEST = 4


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of `oml_dagster.lake` it imports (anywhere in its source)."""
    modules = {p.stem for p in LAKE.glob("*.py") if p.stem != "__init__"}
    graph: dict[str, set[str]] = {}
    for name in modules:
        found: set[str] = set()
        for node in ast.walk(ast.parse((LAKE / f"{name}.py").read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level == 1:
                    parts = (node.module or "").split(".")
                    found.update([parts[0]] if node.module else [a.name for a in node.names])
                elif node.level == 0 and (node.module or "").startswith("oml_dagster.lake"):
                    rest = node.module.split(".")[2:]
                    found.update(rest[:1] or [a.name for a in node.names])
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    parts = alias.name.split(".")
                    if parts[:2] == ["oml_dagster", "lake"] and len(parts) > 2:
                        found.add(parts[2])
        graph[name] = (found & modules) - {name}
    return graph


def longest_chains(graph: dict[str, set[str]]) -> dict[str, list[str]]:
    @functools.cache
    def chain(name: str) -> tuple[str, ...]:
        deeper = [chain(d) for d in sorted(graph[name])]
        return (name, *max(deeper, key=len, default=()))

    return {name: list(chain(name)) for name in graph}


def test_the_graph_is_read_from_the_source():
    graph = import_graph()
    assert {"errors", "tables", "storage", "policy", "deltalog"} <= set(graph)
    assert graph["erasure"] >= {"deltalog", "policy", "storage"}
    assert "writer" not in graph["maintenance"] | graph["erasure"]
    assert "maintenance" not in graph["erasure"]


def test_no_import_chain_inside_the_core_is_deeper_than_four_modules():
    chains = longest_chains(import_graph())
    deeper = {name: " -> ".join(c) for name, c in chains.items() if len(c) > DEEPEST}
    assert deeper == {}


def test_the_op_catalog_sits_on_the_table_declarations_and_the_errors_only():
    # The writer and the reconciler both fold through the catalog; anything it imported would add
    # a floor under each of them.
    assert import_graph()["catalog"] == {"errors", "tables"}


def test_maintenance_and_erasure_sit_on_the_log_and_policy_modules_only():
    chains = longest_chains(import_graph())
    assert len(chains["maintenance"]) <= 3 and len(chains["erasure"]) <= 3
    # policy sits on the statements and the errors only (both leaves).
    assert len(chains["deltalog"]) == 1 and len(chains["policy"]) == 2


def test_the_statements_module_imports_nothing_of_the_core():
    assert len(longest_chains(import_graph())["queries"]) == 1


# --- settings at the edge (ADR 0052) --------------------------------------------------------------

SETTINGS = LAKE.parent / "settings.py"
SETTING_ERRORS = LAKE.parent / "setting_errors.py"
# The functions of the core that may read the environment, and why: object_store reads
# AWS_CONDITIONAL_PUT / AWS_S3_ALLOW_UNSAFE_RENAME from it whatever the options say, and delta-rs
# falls back to the AWS_* variables; both check what the library will see (comments there).
ENVIRONMENT_READERS = {("storage", "_unsafe_candidates"), ("storage", "_option")}


def _imported(tree: ast.AST, package: str = "") -> set[str]:
    """Every module name `tree` (a module of `package`) imports, relative imports resolved
    (`from x import y` gives x and x.y)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                parts = package.split(".")
                module = ".".join([*parts[: len(parts) - node.level + 1], *filter(None, [module])])
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def _environment_reads(tree: ast.AST) -> list[tuple[str, int]]:
    """(enclosing function, line) of each `os.environ` / `os.getenv` / `environ` / `getenv`."""
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST, function: str) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            function = node.name
        if (isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "environb")) or (
            isinstance(node, ast.Name) and node.id in ("environ", "getenv", "environb")
        ):
            found.append((function, node.lineno))
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(tree, "<module>")
    return found


def test_the_core_reads_no_settings_and_no_environment():
    imports, reads = {}, {}
    for path in sorted(LAKE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        name = path.relative_to(LAKE).with_suffix("").as_posix()
        package = ".".join(["oml_dagster", "lake", *path.relative_to(LAKE).parts[:-1]])
        settings = {
            m for m in _imported(tree, package) if m.split(".")[:2] == ["oml_dagster", "settings"]
        }
        if settings:
            imports[name] = settings
        for function, line in _environment_reads(tree):
            if (name, function) not in ENVIRONMENT_READERS:
                reads.setdefault(name, []).append(f"{function} (line {line})")
    assert imports == {}, "the core takes its settings passed down (oml_dagster.from_settings)"
    assert reads == {}, "the core reads no environment; read it at the edge and pass it down"
    # The exceptions are still where they are said to be (a rename must update the list).
    storage = {f for f, _ in _environment_reads(ast.parse((LAKE / "storage.py").read_text()))}
    assert {f for _, f in ENVIRONMENT_READERS} <= storage


def test_the_settings_import_nothing_of_the_core():
    for path in (SETTINGS, SETTING_ERRORS):
        found = {
            m
            for m in _imported(ast.parse(path.read_text()), "oml_dagster")
            if m.startswith("oml_dagster.lake")
        }
        assert found == set(), path.name
    # The refusal of a value imports nothing at all: the core names it without the settings.
    assert _imported(ast.parse(SETTING_ERRORS.read_text())) <= {
        "__future__",
        "__future__.annotations",
    }
