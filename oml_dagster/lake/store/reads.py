"""Reading a table's rows in the spec's types, and finding a tenant's tables."""

from __future__ import annotations

from typing import Any, NamedTuple

import pyarrow as pa
from deltalake import DeltaTable, QueryBuilder

from oml_dagster.lake.model.tables import CORE_TABLES, GOLD_AREAS, GOLD_CURATED, TableId, TableSpec
from oml_dagster.lake.store.layout import Lake


def read_rows(table: DeltaTable, spec: TableSpec, where: str | None = None) -> list[dict[str, Any]]:
    """Rows of `table` as dicts, cast to the spec's types (MERGE writes view types). `where` is a
    SQL predicate; the query engine prunes files with the log's statistics."""
    rows: list[dict[str, Any]] = read_table(table, spec, where).to_pylist()
    return rows


def read_table(table: DeltaTable, spec: TableSpec, where: str | None = None) -> pa.Table:
    """`read_rows` as one Arrow table."""
    return conform(query(table, "*", where), spec)


def query(table: DeltaTable, columns: str = "*", where: str | None = None) -> pa.Table:
    """`SELECT columns FROM table [WHERE where]` through delta-rs's query engine."""
    sql = f"SELECT {columns} FROM t" + (f" WHERE {where}" if where else "")
    return pa.table(QueryBuilder().register("t", table).execute(sql).read_all())


def conform(data: pa.Table, spec: TableSpec) -> pa.Table:
    """`data` with exactly the spec's columns, in order, in the spec's Arrow types."""
    return data.select(spec.columns).cast(spec.schema)


class TenantTable(NamedTuple):
    """One existing table of a tenant: which table it is, its spec and where it lives."""

    table: TableId
    spec: TableSpec
    uri: str


def tenant_tables(lake: Lake, tenant_id: str) -> list[TenantTable]:
    """Every existing table of a tenant: the four core tables and one curated table per
    validated workarea (found through gold.areas)."""
    found: list[TenantTable] = []
    for spec in CORE_TABLES:
        uri = lake.table_uri(tenant_id, spec)
        if lake.open(uri) is not None:
            found.append(TenantTable(TableId(spec.name), spec, uri))
    areas = lake.open(lake.table_uri(tenant_id, GOLD_AREAS))
    if areas is not None:
        for area in read_rows(areas, GOLD_AREAS):
            if area["status"] == "validated":
                uri = lake.table_uri(tenant_id, GOLD_CURATED, area["workarea_id"])
                if lake.open(uri) is not None:
                    found.append(
                        TenantTable(TableId.curated(area["workarea_id"]), GOLD_CURATED, uri)
                    )
    return found
