"""`oml-lake`'s exit codes are named once (`oml_dagster.lake.faults.EXIT_*`), the command line
returns them by name, and README's table lists exactly those."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from oml_dagster.lake import faults

REPO = Path(__file__).resolve().parents[2]
CLI = REPO / "oml_dagster" / "cli"


def named_codes() -> dict[str, int]:
    return {k: v for k, v in vars(faults).items() if k.startswith("EXIT_")}


def test_each_code_has_one_name():
    codes = named_codes()
    assert len(set(codes.values())) == len(codes)
    assert {0, 1, 2, 3, 4, 70, 130, 141} == set(codes.values())


def test_the_readme_table_lists_exactly_the_named_codes():
    text = (REPO / "README.md").read_text()
    table = text[text.index("The exit codes:") :].split("\n\n")[1]
    listed = {int(m) for m in re.findall(r"^\| (\d+) \|", table, re.M)}
    assert listed == set(named_codes().values())


def _literal_exits(tree: ast.AST) -> list[int]:
    """Lines where a `return` gives an integer literal, directly or as a branch of `x if c
    else y`, or a literal is assigned to `code`."""
    found = []
    for node in ast.walk(tree):
        returned = isinstance(node, ast.Return) and node.value is not None
        assigned = isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "code" for t in node.targets
        )
        values: list[ast.expr] = [node.value] if returned or assigned else []  # type: ignore[attr-defined]
        while values:
            value = values.pop()
            if isinstance(value, ast.IfExp):
                values += [value.body, value.orelse]
            elif isinstance(value, ast.Constant) and type(value.value) is int:
                found.append(value.lineno)
    return found


def test_the_command_line_returns_no_code_by_number():
    literal = {
        path.name: lines
        for path in sorted(CLI.glob("*.py"))
        if (lines := _literal_exits(ast.parse(path.read_text())))
    }
    assert literal == {}, "return the named code (oml_dagster.lake.faults.EXIT_*)"
