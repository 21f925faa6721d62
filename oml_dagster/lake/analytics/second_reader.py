"""The second reader's check: DuckDB reads Delta through delta-kernel, an implementation
independent of the writer's delta-rs, so its row counts against the Delta log's say whether the
lake is readable by a second implementation."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import duckdb
import pyarrow as pa
from deltalake import DeltaTable

from oml_dagster.lake.analytics.sandbox import TenantConnection, TenantView
from oml_dagster.lake.model.tables import TableId
from oml_dagster.lake.store.layout import Lake


@dataclass(frozen=True)
class ReadCheck:
    """One table read by DuckDB (delta-kernel) against its own Delta log as delta-rs reads it."""

    table: str
    view: str
    version: int | None
    duckdb_rows: int | None  # None when DuckDB could not read the table (`error`)
    log_rows: int | None  # None when some file's numRecords is missing from the log
    error: str | None = None

    @property
    def agrees(self) -> bool:
        if self.error is not None or self.duckdb_rows is None:
            return False
        return self.log_rows is None or self.duckdb_rows == self.log_rows


def second_reader_check(
    lake: Lake, tc: TenantConnection, tables: Iterable[TableId] | None = None
) -> list[ReadCheck]:
    """Row counts of the tenant's tables through DuckDB against the sum of the Delta log's
    per-file record counts (delta-rs). A table DuckDB cannot read is a finding (`error`), not a
    crash. `tables` limits it to those tables (a curated table is
    `TableId.curated(workarea_id)`; `TableId("gold.curated")` means all of them)."""
    wanted = set(tables) if tables is not None else None
    found = []
    for view in tc.views.values():
        if view.uri is None:
            continue
        if wanted is not None and not (
            view.table in wanted or TableId(view.table.spec_name) in wanted
        ):
            continue
        table = lake.open(view.uri)
        if table is not None:
            found.append(_read_check(tc, view, table))
    return found


# A commit landing between the log read and DuckDB's read changes the counts under the check:
# it reads again (DuckDB's delta_scan has no version parameter to pin).
READ_CHECK_ATTEMPTS = 3


def _read_check(tc: TenantConnection, view: TenantView, table: DeltaTable) -> ReadCheck:
    for _ in range(READ_CHECK_ATTEMPTS):
        version = table.version()
        actions = pa.table(table.get_add_actions(flatten=True))
        counts = actions.column("num_records").to_pylist() if actions.num_rows else []
        log_rows = None if any(c is None for c in counts) else int(sum(counts))
        try:
            # sum(length(...)) makes DuckDB read every data file, where a bare count(*) could
            # be answered from the log's statistics alone.
            duck = int(tc.value(f"SELECT count(*), sum(length(tenant_id)) FROM {view.view}"))
        except duckdb.Error as error:
            return ReadCheck(str(view.table), view.view, version, None, log_rows, str(error))
        table.update_incremental()
        if table.version() == version:
            break
    return ReadCheck(str(view.table), view.view, version, duck, log_rows)
