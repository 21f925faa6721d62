"""Every SQL statement on schema `oml` that the core, the Dagster layer and the command line run
is in `oml_dagster.lake.queries`; the simulator, which plays the producer, keeps its own."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "oml_dagster"
STATEMENT = re.compile(
    r"\b(SELECT|INSERT|UPDATE|DELETE|CREATE|WITH|SET)\b[\s\S]*\boml\.[a-z_]+|\bSCHEMA\b[\s\S]*\boml\b"
)


def statements_outside(module: Path) -> list[str]:
    tree = ast.parse(module.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
        and STATEMENT.search(node.value)
    ]


def test_sql_on_schema_oml_lives_in_the_queries_module():
    modules = [
        p
        for p in PACKAGE.rglob("*.py")
        if "simulate" not in p.relative_to(PACKAGE).parts and p.name != "queries.py"
    ]
    assert len(modules) > 20
    found = {str(p.relative_to(PACKAGE)): statements_outside(p) for p in modules}
    assert {name: s for name, s in found.items() if s} == {}


def test_the_check_finds_a_statement():
    probe = PACKAGE / "simulate" / "producer.py"
    assert statements_outside(probe), "the simulator's own SQL should be seen by the check"
