"""Small builders for core tests: a workarea tree and claims written through the producer."""

from __future__ import annotations

import io
import threading
from collections.abc import Callable, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from oml_dagster.lake.ingest.fetch import Fetcher
from oml_dagster.lake.model.tables import (
    BRONZE_EVENTS,
    GOLD_AREAS,
    GOLD_LINEAGE,
    SILVER_CLAIMS,
    writer_properties,
)
from oml_dagster.lake.write.commit import CommitObserver, TableCommit
from oml_dagster.lake.write.drain import DrainPass, DrainPolicy, drain
from oml_dagster.simulate import acts
from oml_dagster_tests.conftest import by_key, table_rows
from oml_testbed.workloads import (  # noqa: F401  (the tests import them from here)
    Tree,
    claim,
    lake_snapshot,
    make_tree,
    mixed_workload,
    new_id,
    promoted,
)


class LakeView:
    """The tenant's tables after a drain, keyed for assertions."""

    def __init__(self, lake, tenant_id):
        self.lake, self.tenant_id = lake, tenant_id

    @property
    def silver(self) -> dict:
        return by_key(
            table_rows(self.lake, self.tenant_id, SILVER_CLAIMS), "artifact_id", "version"
        )

    def claim(self, c: acts.Claim) -> dict:
        return self.silver[(c.artifact_id, c.version)]

    @property
    def areas(self) -> dict:
        return by_key(table_rows(self.lake, self.tenant_id, GOLD_AREAS), "workarea_id")

    @property
    def lineage(self) -> dict:
        return by_key(table_rows(self.lake, self.tenant_id, GOLD_LINEAGE), "edge_id")

    @property
    def bronze(self) -> list[dict]:
        return table_rows(self.lake, self.tenant_id, BRONZE_EVENTS)


def drain_all(conn, lake) -> list[DrainPass]:
    """Every pending tenant drained until idle (`oml-lake drain --until-idle`)."""
    return drain(conn, lake, policy=DrainPolicy(until_idle=True))


def dead_letters(conn) -> dict[int, tuple[str, str]]:
    return {
        seq: (op, reason)
        for seq, op, reason in conn.execute(
            "SELECT seq, op, reason FROM oml.lake_dead_letter ORDER BY seq"
        )
    }


def split_checkpoint(table_uri: str, parts: int) -> int:
    """Rewrite the table's latest single-file checkpoint as a `parts`-part checkpoint
    (`v.checkpoint.000000000i.000000000n.parquet`, as Spark writes them) and point
    `_last_checkpoint` at it; returns the checkpoint's version."""
    import json
    from pathlib import Path

    import pyarrow.parquet as pq

    log = Path(table_uri) / "_delta_log"
    hint = json.loads((log / "_last_checkpoint").read_text())
    version = int(hint["version"])
    single = log / f"{version:020d}.checkpoint.parquet"
    actions = pq.read_table(single)
    size = -(-actions.num_rows // parts)
    for part in range(parts):
        name = f"{version:020d}.checkpoint.{part + 1:010d}.{parts:010d}.parquet"
        pq.write_table(actions.slice(part * size, size), log / name)
    single.unlink()
    (log / "_last_checkpoint").write_text(json.dumps({"version": version, "parts": parts}))
    return version


def column_chunks(path: str) -> Iterator[pq.ColumnChunkMetaData]:
    """Every column chunk of every row group of the Parquet file at `path`, from its footer."""
    meta = pq.ParquetFile(path).metadata
    for group in range(meta.num_row_groups):
        row_group = meta.row_group(group)
        for column in range(row_group.num_columns):
            yield row_group.column(column)


def holds(content: bytes, needle: bytes) -> bool:
    """Whether a file's bytes hold `needle`: raw, or, for a Parquet file, in a value of any of
    its binary columns once decoded. A raw scan alone misses about one value in 256: Snappy
    stores a run that repeats earlier bytes of its page as a back-reference, and a value's
    first (or last) byte together with the 4-byte length prefix beside it repeats an earlier
    value's often enough, so the value is in the file but not as contiguous bytes."""
    if needle in content:
        return True
    if not content.startswith(b"PAR1"):
        return False
    table = pq.read_table(io.BytesIO(content))
    binary = (
        c for c in table.columns if pa.types.is_binary(c.type) or pa.types.is_large_binary(c.type)
    )
    return any(v is not None and needle in v for column in binary for v in column.to_pylist())


def merge_rows(table, spec, rows: list[dict]) -> None:
    """MERGE `rows` into `table` on the spec's merge key, as the writer does (its files then hold
    the view types a MERGE writes)."""
    predicate = " AND ".join(f"t.{c} = s.{c}" for c in spec.merge_key)
    (
        table.merge(
            pa.Table.from_pylist(rows, schema=spec.schema),
            predicate,
            source_alias="s",
            target_alias="t",
            writer_properties=writer_properties(spec),
            streamed_exec=False,
        )
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute()
    )


def recorded_fetches(monkeypatch) -> list[tuple[str, int, str]]:
    """Every batch fetch from now on, as (tenant_id, after, the thread that fetched it)."""
    fetched: list[tuple[str, int, str]] = []
    fetch = Fetcher.fetch

    def recorded(self, tenant_id, *, after, **options):
        fetched.append((tenant_id, after, threading.current_thread().name))
        return fetch(self, tenant_id, after=after, **options)

    monkeypatch.setattr(Fetcher, "fetch", recorded)
    return fetched


def assert_exactly_once(conn, lake, tenants, reference: dict | None = None, note: str = "") -> None:
    """Every journal event of each tenant in bronze once, and every table of each tenant equal
    to `reference` (tenant -> `lake_snapshot`), or, without it, to a fault-free drain of the same
    outbox into a lake of its own."""
    if reference is None:
        from oml_dagster.lake.store.layout import Lake
        from oml_dagster.lake.write.drain import DrainPolicy

        other = Lake(lake.root.rstrip("/") + "-reference", lake.storage_options)
        drain(conn, other, [t.tenant_id for t in tenants], policy=DrainPolicy(until_idle=True))
        reference = {t.tenant_id: lake_snapshot(other, t.tenant_id) for t in tenants}
    for keys in tenants:
        events = conn.execute(
            "SELECT count(*) FROM oml.outbox WHERE tenant_id = %s AND op = 'journal.event'",
            (keys.tenant_id,),
        ).fetchone()[0]
        bronze = LakeView(lake, keys.tenant_id).bronze
        assert sorted(r["journal_seq"] for r in bronze) == list(range(1, events + 1)), note
        assert lake_snapshot(lake, keys.tenant_id) == reference[keys.tenant_id], note


class BeforeEachCommit(CommitObserver):
    """Calls `hook(table name)` before the first attempt of each table commit a batch makes:
    a test's way to stop, hold or race a batch at a given table."""

    def __init__(self, hook: Callable[[str], None]):
        self.hook = hook
        self.made: list[TableCommit] = []

    def before(self, commit: TableCommit) -> None:
        if commit.attempt == 1:
            self.hook(str(commit.table))

    def landed(self, commit: TableCommit) -> None:
        self.made.append(commit)
