"""One table's part of a batch: its rows landed in one fenced Delta commit (DESIGN §3).

Every commit records `Transaction("oml-lakewriter", batch_end)`. A table whose txn version is at
or above the batch's end is skipped; a commit that meets a concurrent one reloads the table and
checks the skip rule again (rows are full final rows, so re-filtering them above the new txn
version is all a retry needs).

Each commit the writer is about to make is a `TableCommit`, told to a `CommitObserver` before it
is made and again once it landed: what a test needs to stop a batch before a given table's
commit, and what a benchmark needs to record a batch's commits and replay them with bare
deltalake calls (operation, rows, predicate, partitioning, app transaction and metadata).
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import pyarrow as pa
from deltalake import (
    CommitProperties,
    DeltaTable,
    PostCommitHookProperties,
    Transaction,
    write_deltalake,
)
from deltalake.exceptions import CommitFailedError, DeltaError

from oml_dagster.lake.errors import ConflictingCommit
from oml_dagster.lake.model import evolution
from oml_dagster.lake.model.tables import (
    APP_ID,
    KeyedWork,
    Row,
    TableId,
    TableSpec,
    writer_properties,
)
from oml_dagster.lake.store.layout import Lake
from oml_dagster.lake.store.open_tables import OpenTables, app_txn
from oml_dagster.lake.store.sql import sql_text

# What a batch did to one table: committed rows, a txn-only commit (no rows, the txn version
# moved), skipped (the table is at or past the batch end), or unchanged (nothing to commit).
CommitAction = Literal["committed", "txn-only", "skipped", "unchanged"]
COMMITTED: CommitAction = "committed"
TXN_ONLY: CommitAction = "txn-only"
SKIPPED: CommitAction = "skipped"
UNCHANGED: CommitAction = "unchanged"
# The actions that made a commit.
COMMITS: tuple[CommitAction, ...] = (COMMITTED, TXN_ONLY)

# How a commit lands: a new table, rows appended, a MERGE on the merge key, or an append of no
# rows that moves the txn version alone.
Operation = Literal["create", "append", "merge", "txn-only"]


@dataclass
class TableOutcome:
    """What one batch did to one table."""

    table: TableId
    action: CommitAction
    rows: int = 0
    # Of `rows`, those the commit inserted and those it updated (from the MERGE's metrics).
    rows_added: int = 0
    rows_updated: int = 0
    txn_before: int = 0  # the table's app transaction version (an outbox seq) before the batch
    txn_after: int = 0
    version: int | None = None  # the Delta version the batch committed; None if it committed none
    attempts: int = 0  # commit attempts: more than one after concurrent commits

    @property
    def name(self) -> str:
        return str(self.table)


@dataclass(frozen=True)
class TableCommit:
    """One commit the writer makes on one table: before it is made (`version` None), and once it
    landed (the version it made and what the commit's metrics say it did to the files). Enough
    to make it again with deltalake alone: `write_deltalake(uri, rows, mode=...)` for a create
    or an append (`partition_by`, `configuration` on create), `DeltaTable.merge(rows,
    predicate, source_alias="s", target_alias="t").when_matched_update_all()
    .when_not_matched_insert_all()` for a MERGE, each with `CommitProperties(app_transactions=
    [Transaction(APP_ID, batch_end)], custom_metadata=metadata)`."""

    table: TableId
    uri: str
    operation: Operation
    rows: pa.Table
    txn_before: int
    batch_end: int
    attempt: int
    metadata: Mapping[str, str]
    predicate: str | None = None
    partition_by: tuple[str, ...] = ()
    configuration: Mapping[str, str] | None = None
    version: int | None = None
    rows_added: int = 0
    rows_updated: int = 0
    # From a MERGE's metrics (an append or a create adds its files and removes none; delta-rs
    # does not count them for it: None).
    files_added: int | None = None
    files_removed: int | None = None
    files_scanned: int | None = None


class CommitObserver:
    """Hears each table commit of a batch. `before` runs just before the commit is made (an
    exception there stops the batch with the tables before it committed and this one and those
    after it not); `landed` once it is in the table's log. No-ops here."""

    def before(self, commit: TableCommit) -> None:
        """A commit is about to be made."""

    def landed(self, commit: TableCommit) -> None:
        """A commit landed (`commit.version` is the version it made)."""


@dataclass
class TableHandle:
    """One of a tenant's tables as a batch commits to it: the table as last read (None: not
    created yet) and its txn version, both moved by the batch's commits and reloads."""

    spec: TableSpec
    id: TableId
    uri: str
    table: DeltaTable | None
    txn: int


def open_handle(
    tables: OpenTables, tenant_id: str, spec: TableSpec, workarea_id: str | None = None
) -> TableHandle:
    """A handle on one of the tenant's tables, opened through `tables` (kept between batches)."""
    uri = tables.lake.table_uri(tenant_id, spec, workarea_id)
    table = tables.open(uri)
    return TableHandle(spec, TableId(spec.name, workarea_id), uri, table, tables.txn(uri, table))


@dataclass(frozen=True)
class CommitRules:
    """What bounds one table's commit in a batch: how many ops may lie between its txn version
    and the batch end before a table with nothing to change gets a txn-only commit, how many
    times a conflict is retried, and the configuration a table being created takes."""

    txn_lag_limit: int
    max_commit_attempts: int
    configuration: Mapping[str, str]


# Unless told otherwise, delta-rs expires old log entries after every commit, and to find them it
# lists the whole `_delta_log`: every commit inside the erasure bound stays there, so that one
# listing made each commit's cost grow with the table's history (decision 0030). The writer
# leaves log expiry to the commits that write a checkpoint (the spec's "log cleanup with
# checkpointing") and to maintenance's daily log cleanup, which the erasure SLO counts on.
_NO_LOG_CLEANUP = PostCommitHookProperties(create_checkpoint=True, cleanup_expired_logs=False)
# delta-rs's checkpoint interval for a table without `delta.checkpointInterval`.
_DELTA_CHECKPOINT_INTERVAL = 100


def post_commit_hooks(table: DeltaTable | None) -> PostCommitHookProperties | None:
    """What runs after the writer's next commit on `table` (None: delta-rs's defaults, the table's
    properties decide). The commit that writes a checkpoint keeps the defaults: the checkpoint,
    then expired-log cleanup. Every other commit writes no checkpoint anyway and skips the
    cleanup. A table being created (None) keeps the defaults. The writer's commits never retry,
    so the next commit's version is the table's version plus one."""
    if table is None:
        return None
    configured = table.metadata().configuration.get("delta.checkpointInterval")
    interval = int(configured) if configured else _DELTA_CHECKPOINT_INTERVAL
    version = table.version() + 1
    # delta-rs checkpoints after committing `version` when (version + 1) % interval == 0.
    return None if (version + 1) % interval == 0 else _NO_LOG_CLEANUP


def commit_table(
    *,
    lake: Lake,
    tenant_id: str,
    handle: TableHandle,
    output: Callable[[int], pa.Table | list[Row]],
    op_seqs: Sequence[int],
    batch_end: int,
    leading_txn: int,
    rules: CommitRules,
    work: KeyedWork | None = None,
    observer: CommitObserver | None = None,
) -> TableOutcome:
    """Land `output(txn)` in one fenced commit, re-checking the skip rule after any conflict.
    `op_seqs` are the batch's seqs, ascending; `leading_txn` the highest txn version of the
    tenant's tables (a table behind it gets a txn-only commit even with nothing to change).
    On the first attempt the table version committed on is the one the fold read, so what
    `work` (a MERGE table's working copy) knows of it holds: rows all absent from it are
    appended, and a MERGE's target rows are narrowed to where the updated rows lie."""
    observer = observer or CommitObserver()
    outcome = TableOutcome(handle.id, SKIPPED, txn_before=handle.txn, txn_after=handle.txn)
    last_conflict: Exception | None = None
    for attempt in range(1, rules.max_commit_attempts + 1):
        outcome.attempts = attempt
        # The handle's txn was read from this very table state; after a conflict the table was
        # reloaded, so it is read again. (Each read replays the log since the last checkpoint:
        # one GET per commit on S3.)
        txn = handle.txn if attempt == 1 else app_txn(handle.table)
        handle.txn = outcome.txn_after = txn
        if batch_end <= txn:
            outcome.action = SKIPPED
            return outcome
        lag = len(op_seqs) - bisect.bisect_right(op_seqs, txn)  # the batch's ops after txn
        planned = _planned(
            lake=lake,
            tenant_id=tenant_id,
            handle=handle,
            rows=output(txn),
            work=work if attempt == 1 else None,
            txn=txn,
            batch_end=batch_end,
            lag=lag,
            attempt=attempt,
            configuration=rules.configuration,
        )
        # A table that does not exist yet is created even empty: a tenant's first batch makes
        # every core table (an absent one counts as txn 0, so each later batch would re-read the
        # tenant's ops from the start), and a validation makes its curated table.
        if (
            planned.operation == "txn-only"
            and lag <= rules.txn_lag_limit
            and (batch_end >= leading_txn)
        ):
            outcome.action = UNCHANGED
            return outcome
        observer.before(planned)
        try:
            landed = _write(handle, lake, planned)
        except CommitFailedError as conflict:
            # A concurrent writer got there first: reload, then the skip rule decides.
            last_conflict = conflict
            handle.table = lake.open(handle.uri)
            continue
        except DeltaError as error:
            # Only the creation race is a conflict: another writer created the table first.
            reloaded = lake.open(handle.uri) if handle.table is None else None
            if reloaded is None:
                raise
            last_conflict = error
            handle.table = reloaded
            continue
        observer.landed(landed)
        outcome.action = COMMITTED if planned.rows.num_rows else TXN_ONLY
        outcome.rows = planned.rows.num_rows
        outcome.rows_added, outcome.rows_updated = landed.rows_added, landed.rows_updated
        handle.txn = outcome.txn_after = batch_end  # the app transaction just committed
        outcome.version = landed.version
        return outcome
    raise ConflictingCommit(
        f"{handle.id} of tenant {tenant_id}: still conflicting after "
        f"{rules.max_commit_attempts} attempts at batch_end {batch_end}"
    ) from last_conflict


def _planned(
    *,
    lake: Lake,
    tenant_id: str,
    handle: TableHandle,
    rows: pa.Table | list[Row],
    work: KeyedWork | None,
    txn: int,
    batch_end: int,
    lag: int,
    attempt: int,
    configuration: Mapping[str, str],
) -> TableCommit:
    """The commit `rows` make on the table as the handle holds it. Rows that are all new to the
    table version committed on (`work` knows it: the first attempt) are appended: a MERGE would
    read the table's files to find none of them; a MERGE's target rows are narrowed to the
    clustering boxes of the rows it updates."""
    spec = handle.spec
    target_filter, inserts_only = None, False
    if not isinstance(rows, pa.Table):
        # After a concurrent commit (no `work`) any key may have appeared or moved: a plain MERGE.
        if work is not None and rows:
            inserts_only = work.only_new(rows)
            target_filter = None if inserts_only else target_filter_of(work, rows)
        rows = pa.Table.from_pylist(rows, schema=spec.schema)
    operation: Operation
    predicate = None
    if handle.table is None:
        operation = "create"
    elif not rows.num_rows:
        operation = "txn-only"
    elif spec.merge_key and not inserts_only:
        operation = "merge"
        predicate = " AND ".join(f"t.{c} = s.{c}" for c in spec.merge_key)
        if target_filter:
            predicate = f"{predicate} AND ({target_filter})"
    else:
        operation = "append"
    return TableCommit(
        table=handle.id,
        uri=handle.uri,
        operation=operation,
        rows=rows,
        txn_before=txn,
        batch_end=batch_end,
        attempt=attempt,
        metadata={
            "oml.tenant_id": tenant_id,
            "oml.batch_start": str(txn),
            "oml.batch_end": str(batch_end),
            "oml.ops": str(lag),
        },
        predicate=predicate,
        partition_by=tuple(spec.partition_by),
        configuration=configuration if operation == "create" else None,
    )


def _write(handle: TableHandle, lake: Lake, commit: TableCommit) -> TableCommit:
    """Make `commit` on the handle's table; the commit as it landed (the handle then holds the
    table at the version it made)."""
    spec = handle.spec
    parquet = writer_properties(spec)
    props = CommitProperties(
        app_transactions=[Transaction(app_id=APP_ID, version=commit.batch_end)],
        custom_metadata=dict(commit.metadata),
        max_commit_retries=0,
    )
    merging = commit.operation == "merge"
    # The table at the code's version, and the data right for its columns (ADR 0071).
    data = evolution.ready_to_write(handle.table, spec, commit.rows, append=not merging)
    if merging and handle.table is not None and commit.predicate is not None:
        metrics = (
            handle.table.merge(
                data,
                commit.predicate,
                source_alias="s",
                target_alias="t",
                writer_properties=parquet,
                streamed_exec=False,
                commit_properties=props,
                post_commithook_properties=post_commit_hooks(handle.table),
            )
            .when_matched_update_all()
            .when_not_matched_insert_all()
            .execute()
        )
        # The DeltaTable object stands at the version it committed (delta-rs updates a table's
        # state in place after its own write or MERGE).
        return dataclasses.replace(
            commit,
            version=handle.table.version(),
            rows_added=int(metrics.get("num_target_rows_inserted", 0)),
            rows_updated=int(metrics.get("num_target_rows_updated", 0)),
            files_added=int(metrics.get("num_target_files_added", 0)),
            files_removed=int(metrics.get("num_target_files_removed", 0)),
            files_scanned=int(metrics.get("num_target_files_scanned", 0)),
        )
    # Creation is mode "error", so a concurrent creator fails this commit instead of being
    # appended to (write_deltalake would silently create a missing table on append).
    created = handle.table is None
    write_deltalake(
        handle.uri if handle.table is None else handle.table,
        data,
        mode="error" if created else "append",
        partition_by=list(commit.partition_by) or None,
        configuration=dict(commit.configuration) if commit.configuration is not None else None,
        storage_options=(lake.options_for(handle.uri) or None) if created else None,
        writer_properties=parquet,
        commit_properties=props,
        post_commithook_properties=post_commit_hooks(handle.table),
    )
    table = handle.table if handle.table is not None else lake.open(handle.uri)
    if table is None:
        raise DeltaError(f"{handle.uri}: the table just created cannot be opened")
    handle.table = table
    return dataclasses.replace(
        commit, version=table.version(), rows_added=data.num_rows, rows_updated=0
    )


# A MERGE narrowed to more boxes than this reads a long OR; past it the source-derived pruning
# alone is used.
MOST_TARGET_BOXES = 64


def target_filter_of(work: KeyedWork, rows: list[Row]) -> str | None:
    """`(t.c1 = v1 AND t.c2 = v2) OR ...` over the clustering columns of the rows the MERGE
    updates, with their values as the table holds them (a reassign's old workarea): Z-ordered
    files span narrow boxes of those columns, so the literals prune what the source-derived
    range on the merge key cannot. None when a value is unknown, NULL or not text/integer."""
    boxes = work.clustered(rows)
    if not boxes or len(boxes) > MOST_TARGET_BOXES:
        return None
    columns = work.spec.zorder_by
    terms = []
    for box in sorted(set(boxes)):
        parts = []
        for column, value in zip(columns, box, strict=True):
            if isinstance(value, str):
                parts.append(f"t.{column} = {sql_text(value)}")
            elif isinstance(value, int) and not isinstance(value, bool):
                parts.append(f"t.{column} = {value}")
            else:
                return None
        terms.append("(" + " AND ".join(parts) + ")")
    return " OR ".join(terms)
