"""The commit protocol (DESIGN §3): one batch of a tenant's ops folded into each table's final
row changes and landed in one fenced Delta commit per table.

How a batch is cut and folded:
- Every table records `Transaction("oml-lakewriter", batch_end)` on each commit. A table whose
  txn version is at or above the batch's end is skipped; otherwise it takes the ops with seq in
  (its txn version, batch_end]. A table with nothing to change gets no commit, unless it lags
  more than `txn_lag_limit` ops (or others are ahead of the batch): then a txn-only commit, so
  the Delta log alone bounds every replay.
- The fold reads from the lowest txn version of the tenant's tables, so a table behind the others
  (a crash between commits, a lost table) is brought forward by the same pass.
- An op's verdict (applied or refused) is decided once and recorded in Postgres before any table
  commits (`oml.lake_dead_letter`, `oml.lake_verdicts`); later folds reuse it, so every table and
  every overlapping writer agrees on which ops apply.
- Commit order: bronze, lineage, curated, silver, areas. A curated table therefore exists
  before silver or areas record a batch past its validation.
- A commit that meets a concurrent one reloads the table and checks the skip rule again; rows
  are full final rows, so re-filtering them above the new txn version is all a retry needs.

Why one file (907 lines): it is one tenant batch from fetch to frontier, and the commit protocol is an
order (verdicts before any table commits, each table behind its txn fence, a reload after a
conflict, the frontier last; ADR 0001, 0002) that is read top to bottom in one place.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
import psycopg
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import (
    CommitProperties,
    DeltaTable,
    PostCommitHookProperties,
    Transaction,
    write_deltalake,
)
from deltalake.exceptions import CommitFailedError, DeltaError

from oml_dagster.lake import queries
from oml_dagster.lake.errors import (
    ConflictingCommit,
    InconsistentFrontier,
    LostCuratedTable,
    RefusedOp,
    VerdictConflict,
)
from oml_dagster.lake.ingest.bronze import checked_events, cleared_events
from oml_dagster.lake.ingest.fetch import Batch, Fetcher
from oml_dagster.lake.model import catalog, evolution
from oml_dagster.lake.model.catalog import Op
from oml_dagster.lake.model.tables import (
    APP_ID,
    BRONZE_EVENTS,
    CORE_TABLES,
    GOLD_AREAS,
    GOLD_CURATED,
    GOLD_LINEAGE,
    SILVER_CLAIMS,
    AppendWork,
    KeyedWork,
    TableId,
    TableSpec,
    TenantState,
    writer_properties,
)
from oml_dagster.lake.policy import erasure_bound
from oml_dagster.lake.queries import tenant_reads, tenant_scope
from oml_dagster.lake.store.layout import Lake
from oml_dagster.lake.store.lookups import FileKeys, may_hold
from oml_dagster.lake.store.open_tables import OpenTables, app_txn
from oml_dagster.lake.store.reads import query
from oml_dagster.lake.store.rewrites import compact_small_files
from oml_dagster.lake.store.sql import sql_text
from oml_dagster.lake.write import deadletter
from oml_dagster.lake.write.watchdog import Watchdog


@dataclass(frozen=True)
class WriterConfig:
    """How the writer batches, commits and bounds a fold. The defaults are the settings'
    defaults (a test pins them the same); the edge builds it from the settings
    (`oml_dagster.from_settings.writer_config`) and passes it down."""

    # A batch is what is pending, up to `max_batch` ops and about `max_batch_bytes` of payload
    # (PostgreSQL's stored size): a quiet outbox gives small batches (latency), a backlog large
    # ones up to the memory cap (throughput).
    max_batch: int = 50_000
    max_batch_bytes: int = 64 * 2**20
    # A table with nothing to change gets a txn-only commit once this many of the tenant's ops
    # lie between its txn version and the batch end. Must stay below max_batch. Every batch is
    # read from the lowest txn version of the tenant's tables, so a quiet table (gold.areas, a
    # curated table) makes each small batch re-read and re-fold up to this many ops; a txn-only
    # commit costs about as much as re-folding a hundred or two (ADR 0035).
    txn_lag_limit: int = 200
    max_commit_attempts: int = 8
    # A fold running longer than this fails with BatchTimeout naming its op (None: no bound).
    fold_timeout_seconds: float | None = 300.0
    # A drain lowers its batches' cap to keep its process's resident memory under this (MiB;
    # 0: no budget, the cap alone). See lake/memory.py.
    memory_budget_mib: int = 960

    def __post_init__(self):
        if self.max_batch < 2 or not 0 < self.txn_lag_limit < self.max_batch:
            raise ValueError("need max_batch >= 2 and 0 < txn_lag_limit < max_batch")

    def capped(self, max_batch: int) -> WriterConfig:
        """This config with batches of at most `max_batch` ops (the txn lag limit kept below)."""
        max_batch = max(2, min(max_batch, self.max_batch))
        return dataclasses.replace(
            self, max_batch=max_batch, txn_lag_limit=min(self.txn_lag_limit, max_batch // 2) or 1
        )

    @classmethod
    def for_batch(
        cls, max_batch: int, txn_lag_limit: int | None = None, **options: Any
    ) -> WriterConfig:
        """A config for batches of `max_batch` ops; the txn lag limit, unless given, is the
        default one, lowered to half a batch for small batches (one rule for the CLI and the
        Dagster resources); `options` set the other fields."""
        if txn_lag_limit is None:
            txn_lag_limit = min(cls.txn_lag_limit, max_batch // 2) or 1
        return cls(max_batch=max_batch, txn_lag_limit=txn_lag_limit, **options)


# What a batch did to one table: committed rows, a txn-only commit (no rows, the txn version
# moved), skipped (the table is at or past the batch end), or unchanged (nothing to commit).
CommitAction = Literal["committed", "txn-only", "skipped", "unchanged"]
COMMITTED: CommitAction = "committed"
TXN_ONLY: CommitAction = "txn-only"
SKIPPED: CommitAction = "skipped"
UNCHANGED: CommitAction = "unchanged"
# The actions that made a commit.
COMMITS: tuple[CommitAction, ...] = (COMMITTED, TXN_ONLY)


@dataclass
class TableOutcome:
    """What one batch did to one table."""

    table: str
    action: CommitAction
    rows: int = 0
    # Of `rows`, those the commit inserted and those it updated (from the MERGE's metrics).
    rows_added: int = 0
    rows_updated: int = 0
    txn_before: int = 0  # the table's app transaction version (an outbox seq) before the batch
    txn_after: int = 0
    version: int | None = None  # the Delta version the batch committed; None if it committed none
    attempts: int = 0  # commit attempts: more than one after concurrent commits


@dataclass
class BatchResult:
    tenant_id: str
    batch_start: int
    batch_end: int
    ops: int = 0
    refused: dict[int, str] = field(default_factory=dict)
    tables: list[TableOutcome] = field(default_factory=list)
    # Ops the catalog folded one by one (the rest went to bronze as columns).
    ops_folded: int = 0
    # The batch read ahead while this one folded and committed (ReadAhead), and whose it is:
    # this tenant's next one, or the next tenant's of a drain pass (None: nothing read ahead).
    next_batch: Future[Batch] | None = None
    next_tenant: str | None = None

    @property
    def committed(self) -> bool:
        return any(t.action in COMMITS for t in self.tables)

    def outcome(self, table: str) -> TableOutcome | None:
        return next((t for t in self.tables if t.table == table), None)


@dataclass(frozen=True)
class ReadAhead:
    """The batch a drain reads while the current one commits: `then`, (tenant_id, after), the
    first batch of the tenant the drain pass visits next (from its frontier as the drain last
    saw it; a batch read from the wrong place is read again, so a stale guess costs a fetch,
    never a verdict); with no tenant after this one in the pass, the tenant's own next batch
    when `own` and the outbox holds more."""

    own: bool
    then: tuple[str, int] | None = None


@dataclass
class _Handle:
    spec: TableSpec
    id: TableId
    uri: str
    table: DeltaTable | None
    txn: int

    @property
    def name(self) -> str:
        return str(self.id)


def _handle(
    tables: OpenTables, tenant_id: str, spec: TableSpec, workarea_id: str | None = None
) -> _Handle:
    uri = tables.lake.table_uri(tenant_id, spec, workarea_id)
    table = tables.open(uri)
    return _Handle(spec, TableId(spec.name, workarea_id), uri, table, tables.txn(uri, table))


# --- Postgres reads ----------------------------------------------------------------------------


def _payloads(conn: psycopg.Connection, tenant_id: str, seqs: list[int]) -> dict[int, dict]:
    """The payloads of ops the fetch sent as columns that the catalog must fold after all."""
    params = (tenant_id, min(seqs), max(seqs), seqs)
    with tenant_scope(conn, tenant_id):
        return dict(conn.execute(queries.OUTBOX_PAYLOADS, params).fetchall())


def _bodies(conn: psycopg.Connection, tenant_id: str, keys: set[tuple[str, int]]) -> dict:
    if not keys:
        return {}
    artifacts, versions = zip(*sorted(keys), strict=True)
    with tenant_scope(conn, tenant_id):
        rows = conn.execute(
            queries.BODIES_OF,
            (list(artifacts), list(versions), tenant_id),
        ).fetchall()
    return {(a, v): bytes(body) for a, v, body in rows}


def _api_keys(conn: psycopg.Connection, tenant_id: str, key_ids: set[str]) -> dict[str, str]:
    """api_key_id -> owning tenant, other tenants' keys included (through the one cross-tenant
    read a tenant's scope is granted: owners and ids only)."""
    if not key_ids:
        return {}
    with tenant_scope(conn, tenant_id):
        rows = conn.execute(queries.API_KEY_OWNERS, (sorted(key_ids),)).fetchall()
    return dict(rows)


