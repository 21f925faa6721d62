"""The writer's lookups of the rows a batch touches (ADR 0029, 0036, 0043): by each data file's
match columns, kept between lookups, or by a query for a few values; files whose log statistics
rule every value out are not read."""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.fs as pafs
from deltalake import DeltaTable
from deltalake.fs import DeltaStorageHandler

from oml_dagster.lake.model.tables import TableSpec
from oml_dagster.lake.store.reads import conform, read_rows
from oml_dagster.lake.store.sql import sql_in


class FileKeys:
    """The writer's lookup of the rows a batch touches (`rows_with`), with each data file's match
    columns kept between lookups. A Delta data file never changes once written (a MERGE or a
    rewrite adds new files), so a drain that comes back to a table reads the match columns of
    the files added since its last visit only; a file whose columns hold a match is read whole.
    Listing the files takes the table's add actions, not a pyarrow dataset, whose construction
    costs about a millisecond per file (ADR 0036). The kept columns are bounded by
    `most_bytes`: past it the least recently used go."""

    # A lookup of few values in files whose match columns are not kept goes to the query
    # engine as an IN list instead: it prunes by statistics and reads in parallel (a 1M-row
    # table: 44 ms for 10 values, 236 ms for 1,000), where reading every key column costs
    # about 0.3 us a row plus ~2 ms a file (ADR 0043). Past some thousands of values the IN
    # list itself is the cost (ADR 0029).
    QUERY_MOST_VALUES = 1_000
    QUERY_FROM_ROWS = 20_000
    QUERY_ROWS_PER_VALUE = 500

    def __init__(
        self,
        storage_options: Mapping[str, str] | None = None,
        most_bytes: int = 0,
        options_for: Callable[[str], Mapping[str, str]] | None = None,
    ):
        # `options_for(table_uri)`: a table's own options (its tenant's, `Lake.options_for`).
        self.storage_options = dict(storage_options or {})
        self.options_for = options_for
        self.most_bytes = most_bytes
        self._kept: OrderedDict[tuple[str, str, tuple[str, ...]], pa.Table] = OrderedDict()
        self._bytes = 0
        self.read = 0  # files whose match columns were read (not kept from a lookup before)
        self.skipped = 0  # files passed over by their statistics (no match can be in them)
        self.queried = 0  # lookups answered by a query instead (few values, many rows unread)

    def rows_with(
        self, table: DeltaTable, spec: TableSpec, matches: Mapping[str, Collection[str]]
    ) -> list[dict[str, Any]]:
        """Rows of `table` whose value in one of the `matches` columns is among that column's
        strings, as dicts cast to the spec's types. Files whose statistics rule every value out
        are passed over. A lookup of many values reads the files' match columns, not an SQL
        `IN` list: the query engine plans one of tens of thousands of values in seconds, and
        past about 25,000 values overflows the calling thread's stack (a segfault in delta-rs;
        docs/decisions/0029). A lookup of few values that would read many rows' match columns
        afresh is such a query (`QUERY_MOST_VALUES`)."""
        if spec.partition_by:
            raise ValueError(f"{spec.name} is partitioned: rows_with reads unpartitioned tables")
        ordered = {c: sorted(v) for c, v in matches.items() if v}
        if not ordered:
            return []
        wanted = {c: pa.array(v, pa.string()) for c, v in ordered.items()}
        columns = tuple(sorted(wanted))
        files = pa.table(table.get_add_actions(flatten=True))
        sizes = dict(zip(files["path"].to_pylist(), files["size_bytes"].to_pylist(), strict=True))
        maybe = may_hold_any(files, ordered)
        values = sum(len(v) for v in ordered.values())
        if values <= self.QUERY_MOST_VALUES:
            counts = (
                files["num_records"].to_pylist()
                if "num_records" in files.column_names
                else [None] * files.num_rows
            )
            unread = sum(
                rows or 0  # a file without a row count counts for none
                for path, rows, hit in zip(sizes, counts, maybe, strict=True)
                if hit and (table.table_uri, path, columns) not in self._kept
            )
            if unread >= self.QUERY_FROM_ROWS + self.QUERY_ROWS_PER_VALUE * values:
                self.queried += 1
                where = " OR ".join(sql_in(c, v) for c, v in ordered.items())
                return read_rows(table, spec, where)
        options = self.options_for(table.table_uri) if self.options_for else self.storage_options
        handler = DeltaStorageHandler(table.table_uri, dict(options) or None, sizes)
        filesystem = pafs.PyFileSystem(handler)
        found = []
        for path, hit in zip(sizes, maybe, strict=True):
            if not hit:
                self.skipped += 1
                continue
            keys = self._columns(table.table_uri, filesystem, path, columns)
            mask = None
            for column, values in wanted.items():
                hit = pc.is_in(keys[column], value_set=values)
                mask = hit if mask is None else pc.or_(mask, hit)
            mask = pc.fill_null(mask, False)
            if pc.any(mask).as_py():
                # Cast before filtering: a MERGE writes view types, which Arrow cannot filter.
                whole = _PARQUET.make_fragment(path, filesystem=filesystem).to_table()
                found.append(conform(whole, spec).filter(mask))
        return pa.concat_tables(found).to_pylist() if found else []

    def _columns(
        self, table_uri: str, filesystem: pafs.FileSystem, path: str, columns: tuple[str, ...]
    ) -> pa.Table:
        """The file's `columns` as strings, from what is kept or read now (and kept)."""
        key = (table_uri, path, columns)
        kept = self._kept.get(key)
        if kept is not None:
            self._kept.move_to_end(key)
            return kept
        self.read += 1
        data = _PARQUET.make_fragment(path, filesystem=filesystem).to_table(columns=list(columns))
        kept = pa.table({c: pc.cast(data[c], pa.string()) for c in columns})
        if kept.nbytes <= self.most_bytes:
            self._kept[key] = kept
            self._bytes += kept.nbytes
            while self._bytes > self.most_bytes:
                _, dropped = self._kept.popitem(last=False)
                self._bytes -= dropped.nbytes
        return kept


