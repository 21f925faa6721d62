"""The SQL shell's guard: only read-only queries over the tenant's views get through
(`RefusedQuery` otherwise). The connection's lockdown (`sandbox.tenant_connection`) is the second
line behind it."""

from __future__ import annotations

import json
import re
from typing import Any

import duckdb

from oml_dagster.lake.analytics.sandbox import TenantConnection
from oml_dagster.lake.errors import LakeError

# Table functions a query may call: generators only, none of them reads anything.
ALLOWED_TABLE_FUNCTIONS = frozenset({"range", "generate_series", "unnest"})
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class RefusedQuery(LakeError):
    """A query the SQL shell will not run: a write, a setting, or a read outside the tenant's
    views. `reason` names what was refused."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def check_query(tc: TenantConnection, sql: str) -> None:
    """Refuse anything but read-only queries over the tenant's views: one or more SELECTs (SHOW,
    DESCRIBE and SUMMARIZE are SELECTs), no table function but a generator, no file path as a
    table. The lockdown of the connection is the second line behind this one."""
    try:
        statements = tc.con.extract_statements(sql)
    except duckdb.Error as error:
        raise RefusedQuery(f"cannot parse the query: {error}") from None
    if not statements:
        raise RefusedQuery("empty query")
    for statement in statements:
        kind = statement.type.name
        if kind != "SELECT":
            raise RefusedQuery(f"{kind} statements are refused: the lake is read-only here")
        tree = json.loads(tc.value("SELECT json_serialize_sql(?)", [statement.query]))
        if tree.get("error"):
            raise RefusedQuery(f"only plain queries are accepted: {tree.get('error_message')}")
        _check_tree(tree)


def _check_tree(node: Any) -> None:
    if isinstance(node, list):
        for item in node:
            _check_tree(item)
        return
    if not isinstance(node, dict):
        return
    if node.get("type") == "TABLE_FUNCTION":
        function = node.get("function") or {}
        name = str(function.get("function_name", "")).lower()
        if name not in ALLOWED_TABLE_FUNCTIONS:
            raise RefusedQuery(
                f"table function {name}() is refused: query the tenant's views "
                f"(allowed table functions: {', '.join(sorted(ALLOWED_TABLE_FUNCTIONS))})"
            )
    if node.get("type") == "BASE_TABLE":
        name = str(node.get("table_name", ""))
        if not _IDENTIFIER.match(name):
            raise RefusedQuery(f"table {name!r} is refused: query the tenant's views by name")
        if node.get("at_clause"):
            raise RefusedQuery(f"time travel on {name!r} is refused")
    for value in node.values():
        _check_tree(value)


def run_query(tc: TenantConnection, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Run a checked query; returns the last statement's column names and rows."""
    check_query(tc, sql)
    result = None
    for statement in tc.con.extract_statements(sql):
        result = tc.con.execute(statement.query)
    assert result is not None
    columns = [d[0] for d in result.description or ()]
    return columns, result.fetchall()
