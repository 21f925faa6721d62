"""The core's stages stand in one order: a module of `oml_dagster.lake` imports modules of its own
stage and of the stages below it, never one above, and no module imports one that imports it
back. The imports are read from the source."""

from __future__ import annotations

import ast
from pathlib import Path

LAKE = Path(__file__).resolve().parents[1] / "oml_dagster" / "lake"

# The stages from the ground up (ADR 0053, amended by 0059). A stage is a sub-package of the core,
# or a module at its top; the stages on one floor do not import each other. A new module of a
# stage (a file under `write/`, say) is covered as it is added; a new stage must be given its
# floor here.
FLOORS: tuple[frozenset[str], ...] = (
    frozenset({"errors", "queries"}),  # the error classes; every SQL statement on `oml`
    frozenset({"db", "faults", "policy"}),  # migrations and roles; faults; tenants and bounds
    frozenset({"model"}),  # the table declarations and the op catalog
    frozenset({"ingest", "store"}),  # the outbox read and checked; the lake on disk or S3
    frozenset({"write"}),  # a tenant batch under its txn fence, the drain loop
    frozenset({"audit", "analytics"}),  # what the lake is checked against; its second reader
)
FLOOR_OF = {stage: level for level, stages in enumerate(FLOORS) for stage in stages}


def _module_name(path: Path) -> str:
    """A core module's name inside `oml_dagster.lake`, dotted: `errors`, `write.writer`."""
    return ".".join(path.relative_to(LAKE).with_suffix("").parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of `oml_dagster.lake` it imports (anywhere in its source), each by
    its dotted name inside the core (`store.layout`)."""
    paths = {
        _module_name(p): p
        for p in LAKE.rglob("*.py")
        if p.stem != "__init__" and "migrations" not in p.parts
    }
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            named: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                module = node.module or ""
                named = [module, *(f"{module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                named = [alias.name for alias in node.names]
            for dotted in named:
                parts = dotted.split(".")
                if parts[:2] == ["oml_dagster", "lake"]:
                    found.add(".".join(parts[2:]))
        graph[name] = (found & set(paths)) - {name}
    return graph


def stage_of(module: str) -> str:
    return module.split(".")[0]


def test_the_graph_is_read_from_the_source():
    graph = import_graph()
    assert {"errors", "model.tables", "store.layout", "policy", "store.deltalog"} <= set(graph)
    assert graph["audit.erasure"] >= {"store.deltalog", "policy", "store.layout"}
    assert "write.writer" not in graph["store.maintenance"] | graph["audit.erasure"]
    assert "store.maintenance" not in graph["audit.erasure"]


def test_every_stage_of_the_core_has_its_floor():
    stages = {stage_of(m) for m in import_graph()}
    assert stages - set(FLOOR_OF) == set(), "give the new stage its floor in FLOORS"


def test_no_module_imports_a_stage_above_its_own_or_beside_it():
    wrong = sorted(
        f"{module} -> {imported}"
        for module, found in import_graph().items()
        for imported in found
        if stage_of(imported) != stage_of(module)
        and FLOOR_OF[stage_of(imported)] >= FLOOR_OF[stage_of(module)]
    )
    assert wrong == []


def test_no_module_imports_one_that_imports_it_back():
    graph = import_graph()
    done: set[str] = set()
    on_path: list[str] = []

    def visit(module: str) -> None:
        if module in done:
            return
        assert module not in on_path, " -> ".join([*on_path[on_path.index(module) :], module])
        on_path.append(module)
        for imported in sorted(graph[module]):
            visit(imported)
        on_path.pop()
        done.add(module)

    for module in sorted(graph):
        visit(module)


def test_the_op_catalog_sits_on_the_table_declarations_and_the_errors_only():
    # The writer and the reconciler both fold through the catalog, and `areas-at` replays area
    # ops through it: anything it imported would sit under all three.
    assert import_graph()["model.catalog"] == {"errors", "model.tables"}


def test_the_leaves_import_nothing_of_the_core():
    graph = import_graph()
    for leaf in ("errors", "queries", "model.tables", "store.deltalog", "store.credentials"):
        assert graph[leaf] == set(), leaf


# --- settings at the edge (ADR 0052) --------------------------------------------------------------

SETTINGS = LAKE.parent / "settings.py"
SETTING_ERRORS = LAKE.parent / "setting_errors.py"
# The functions of the core that may read the environment, and why: object_store reads
# AWS_CONDITIONAL_PUT / AWS_S3_ALLOW_UNSAFE_RENAME from it whatever the options say, and delta-rs
# falls back to the AWS_* variables; both check what the library will see (comments there).
ENVIRONMENT_READERS = {
    ("store/conditional_put", "unsafe_settings"),
    ("store/credentials", "option"),
}


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
    for module, function in ENVIRONMENT_READERS:
        tree = ast.parse((LAKE / f"{module}.py").read_text())
        assert function in {f for f, _ in _environment_reads(tree)}, (module, function)


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