def decided_through(conn: psycopg.Connection, tenant_id: str) -> int:
    with tenant_scope(conn, tenant_id):
        row = conn.execute(queries.DECIDED_THROUGH, (tenant_id,)).fetchone()
    return row[0] if row else 0


# --- reading the tables a fold needs -----------------------------------------------------------


_LIGHT = ("artifact_id", "version", "simulation_id", "sim_derived_ids", "workarea_id")


def _matching_silver_keys(table: DeltaTable, sims: set, tainted: set, workareas: set) -> set:
    """Keys of the silver rows a simulation end or a validation reads: rows of an ending
    simulation, rows derived from a tainted one, rows of a validated workarea. Matched over Arrow
    columns file by file; only the matching keys become Python objects (the whole table's
    light columns as dicts grew a drain's memory with the table)."""

    def strings(values: set) -> pa.Array:
        return pa.array(sorted(values), pa.string())

    sims_in, tainted_in, workareas_in = strings(sims), strings(tainted), strings(workareas)
    fields = {name: SILVER_CLAIMS.schema.field(name).type for name in _LIGHT}
    keys: set = set()
    for fragment in table.to_pyarrow_dataset().get_fragments():
        # Cast first: a MERGE writes view types, which the kernels below do not all take.
        light = fragment.to_table(columns=list(_LIGHT))
        light = pa.table({name: pc.cast(light[name], kind) for name, kind in fields.items()})
        mask = pc.or_(
            pc.is_in(light["simulation_id"], value_set=sims_in),
            pc.is_in(light["workarea_id"], value_set=workareas_in),
        )
        found = [light.filter(pc.fill_null(mask, False))]
        if tainted:
            derived = light["sim_derived_ids"].combine_chunks()
            hit = pc.is_in(pc.list_flatten(derived), value_set=tainted_in)
            rows = pc.unique(pc.filter(pc.list_parent_indices(derived), pc.fill_null(hit, False)))
            found.append(light.take(rows))
        for part in found:
            keys.update(
                zip(part["artifact_id"].to_pylist(), part["version"].to_pylist(), strict=True)
            )
    return keys


