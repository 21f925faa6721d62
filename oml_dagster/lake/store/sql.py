"""SQL literals for the predicates the lake's reads pass to delta-rs's query engine."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def sql_text(value: Any) -> str:
    """`value` as an SQL string literal (single quotes doubled)."""
    return "'" + str(value).replace("'", "''") + "'"


def sql_in(column: str, values: Iterable[Any]) -> str:
    """`column IN (...)` over string values, or FALSE for none."""
    ordered = sorted(values)
    if not ordered:
        return "FALSE"
    return f"{column} IN ({', '.join(sql_text(v) for v in ordered)})"