_PARQUET = pads.ParquetFileFormat()


def rows_with(
    table: DeltaTable, spec: TableSpec, matches: Mapping[str, Collection[str]]
) -> list[dict[str, Any]]:
    """`FileKeys.rows_with` with nothing kept: every file's match columns are read (a local
    table's; the writer's lookups go through `OpenTables.keys`, which knows the lake's store)."""
    return FileKeys().rows_with(table, spec, matches)


def may_hold_any(files: pa.Table, matches: Mapping[str, Collection[str]]) -> list[bool]:
    """For each data file in `files` (a table's flattened add actions), whether its log
    statistics leave room for one of the `matches`: a value of a column among that column's
    strings, within the file's min and max. A file without a column's statistics may hold
    anything. delta-rs truncates long string statistics to a prefix (the min) and to a prefix
    with its last character raised (the max), so the range still bounds every value."""
    maybe = [False] * files.num_rows
    for column, values in matches.items():
        if not values:
            continue
        if f"min.{column}" not in files.column_names or f"max.{column}" not in files.column_names:
            return [True] * files.num_rows
        ordered = sorted(values)  # linear when the caller passes them sorted
        lows = files[f"min.{column}"].to_pylist()
        highs = files[f"max.{column}"].to_pylist()
        for i, (low, high) in enumerate(zip(lows, highs, strict=True)):
            if maybe[i]:
                continue
            if low is None or high is None:
                maybe[i] = True
                continue
            first = bisect.bisect_left(ordered, low)
            maybe[i] = first < len(ordered) and ordered[first] <= high
    return maybe


def may_hold(table: DeltaTable, column: str, *, low: int, high: int) -> bool:
    """Whether some data file of `table` may hold a `column` value between `low` and `high`,
    by the min/max statistics its log records (a file without them may)."""
    files = pa.table(table.get_add_actions(flatten=True))
    if not files.num_rows:
        return False
    least, most = files[f"min.{column}"], files[f"max.{column}"]
    unknown = pc.or_(pc.is_null(least), pc.is_null(most))
    overlap = pc.and_(pc.less_equal(least, high), pc.greater_equal(most, low))
    return bool(pc.any(pc.or_(unknown, pc.fill_null(overlap, False))).as_py())