def _prefetch(
    state: TenantState, handles: dict[str, _Handle], ops: list[Op], files: FileKeys
) -> None:
    """Read every existing row the batch's ops can touch into the working tables (through
    `files`, which keeps the data files' match columns between batches)."""
    claim_keys = {
        (op.args["artifact_id"], op.args["version"]) for op in ops if op.name.startswith("claim.")
    }
    # Claim edges need their endpoints: the lake must hold both.
    claim_keys |= {
        (op.args[f"{end}_id"], op.args[f"{end}_version"])
        for op in ops
        if op.name == "edge.ratify" and op.args["graph"] == "claim"
        for end in ("src", "dst")
    }
    sims = {op.args["simulation_id"] for op in ops if op.name == "simulation.end"}
    tainted = {
        op.args["simulation_id"]
        for op in ops
        if op.name == "simulation.end" and op.args["demote_tainted"]
    }
    validations = {op.args["workarea_id"] for op in ops if op.name == "area.validate"}
    edge_ids = {op.args["edge_id"] for op in ops if op.name.startswith("edge.")}

    silver = handles[SILVER_CLAIMS.name].table
    if silver is not None:
        keys = set(claim_keys)
        if sims or validations:
            keys |= _matching_silver_keys(silver, sims, tainted, validations)
        if keys:
            rows = files.rows_with(silver, SILVER_CLAIMS, {"artifact_id": {k[0] for k in keys}})
            state.silver.load(r for r in rows if (r["artifact_id"], r["version"]) in keys)
            state.silver.looked_for(keys)

    lineage = handles[GOLD_LINEAGE.name].table
    if lineage is not None and (edge_ids or sims):
        matches = {"edge_id": edge_ids, "simulation_id": sims}
        state.lineage.load(files.rows_with(lineage, GOLD_LINEAGE, matches))
        state.lineage.looked_for((e,) for e in edge_ids)

    # Curated rows a demote, erase or repair reaches: routed by the silver row's workarea.
    retracted = {
        (op.args["artifact_id"], op.args["version"])
        for op in ops
        if op.name in ("claim.demote", "claim.erase", "claim.repair")
    }
    for workarea_id, work in state.curated.items():
        handle = handles.get(str(TableId.curated(workarea_id)))
        if handle is None or handle.table is None:
            continue
        wanted = {
            k
            for k in retracted
            if (row := state.silver.get(k)) is None or row["workarea_id"] == workarea_id
        }
        if wanted:
            rows = files.rows_with(
                handle.table, GOLD_CURATED, {"artifact_id": {k[0] for k in wanted}}
            )
            work.load(r for r in rows if (r["artifact_id"], r["version"]) in wanted)


