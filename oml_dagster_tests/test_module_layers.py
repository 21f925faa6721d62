"""The core's modules stack at most four deep: the longest chain of imports inside
`oml_dagster.lake` (counted in modules, the importing one included) is computed from the source."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

LAKE = Path(__file__).resolve().parents[1] / "oml_dagster" / "lake"
DEEPEST = 4


def _module_name(path: Path) -> str:
    """A core module's name inside `oml_dagster.lake`, dotted: `errors`, `write.writer`."""
    return ".".join(path.relative_to(LAKE).with_suffix("").parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of `oml_dagster.lake` it imports (anywhere in its source), each by
    its dotted name inside the core (`store.storage`)."""
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


def package_graph() -> dict[str, set[str]]:
    """Stage -> the stages it imports: a module at the core's top is a stage of its own."""
    stages: dict[str, set[str]] = {}
    for name, imported in import_graph().items():
        stage = name.split(".")[0]
        stages.setdefault(stage, set()).update(m.split(".")[0] for m in imported)
    return {stage: found - {stage} for stage, found in stages.items()}


def longest_chains(graph: dict[str, set[str]]) -> dict[str, list[str]]:
    @functools.cache
    def chain(name: str) -> tuple[str, ...]:
        deeper = [chain(d) for d in sorted(graph[name])]
        return (name, *max(deeper, key=len, default=()))

    return {name: list(chain(name)) for name in graph}


def test_the_graph_is_read_from_the_source():
    graph = import_graph()
    assert {"errors", "model.tables", "store.storage", "policy", "store.deltalog"} <= set(graph)
    assert graph["audit.erasure"] >= {"store.deltalog", "policy", "store.storage"}
    assert "write.writer" not in graph["store.maintenance"] | graph["audit.erasure"]
    assert "store.maintenance" not in graph["audit.erasure"]


def test_no_import_chain_inside_the_core_is_deeper_than_four_modules():
    chains = longest_chains(import_graph())
    deeper = {name: " -> ".join(c) for name, c in chains.items() if len(c) > DEEPEST}
    assert deeper == {}


def test_the_stages_import_each_other_without_a_cycle():
    """ingest, model, store, write, audit and the modules at the core's top (ADR 0053): no
    stage imports one that imports it back, however far round."""
    stages = package_graph()
    assert {"ingest", "model", "store", "write", "audit"} <= set(stages)

    def reaches(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in stages.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    assert {s for s in stages if s in reaches(s)} == set()
    # The writer and the audit are the top floors: nothing else in the core imports them.
    assert not [s for s, found in stages.items() if found & {"write", "audit"} and s != "audit"]


def test_the_op_catalog_sits_on_the_table_declarations_and_the_errors_only():
    # The writer and the reconciler both fold through the catalog; anything it imported would add
    # a floor under each of them.
    assert import_graph()["model.catalog"] == {"errors", "model.tables"}


def test_maintenance_and_erasure_sit_on_the_log_and_policy_modules_only():
    chains = longest_chains(import_graph())
    assert len(chains["store.maintenance"]) <= 3 and len(chains["audit.erasure"]) <= 3
    # policy sits on the statements and the errors only (both leaves).
    assert len(chains["store.deltalog"]) == 1 and len(chains["policy"]) == 2


def test_the_statements_module_imports_nothing_of_the_core():
    assert len(longest_chains(import_graph())["queries"]) == 1


# --- settings at the edge (ADR 0052) --------------------------------------------------------------

SETTINGS = LAKE.parent / "settings.py"
SETTING_ERRORS = LAKE.parent / "setting_errors.py"
# The functions of the core that may read the environment, and why: object_store reads
# AWS_CONDITIONAL_PUT / AWS_S3_ALLOW_UNSAFE_RENAME from it whatever the options say, and delta-rs
# falls back to the AWS_* variables; both check what the library will see (comments there).
ENVIRONMENT_READERS = {("store/storage", "_unsafe_candidates"), ("store/storage", "_option")}


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
    storage = {
        f for f, _ in _environment_reads(ast.parse((LAKE / "store" / "storage.py").read_text()))
    }
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
