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