# --- committing one table ----------------------------------------------------------------------


def _commit_properties(
    tenant_id: str, txn_before: int, batch_end: int, ops: int
) -> CommitProperties:
    return CommitProperties(
        app_transactions=[Transaction(app_id=APP_ID, version=batch_end)],
        custom_metadata={
            "oml.tenant_id": tenant_id,
            "oml.batch_start": str(txn_before),
            "oml.batch_end": str(batch_end),
            "oml.ops": str(ops),
        },
        max_commit_retries=0,
    )


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


def _write(
    handle: _Handle,
    lake: Lake,
    data: pa.Table,
    props: CommitProperties,
    configuration: dict[str, str],
    inserts_only: bool = False,
    target_filter: str | None = None,
) -> tuple[int, int]:
    """Create, MERGE or append. Rows that are all new to the table version committed on
    (`inserts_only`) are appended: a MERGE would read the table's files to find none of them.
    `target_filter` narrows the target rows a MERGE may match (it must hold for every row the
    source updates): its literals prune files by their statistics. Returns (rows inserted,
    rows updated)."""
    spec = handle.spec
    parquet = writer_properties(spec)
    merging = (
        handle.table is not None and bool(spec.merge_key and data.num_rows) and not inserts_only
    )
    # The table at the code's version, and the data right for its columns (ADR 0071).
    data = evolution.ready_to_write(handle.table, spec, data, append=not merging)
    if merging:
        predicate = " AND ".join(f"t.{c} = s.{c}" for c in spec.merge_key)
        if target_filter:
            predicate = f"{predicate} AND ({target_filter})"
        metrics = (
            handle.table.merge(
                data,
                predicate,
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
        return (
            int(metrics.get("num_target_rows_inserted", 0)),
            int(metrics.get("num_target_rows_updated", 0)),
        )
    # Creation is mode "error", so a concurrent creator fails this commit instead of being
    # appended to (write_deltalake would silently create a missing table on append).
    created = handle.table is None
    write_deltalake(
        handle.uri if created else handle.table,
        data,
        mode="error" if created else "append",
        partition_by=list(spec.partition_by) or None,
        configuration=configuration if created else None,
        storage_options=(lake.options_for(handle.uri) or None) if created else None,
        writer_properties=parquet,
        commit_properties=props,
        post_commithook_properties=post_commit_hooks(handle.table),
    )
    return data.num_rows, 0


# A MERGE narrowed to more boxes than this reads a long OR; past it the source-derived pruning
# alone is used.
MOST_TARGET_BOXES = 64


def _target_filter(work: KeyedWork, rows: list[dict]) -> str | None:
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


def _commit_table(
    lake: Lake,
    tenant_id: str,
    handle: _Handle,
    output: Callable[[int], pa.Table | list[dict]],
    op_seqs: list[int],
    batch_end: int,
    leading_txn: int,
    config: WriterConfig,
    configuration: dict[str, str],
    work: KeyedWork | None = None,
) -> TableOutcome:
    """Land `output(txn)` in one fenced commit, re-checking the skip rule after any conflict.
    `op_seqs` are the batch's seqs, ascending.
    On the first attempt the table version committed on is the one the fold read, so what
    `work` (a MERGE table's working copy) knows of it holds: rows all absent from it are
    appended, and a MERGE's target rows are narrowed to where the updated rows lie."""
    outcome = TableOutcome(handle.name, SKIPPED, txn_before=handle.txn, txn_after=handle.txn)
    last_conflict: Exception | None = None
    for attempt in range(1, config.max_commit_attempts + 1):
        outcome.attempts = attempt
        # The handle's txn was read from this very table state; after a conflict the table was
        # reloaded, so it is read again. (Each read replays the log since the last checkpoint:
        # one GET per commit on S3.)
        txn = handle.txn if attempt == 1 else app_txn(handle.table)
        handle.txn = outcome.txn_after = txn
        if batch_end <= txn:
            outcome.action = SKIPPED
            return outcome
        rows = output(txn)
        inserts_only, target_filter = False, None
        if not isinstance(rows, pa.Table):
            # After a concurrent commit (attempt > 1) any key may have appeared or moved: a plain
            # MERGE then.
            if attempt == 1 and work is not None and rows:
                inserts_only = work.only_new(rows)
                target_filter = None if inserts_only else _target_filter(work, rows)
            rows = pa.Table.from_pylist(rows, schema=handle.spec.schema)
        lag = len(op_seqs) - bisect.bisect_right(op_seqs, txn)  # the batch's ops after txn
        # A table that does not exist yet is created even empty: a tenant's first batch makes
        # every core table (an absent one counts as txn 0, so each later batch would re-read the
        # tenant's ops from the start), and a validation makes its curated table.
        if (
            not rows.num_rows
            and handle.table is not None
            and lag <= config.txn_lag_limit
            and batch_end >= leading_txn
        ):
            outcome.action = UNCHANGED
            return outcome
        props = _commit_properties(tenant_id, txn, batch_end, lag)
        try:
            added, updated = _write(
                handle, lake, rows, props, configuration, inserts_only, target_filter
            )
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
        if handle.table is None:
            handle.table = lake.open(handle.uri)
        # Otherwise the DeltaTable object already stands at the version it committed (delta-rs
        # updates a table's state in place after its own write or MERGE).
        outcome.action = COMMITTED if rows.num_rows else TXN_ONLY
        outcome.rows = rows.num_rows
        outcome.rows_added, outcome.rows_updated = added, updated
        handle.txn = outcome.txn_after = batch_end  # the app transaction just committed
        outcome.version = handle.table.version()
        return outcome
    raise ConflictingCommit(
        f"{handle.name} of tenant {tenant_id}: still conflicting after "
        f"{config.max_commit_attempts} attempts at batch_end {batch_end}"
    ) from last_conflict


# --- one batch ---------------------------------------------------------------------------------


def drain_tenant(
    conn: psycopg.Connection,
    lake: Lake,
    tenant_id: str,
    config: WriterConfig | None = None,
    *,
    before_commit: Callable[[str], None] | None = None,
    fetcher: Fetcher | None = None,
    prefetched: Future[Batch] | None = None,
    tables: OpenTables | None = None,
    read_ahead: ReadAhead | None = None,
) -> BatchResult:
    """Fold and commit the tenant's next batch. `fetcher` reads batches (one is opened and
    closed here when none is given); with a fetcher given, the batch `read_ahead` names is
    fetched on the fetcher's thread while this one commits, returned as `next_batch` (by
    default the tenant's own next one); `prefetched` is such a batch, used when it starts where
    this batch starts and has its cap. `tables` keeps the tenant's tables open for its next
    batch (a drain's batches share one); a batch that fails drops them.
    `before_commit(table_name)` is a test hook."""
    config = config or WriterConfig()
    tables = tables or OpenTables(lake)
    try:
        # The batch's reads share one transaction (`_drain_batch` closes it when they are done);
        # a batch that fails before rolls it back here. A fetcher opened here (none given) is
        # closed here, after it.
        with contextlib.ExitStack() as owned, contextlib.ExitStack() as reads:
            if fetcher is None:
                fetcher = owned.enter_context(Fetcher(conn))
                prefetched, read_ahead = None, ReadAhead(False)
            return _drain_batch(
                conn,
                tables,
                tenant_id,
                config,
                before_commit,
                fetcher,
                prefetched,
                read_ahead or ReadAhead(True),
                reads,
            )
    except BaseException:
        tables.forget(lake.tenant_uri(tenant_id))
        raise


def _drain_batch(
    conn: psycopg.Connection,
    tables: OpenTables,
    tenant_id: str,
    config: WriterConfig,
    before_commit: Callable[[str], None] | None,
    fetcher: Fetcher,
    prefetched: Future[Batch] | None,
    read_ahead: ReadAhead,
    reads: contextlib.ExitStack,
) -> BatchResult:
    lake = tables.lake
    handles, area_rows = _open_tables(tables, tenant_id)
    txns = [h.txn for h in handles.values()]
    base, leading = min(txns), max(txns)
    # One scoped transaction for every Postgres read before the fold (issue 35: each had its
    # own BEGIN, scope and COMMIT); closed before anything is written.
    reads.enter_context(tenant_reads(conn, tenant_id))
    decided = decided_through(conn, tenant_id)
    if leading > decided:
        raise InconsistentFrontier(
            f"tenant {tenant_id}: a table records txn {leading} but verdicts are decided only "
            f"through {decided}"
        )
    batch = prefetched.result() if prefetched is not None else None
    # A batch read ahead under another cap (the memory budget moved it): under a larger cap it
    # is cut to this one, under a smaller one it is a batch as it is. Read from the wrong place
    # (a stale guess), it is read again.
    if batch is not None and batch.after == base and batch.max_ops > config.max_batch:
        batch = batch.head(config.max_batch)
    if batch is None or batch.after != base:
        batch = fetcher.fetch(tenant_id, base, config.max_batch, config.max_batch_bytes)
    seqs = batch.seqs
    batch_end = seqs[-1] if seqs else base
    result = BatchResult(tenant_id, base, batch_end, ops=len(seqs))
    if read_ahead.then is not None:
        result.next_tenant, after = read_ahead.then
    elif read_ahead.own and batch.more:
        result.next_tenant, after = tenant_id, batch_end
    if result.next_tenant is not None:
        result.next_batch = fetcher.fetch_async(
            result.next_tenant, after, config.max_batch, config.max_batch_bytes
        )
    if not len(batch):
        reads.close()
        _update_frontier(conn, tenant_id, handles, base)
        return result
    recorded = deadletter.refused_seqs(conn, tenant_id, base, min(decided, batch_end))

    # The catalog folds every op but the events the columnar checks clear.
    columns = batch.columns
    checked = checked_events(columns)
    ops, rows = _catalog_ops(conn, tenant_id, columns.filter(pc.invert(checked[0])))
    catalog_events = [
        op.args["journal_seq"] for _, op in ops if isinstance(op, Op) and op.name == "journal.event"
    ]
    bronze = handles[BRONZE_EVENTS.name]
    cleared_seqs = pc.min_max(pc.cast(pc.filter(columns["f_journal_seq"], checked[0]), pa.int64()))
    held = _held_events(
        bronze.table,
        [*catalog_events, *(s.as_py() for s in cleared_seqs.values() if s.is_valid)],
    )
    cleared = cleared_events(
        columns,
        checked,
        bronze_txn=bronze.txn,
        refused={seq for seq in recorded if seq <= decided},
        held_journal_seqs=set(held),
        catalog_journal_seqs=catalog_events,
    )
    # Cleared events the batch's order decides after all (replays, conflicts, bad JSON text).
    if pc.any(cleared.folded).as_py():
        more_ops, more_rows = _catalog_ops(conn, tenant_id, columns.filter(cleared.folded))
        ops = sorted([*ops, *more_ops], key=lambda pair: pair[0])
        rows = sorted([*rows, *more_rows], key=lambda row: row[0])
    result.ops_folded = len(ops)
    parsed = [op for _, op in ops if isinstance(op, Op)]

    state = _working_state(conn, tenant_id, handles, area_rows, parsed, tables.keys)
    bound = erasure_bound(conn, tenant_id)
    reads.close()
    state.events.update(held)
    state.bronze.columns = cleared.rows
    label = f"tenant {tenant_id}, batch ({base}, {batch_end}]"
    with Watchdog(config.fold_timeout_seconds, label) as watchdog:
        refused = _fold(ops, decided, recorded, state, watchdog)
    result.refused = refused

    if batch_end > decided:
        _record_verdicts(conn, tenant_id, rows, refused, decided, batch_end)

    op_seqs = seqs

    def commit(handle: _Handle, work: AppendWork | KeyedWork) -> None:
        if before_commit is not None:
            before_commit(handle.name)
        configuration = handle.spec.configuration(int(bound.total_seconds()))
        result.tables.append(
            _commit_table(
                lake,
                tenant_id,
                handle,
                work.output,
                op_seqs,
                batch_end,
                leading,
                config,
                configuration,
                work if isinstance(work, KeyedWork) else None,
            )
        )

    commit(handles[BRONZE_EVENTS.name], state.bronze)
    commit(handles[GOLD_LINEAGE.name], state.lineage)
    for workarea_id in sorted(state.curated):
        name = str(TableId.curated(workarea_id))
        handle = handles.get(name) or _handle(tables, tenant_id, GOLD_CURATED, workarea_id)
        handles[name] = handle
        commit(handle, state.curated[workarea_id])
    commit(handles[SILVER_CLAIMS.name], state.silver)
    commit(handles[GOLD_AREAS.name], state.areas)
    for handle in handles.values():  # created, or reopened after a conflict
        tables.keep(handle.uri, handle.table, handle.txn)
    _update_frontier(conn, tenant_id, handles, batch_end)
    _compact_on_the_way(conn, tables, tenant_id, handles, result)
    return result


def _compact_on_the_way(
    conn: psycopg.Connection,
    tables: OpenTables,
    tenant_id: str,
    handles: dict[str, _Handle],
    result: BatchResult,
) -> None:
    """Once the batch is recorded, bin-pack the small files of the tables it wrote to, every
    SMALL_FILES_EVERY versions of each (ADR 0033). Another rewrite under way, or a commit of
    another writer in between, leaves it for a later batch (a lost race reopens the table)."""
    wrote = {t.table for t in result.tables if t.action == COMMITTED}
    for handle in handles.values():
        if handle.name not in wrote or handle.table is None:
            continue
        try:
            replaced = compact_small_files(
                conn,
                handle.table,
                handle.spec,
                tenant_id,
                handle.name,
                post_commit_hooks(handle.table),
            )
        except CommitFailedError:
            tables.forget(handle.uri)
            continue
        if replaced:  # a packing commit moved the version, not the txn: no log read for it
            tables.keep(handle.uri, handle.table, handle.txn)


def _catalog_ops(
    conn: psycopg.Connection, tenant_id: str, fetched: pa.Table
) -> tuple[list[tuple[int, Op | RefusedOp]], list[tuple]]:
    """The fetched rows parsed for the catalog, with the rows themselves (seq, journal_seq, op,
    payload, origin). Event payloads the fetch took apart are read again as a whole."""
    seqs = fetched["seq"].to_pylist()
    texts = fetched["payload_json"].to_pylist()
    missing = [seq for seq, text in zip(seqs, texts, strict=True) if text is None]
    whole = _payloads(conn, tenant_id, missing) if missing else {}
    rows = [
        (seq, journal_seq, name, orjson.loads(text) if text is not None else whole[seq], origin)
        for seq, journal_seq, name, text, origin in zip(
            seqs,
            fetched["journal_seq"].to_pylist(),
            fetched["op"].to_pylist(),
            texts,
            fetched["origin_journal_seq"].to_pylist(),
            strict=True,
        )
    ]
    return _parse(tenant_id, rows), rows


def _parse(tenant_id: str, rows: list[tuple]) -> list[tuple[int, Op | RefusedOp]]:
    return [
        (seq, catalog.parsed(seq, journal_seq, tenant_id, name, payload, origin))
        for seq, journal_seq, name, payload, origin in rows
    ]


def _held_events(bronze: DeltaTable | None, journal_seqs: list[int]) -> dict[int, tuple]:
    """journal_seq -> (event_id, hash) of the events bronze holds between the least and the
    greatest of `journal_seqs`. Bronze is not queried when no data file's journal_seq range
    (the log's statistics) reaches theirs: a stream's new events lie above every file."""
    if bronze is None or not journal_seqs:
        return {}
    low, high = min(journal_seqs), max(journal_seqs)
    if not may_hold(bronze, "journal_seq", low, high):
        return {}
    held = query(
        bronze, "journal_seq, event_id, hash", f"journal_seq BETWEEN {low} AND {high}"
    ).to_pylist()
    return {r["journal_seq"]: (r["event_id"], r["hash"]) for r in held}


def _open_tables(tables: OpenTables, tenant_id: str) -> tuple[dict[str, _Handle], list[dict]]:
    """Handles on the tenant's core tables and on one curated table per validated area (read
    from gold.areas, whose rows are returned too)."""
    handles = {spec.name: _handle(tables, tenant_id, spec) for spec in CORE_TABLES}
    areas = handles[GOLD_AREAS.name]
    area_rows = tables.rows(areas.uri, areas.table, GOLD_AREAS) if areas.table is not None else []
    for area in area_rows:
        if area["status"] == "validated":
            h = _handle(tables, tenant_id, GOLD_CURATED, area["workarea_id"])
            if h.table is None:
                raise LostCuratedTable(
                    f"tenant {tenant_id}: {h.name} is missing although gold.areas marks the area "
                    f"validated; delete {tables.lake.tenant_uri(tenant_id)} and drain the tenant "
                    "again"
                )
            handles[h.name] = h
    return handles, area_rows


def _working_state(
    conn: psycopg.Connection,
    tenant_id: str,
    handles: dict[str, _Handle],
    area_rows: list[dict],
    parsed: list[Op],
    files: FileKeys,
) -> TenantState:
    """The tables as their latest versions stand, with every row the batch's ops can touch, plus
    the claim bodies and api keys those ops need from Postgres."""
    state = TenantState(
        tenant_id=tenant_id,
        bronze=AppendWork(txn=handles[BRONZE_EVENTS.name].txn),
        silver=_keyed(handles[SILVER_CLAIMS.name]),
        lineage=_keyed(handles[GOLD_LINEAGE.name]),
        areas=_keyed(handles[GOLD_AREAS.name]),
        curated={h.id.workarea_id: _keyed(h) for h in handles.values() if h.spec is GOLD_CURATED},
        bodies=_bodies(
            conn,
            tenant_id,
            {
                (op.args["artifact_id"], op.args["version"])
                for op in parsed
                if op.name in ("claim.promote", "claim.repair")
            },
        ),
        api_keys=_api_keys(
            conn, tenant_id, {op.args["api_key_id"] for op in parsed if op.name == "journal.event"}
        ),
    )
    state.areas.load(area_rows)
    _prefetch(state, handles, parsed, files)
    return state


def _fold(
    ops: list[tuple[int, Op | RefusedOp]],
    decided: int,
    recorded: dict[int, str],
    state: TenantState,
    watchdog: Watchdog,
) -> dict[int, str]:
    """The batch through the one fold the reconciler also runs (`catalog.fold`), the watchdog
    told which op it is on. Returns the new refusals."""

    def on_op(seq: int, op: Op | RefusedOp) -> None:
        watchdog.on = f"op seq {seq} ({op.name if isinstance(op, Op) else 'unparsed'})"

    return catalog.fold(ops, state, decided=decided, recorded=recorded, on_op=on_op).refused


def _keyed(handle: _Handle) -> KeyedWork:
    return KeyedWork(handle.spec, txn=handle.txn)


def _record_verdicts(conn, tenant_id, rows, refused, decided, batch_end) -> None:
    """Record this batch's refusals and decided frontier before any table commits; another
    writer that decided first wins, and a disagreement stops this run."""
    by_seq = {r[0]: r for r in rows}
    with tenant_scope(conn, tenant_id):
        for seq, reason in refused.items():
            _, journal_seq, name, payload, _ = by_seq[seq]
            deadletter.record(conn, seq, tenant_id, journal_seq, name, payload, reason)
        conn.execute(
            queries.VERDICTS_UPSERT,
            (tenant_id, batch_end),
        )
    stored = deadletter.refused_seqs(conn, tenant_id, decided, batch_end)
    if set(stored) != set(refused):
        raise VerdictConflict(
            f"tenant {tenant_id}: recorded refusals in ({decided}, {batch_end}] differ from "
            f"this run's: {sorted(set(stored) ^ set(refused))}"
        )


def _update_frontier(conn, tenant_id: str, handles: dict[str, _Handle], batch_end: int) -> None:
    """Refresh the frontier cache: each table is drained through `batch_end`."""
    with tenant_scope(conn, tenant_id):
        for h in handles.values():
            conn.execute(
                queries.FRONTIER_UPSERT,
                (
                    tenant_id,
                    h.name,
                    batch_end,
                    h.txn,
                    h.table.version() if h.table is not None else None,
                ),
            )
