"""Delta tables kept open through one drain: a table already open is brought forward with
`update_incremental` instead of being listed and replayed again (ADR 0029), what a drain asks of
it again (the app transaction) is read again only when its version moved, and a small keyed
table is kept whole, brought forward by the writer's own commits (ADR 0078)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from oml_dagster.lake.model.tables import APP_ID, Key, Row, TableSpec
from oml_dagster.lake.store import deltalog
from oml_dagster.lake.store.layout import Lake
from oml_dagster.lake.store.lookups import FileKeys
from oml_dagster.lake.store.reads import read_table


@dataclass
class _Whole:
    """A keyed table's every row by merge key, as the table stands at `version`."""

    version: int
    rows: dict[Key, Row]
    nbytes: int


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
    # A keyed table of at most this many rows is kept whole (ADR 0078): the rows a batch touches
    # are looked up in it, not read from the files its last MERGE rewrote; the whole tables
    # kept take at most WHOLE_BYTES (their Arrow size as read), the least recently used going.
    WHOLE_MOST_ROWS = 5_000
    WHOLE_BYTES = 64 * 2**20

    def __init__(self, lake: Lake):
        self.lake = lake
        self.keys = FileKeys(options_for=lake.options_for, most_bytes=self.KEPT_KEY_BYTES)
        self._tables: dict[str, DeltaTable] = {}
        self._uris: dict[int, tuple[DeltaTable, str]] = {}  # id(table) -> (table, uri)
        self._whole: OrderedDict[str, _Whole] = OrderedDict()
        self._whole_bytes = 0
        self._txns: dict[str, tuple[int, int]] = {}
        self.whole_read = 0  # tables read whole (not answered from what is kept)

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
            self._hold(uri, table)
        return table

    def _hold(self, uri: str, table: DeltaTable) -> None:
        before = self._tables.get(uri)
        if before is not None and before is not table:
            self._uris.pop(id(before), None)
        self._tables[uri] = table
        self._uris[id(table)] = (table, uri)

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
        self._hold(uri, table)
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
        """`read_rows(table, spec)` of a keyed table of any size (gold.areas), read again only
        when the table moved otherwise than by the writer's own commits (fresh dicts each call:
        callers may change them)."""
        whole = self._whole_of(uri, table, spec, most_rows=None)
        assert whole is not None
        return [dict(row) for row in whole.rows.values()]

    def rows_with(
        self, table: DeltaTable, spec: TableSpec, matches: Mapping[str, Collection[str]]
    ) -> list[dict[str, Any]]:
        """`FileKeys.rows_with`, answered from the table's rows kept whole when it is small
        (fresh dicts)."""
        whole = self._whole_for(table, spec)
        if whole is None:
            return self.keys.rows_with(table, spec, matches)
        wanted = {c: set(v) for c, v in matches.items() if v}
        return [
            dict(row)
            for row in whole.rows.values()
            if any(row[c] in values for c, values in wanted.items())
        ]

    def whole_rows(self, table: DeltaTable, spec: TableSpec) -> list[Row] | None:
        """Every row of a small keyed table, as kept (not to be changed), or None when the table
        is not kept whole (too large, or not one of these tables)."""
        whole = self._whole_for(table, spec)
        return list(whole.rows.values()) if whole is not None else None

    def _whole_for(self, table: DeltaTable, spec: TableSpec) -> _Whole | None:
        held = self._uris.get(id(table))
        if held is None or held[0] is not table or not spec.merge_key:
            return None
        return self._whole_of(held[1], table, spec, most_rows=self.WHOLE_MOST_ROWS)

    def _whole_of(
        self, uri: str, table: DeltaTable, spec: TableSpec, *, most_rows: int | None
    ) -> _Whole | None:
        version = table.version()
        whole = self._whole.get(uri)
        if whole is not None and whole.version == version:
            self._whole.move_to_end(uri)
            return whole
        if most_rows is not None:
            files = pa.table(table.get_add_actions(flatten=True))
            if "num_records" not in files.column_names:
                return None
            count = pc.sum(files["num_records"]).as_py() or 0
            if count > most_rows or files["num_records"].null_count:
                return None
        data = read_table(table, spec)
        self.whole_read += 1
        rows = {spec.key_of(r): r for r in data.to_pylist()}
        self._keep_whole(uri, _Whole(version, rows, data.nbytes))
        return self._whole[uri]

    def _keep_whole(self, uri: str, whole: _Whole) -> None:
        self._drop_whole(uri)
        self._whole[uri] = whole
        self._whole_bytes += whole.nbytes
        self._within_bytes()

    def _within_bytes(self) -> None:
        """The least recently used tables dropped until what is kept is within WHOLE_BYTES (the
        one used last stays, whatever its size)."""
        while self._whole_bytes > self.WHOLE_BYTES and len(self._whole) > 1:
            self._drop_whole(next(iter(self._whole)))

    def _drop_whole(self, uri: str) -> None:
        whole = self._whole.pop(uri, None)
        if whole is not None:
            self._whole_bytes -= whole.nbytes

    def landed(
        self, uri: str, *, operation: str, version: int, rows: pa.Table, spec: TableSpec
    ) -> None:
        """The writer's own commit (`operation`: create, append, merge or txn-only, of `rows` in
        the spec's schema) landed at `version`: a table kept whole at the version before it is
        brought forward with its rows (a MERGE here updates or inserts whole rows by the merge
        key and deletes none; an append inserts; a txn-only commit changes no row). Any other
        kept state of the table is dropped, to be read again."""
        if not spec.merge_key:
            return
        whole = self._whole.get(uri)
        if operation == "create" or whole is None or whole.version != version - 1:
            self._drop_whole(uri)
            return
        for row in rows.to_pylist():
            whole.rows[spec.key_of(row)] = row
        whole.version = version
        self._whole_bytes += rows.nbytes
        whole.nbytes += rows.nbytes
        self._within_bytes()

    def repacked(self, uri: str, before: int, after: int) -> None:
        """The table moved from `before` to `after` by rewrites that change no row (small files
        packed): what is kept of it at `before` stands at `after`."""
        whole = self._whole.get(uri)
        if whole is not None and whole.version == before:
            whole.version = after

    def forget(self, prefix: str) -> None:
        """Drop every table at or under `prefix` (a tenant whose batch failed: reopen all)."""

        def under(uri: str) -> bool:
            return uri == prefix or uri.startswith(prefix + "/")

        for cache in (self._tables, self._txns):
            for uri in [u for u in cache if under(u)]:
                del cache[uri]
        for uri in [u for u in self._whole if under(u)]:
            self._drop_whole(uri)
        self._uris = {k: held for k, held in self._uris.items() if not under(held[1])}


def app_txn(table: DeltaTable | None) -> int:
    """The writer's app transaction version in `table`, read from its log (0: no table, or none
    recorded). Each call replays the log since the last checkpoint: a drain asks `OpenTables`."""
    return (table.transaction_version(APP_ID) or 0) if table is not None else 0
