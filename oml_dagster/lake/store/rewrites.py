"""Rewrites of a table's data files outside maintenance's schedule (ADR 0033): the writer's
packing of its own small files, and the lock every rewrite of a table takes (maintenance's
bin-pack and Z-order included), so that two never run at once."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from deltalake import CommitProperties, DeltaTable, PostCommitHookProperties

from oml_dagster.lake import queries
from oml_dagster.lake.model.tables import TableId, TableSpec, writer_properties

# Compaction on the way (ADR 0033): every SMALL_FILES_EVERY versions of a table the writer
# commits to, the files below the table's target (its `target_file_size`, else
# SMALL_FILE_TARGET) are bin-packed into files of about that size. A
# standing shard run commits a tenant's micro-batches every few seconds, one small file each, and
# the writer's per-batch cost grows with the files it must look through (key scans, datasets,
# MERGE planning); the daily bin-pack alone would let thousands pile up. Files at the target or
# above (backlog batches, the daily bin-pack's, Z-order's) are never rewritten here.
SMALL_FILES_EVERY = 16
SMALL_FILE_TARGET = 8 * 2**20


def maintenance_commit(
    tenant_id: str, operation: str, trigger: str | None = None
) -> CommitProperties:
    """The commit properties of every maintenance commit (`oml.maintenance` = the operation;
    `oml.trigger` = "writer" for the writer's packing). No app transaction: delta-rs drops it on
    OPTIMIZE anyway, and a maintenance commit must never move the writer's txn version."""
    metadata = {"oml.tenant_id": tenant_id, "oml.maintenance": operation}
    if trigger is not None:
        metadata["oml.trigger"] = trigger
    return CommitProperties(custom_metadata=metadata)


@contextmanager
def rewrite_lock(
    conn: psycopg.Connection, tenant_id: str, table: TableId, *, wait: bool = True
) -> Iterator[bool]:
    """Hold the table's rewrite lock (queries.REWRITE_LOCK) for the block: wait for it, or
    (`wait=False`) yield False at once when another session holds it."""
    key = (queries.REWRITE_LOCK, f"{tenant_id}:{table}")
    if wait:
        conn.execute(queries.REWRITE_LOCK_TAKE, key)
        held = True
    else:
        row = conn.execute(queries.REWRITE_LOCK_TRY, key).fetchone()
        held = bool(row and row[0])
    try:
        yield held
    finally:
        if held:
            conn.execute(queries.REWRITE_LOCK_FREE, key)


def compact_small_files(
    conn: psycopg.Connection,
    table: DeltaTable,
    spec: TableSpec,
    *,
    tenant_id: str,
    table_id: TableId,
    hooks: PostCommitHookProperties | None,
) -> int | None:
    """Bin-pack the table's files below its target size (`spec.target_file_size`, else
    SMALL_FILE_TARGET: the tables retracts rewrite keep their smaller files) when its version is
    a multiple of SMALL_FILES_EVERY: the number of files replaced (0: nothing to do, no commit),
    or None when it was left for later — another rewrite of the table holds its lock, or the
    table moved past `table`'s version (the handle is then at the latest version). Like every
    rewrite it carries no app transaction and passes the writer's Parquet settings. A
    concurrent MERGE of files it read makes it raise CommitFailedError."""
    if table.version() % SMALL_FILES_EVERY:
        return 0
    with rewrite_lock(conn, tenant_id, table_id, wait=False) as held:
        if not held:
            return None
        version = table.version()
        table.update_incremental()
        if table.version() != version:
            return None
        metrics = table.optimize.compact(
            target_size=spec.target_file_size or SMALL_FILE_TARGET,
            writer_properties=writer_properties(spec),
            # "compact" is maintenance.COMPACT (maintenance imports this module).
            commit_properties=maintenance_commit(tenant_id, "compact", trigger="writer"),
            post_commithook_properties=hooks,
        )
    return int(metrics.get("numFilesRemoved") or 0)
