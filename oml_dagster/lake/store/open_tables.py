"""Delta tables kept open through one drain: a table already open is brought forward with
`update_incremental` instead of being listed and replayed again (ADR 0029), and what a drain asks
of it again (rows of gold.areas, the app transaction) is read again only when its version moved."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from oml_dagster.lake.model.tables import APP_ID, TableSpec
from oml_dagster.lake.store import deltalog
from oml_dagster.lake.store.layout import Lake
from oml_dagster.lake.store.lookups import FileKeys
from oml_dagster.lake.store.reads import read_table


class OpenTables:
    """Delta tables kept open across one drain's batches: a table already open is brought to its
    latest version with `update_incremental` (one read of the log's next entry) instead of being
    opened again (a listing of the log and a replay from the last checkpoint), and gold.areas'
    rows and each table's app transaction are read again only when its version changed.

    A table deleted under a drain (its prefix removed for a rebuild) would keep its old state
    through `update_incremental`, so each reuse checks that the log still holds the entry of
    the version the handle stands at; when it does not, the table is opened afresh. A table
    deleted and then rebuilt past that version meanwhile would pass the check: that takes
    another writer of the same tenant during the drain, which the lease rules out."""

    # What a drain keeps of its tables' match columns (`FileKeys`): some thousands of files'
    # keys, a small part of the memory budget.
    KEPT_KEY_BYTES = 32 * 2**20

    def __init__(self, lake: Lake):
        self.lake = lake
        self.keys = FileKeys(options_for=lake.options_for, most_bytes=self.KEPT_KEY_BYTES)
        self._tables: dict[str, DeltaTable] = {}
        self._rows: dict[str, tuple[int, pa.Table]] = {}
        self._txns: dict[str, tuple[int, int]] = {}

    def open(self, uri: str) -> DeltaTable | None:
        """The table at `uri` at its latest version, or None when there is none."""
        table = self._tables.get(uri)
        if table is not None:
            table.update_incremental()
            if self._holds(uri, table.version()):
                return table
            self.forget(uri)
        table = self.lake.open(uri)
        if table is not None:
            self._tables[uri] = table
        return table

    def _holds(self, uri: str, version: int) -> bool:
        try:
            return deltalog.holds_commit(self.lake.filesystem(uri), version)
        except TableNotFoundError:  # a local table's directory is gone
            return False

    def keep(self, uri: str, table: DeltaTable | None, txn: int | None = None) -> None:
        """Use `table` (reopened after a conflict, or just created) for `uri` from now on;
        `txn`, when given, is its app transaction at its version (the writer knows the one it
        committed)."""
        if table is None:
            self.forget(uri)
            return
        self._tables[uri] = table
        if txn is not None:
            self._txns[uri] = (table.version(), txn)

    def txn(self, uri: str, table: DeltaTable | None) -> int:
        """`app_txn(table)`, read from the log only when the table's version changed: each read
        replays the log since the last checkpoint (one GET per commit on S3)."""
        if table is None:
            return 0
        version = table.version()
        cached = self._txns.get(uri)
        if cached is None or cached[0] != version:
            cached = (version, app_txn(table))
            self._txns[uri] = cached
        return cached[1]

    def rows(self, uri: str, table: DeltaTable, spec: TableSpec) -> list[dict[str, Any]]:
        """`read_rows(table, spec)`, read again only when the table's version changed (fresh
        dicts each call: callers may change them)."""
        version = table.version()
        cached = self._rows.get(uri)
        if cached is None or cached[0] != version:
            cached = (version, read_table(table, spec))
            self._rows[uri] = cached
        rows: list[dict[str, Any]] = cached[1].to_pylist()
        return rows

    def forget(self, prefix: str) -> None:
        """Drop every table at or under `prefix` (a tenant whose batch failed: reopen all)."""
        for cache in (self._tables, self._rows, self._txns):
            for uri in [u for u in cache if u == prefix or u.startswith(prefix + "/")]:
                del cache[uri]


def app_txn(table: DeltaTable | None) -> int:
    """The writer's app transaction version in `table`, read from its log (0: no table, or none
    recorded). Each call replays the log since the last checkpoint: a drain asks `OpenTables`."""
    return (table.transaction_version(APP_ID) or 0) if table is not None else 0
