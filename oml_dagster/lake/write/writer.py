"""The commit protocol (DESIGN §3): one batch of a tenant's ops folded into each table's final
row changes and landed in one fenced Delta commit per table.

A batch is a `TenantBatch` in three phases, which its caller (the drain, or `drain_tenant`)
runs in turn:
- `read`: one scoped PostgreSQL session (`queries.tenant_scope`) and the tenant's tables give a
  `BatchRead`, every input of the fold and nothing the fold may change: the outbox rows parsed,
  the events the columnar checks cleared, the rows of the tables the ops can touch, the claim
  bodies and api keys they name, the recorded verdicts and the erasure bound.
- `fold`: the one fold the reconciler also runs (`catalog.fold`) over those inputs.
- `commit`: the verdicts recorded in PostgreSQL, then one fenced commit per table (bronze,
  lineage, curated, silver, areas), then the frontier cache: an order read in one place.

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
  before silver or areas record a batch past its validation (ADR 0001, 0002).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
from deltalake.exceptions import CommitFailedError

from oml_dagster.lake import queries
from oml_dagster.lake.errors import (
    InconsistentFrontier,
    LostCuratedTable,
    RefusedOp,
    VerdictConflict,
)
from oml_dagster.lake.ingest.bronze import checked_events, cleared_events
from oml_dagster.lake.ingest.fetch import Batch, Fetcher, parse_payload
from oml_dagster.lake.model import catalog
from oml_dagster.lake.model.catalog import Op
from oml_dagster.lake.model.tables import (
    BRONZE_EVENTS,
    CORE_TABLES,
    GOLD_AREAS,
    GOLD_CURATED,
    GOLD_LINEAGE,
    SILVER_CLAIMS,
    AppendWork,
    Key,
    KeyedWork,
    Row,
    TableId,
    TenantState,
)
from oml_dagster.lake.policy import read_erasure_bound
from oml_dagster.lake.queries import TenantSession, tenant_scope
from oml_dagster.lake.store.layout import Lake
from oml_dagster.lake.store.open_tables import OpenTables
from oml_dagster.lake.store.rewrites import compact_small_files
from oml_dagster.lake.write import deadletter
from oml_dagster.lake.write.commit import (
    COMMITS,
    COMMITTED,
    SKIPPED,
    TXN_ONLY,
    UNCHANGED,
    CommitAction,
    CommitObserver,
    CommitRules,
    TableCommit,
    TableHandle,
    TableOutcome,
    commit_table,
    open_handle,
    post_commit_hooks,
)
from oml_dagster.lake.write.touched import TouchedRows, held_events, touched_rows
from oml_dagster.lake.write.watchdog import Watchdog

__all__ = [
    "COMMITS",
    "COMMITTED",
    "SKIPPED",
    "TXN_ONLY",
    "UNCHANGED",
    "BatchRead",
    "BatchResult",
    "CommitAction",
    "CommitObserver",
    "Folded",
    "TableCommit",
    "TableOutcome",
    "TenantBatch",
    "WriterConfig",
    "drain_tenant",
    "post_commit_hooks",
]


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

    def __post_init__(self) -> None:
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


@dataclass
class BatchResult:
    """What one batch did: its bounds, its ops, the refusals it decided and each table's part."""

    tenant_id: str
    batch_start: int
    batch_end: int
    ops: int = 0
    refused: dict[int, str] = field(default_factory=dict)
    tables: list[TableOutcome] = field(default_factory=list)
    # Ops the catalog folded one by one (the rest went to bronze as columns).
    ops_folded: int = 0

    @property
    def committed(self) -> bool:
        return any(t.action in COMMITS for t in self.tables)

    def outcome(self, table: TableId) -> TableOutcome | None:
        return next((t for t in self.tables if t.table == table), None)


# An outbox row as the fold and the dead letters take it: (seq, journal_seq, op, payload, the
# journal_seq of the dead letter it was requeued from).
OutboxRow = tuple[int, int, str, Any, int | None]


@dataclass(frozen=True)
class BatchRead:
    """A batch's inputs, read once (`TenantBatch.read`): nothing here changes after the read."""

    tenant_id: str
    batch_start: int  # the lowest txn version of the tenant's tables: the batch starts after it
    batch_end: int  # its last op's seq (`batch_start` when it has none)
    leading_txn: int  # the highest txn version of the tenant's tables
    decided: int  # verdicts are recorded through this seq
    seqs: tuple[int, ...]
    # Whether the outbox may hold more of the tenant's sequenced ops right after this batch.
    more: bool
    ops: tuple[tuple[int, Op | RefusedOp], ...] = ()
    rows: tuple[OutboxRow, ...] = ()
    recorded: Mapping[int, str] = field(default_factory=dict)  # recorded refusals, by seq
    cleared: pa.Table | None = None  # the events bronze takes as columns
    held: Mapping[int, tuple[str, bytes]] = field(default_factory=dict)
    areas: tuple[Row, ...] = ()  # gold.areas as it stands
    touched: TouchedRows = field(default_factory=TouchedRows)
    bodies: Mapping[Key, bytes] = field(default_factory=dict)
    api_keys: Mapping[str, str] = field(default_factory=dict)
    txns: Mapping[TableId, int] = field(default_factory=dict)  # each table's txn version
    erasure_bound_seconds: int = 0


@dataclass(frozen=True)
class Folded:
    """What the fold made of a batch: the new refusals and the tables' working copies."""

    refused: Mapping[int, str]
    state: TenantState


class TenantBatch:
    """One batch of one tenant: `read`, `fold`, `commit`, in that order, each once. The tenant's
    tables come from `tables` (kept open from one batch to the next of a drain); a phase that
    fails drops them, so the next batch reopens them. `commits` hears each table commit."""

    def __init__(
        self,
        *,
        tables: OpenTables,
        tenant_id: str,
        config: WriterConfig,
        commits: CommitObserver | None = None,
    ):
        self.tables, self.lake = tables, tables.lake
        self.tenant_id = queries.tenant_text(tenant_id)
        self.config = config
        self.commits = _KeepingWhole(tables, commits)
        self._handles: dict[TableId, TableHandle] = {}

    @contextlib.contextmanager
    def _phase(self) -> Iterator[None]:
        try:
            yield
        except BaseException:
            self.tables.forget(self.lake.tenant_uri(self.tenant_id))
            raise

    # --- read ------------------------------------------------------------------------------

    def read(self, conn: psycopg.Connection, *, fetcher: Fetcher, ahead: Batch | None) -> BatchRead:
        """Every input of the fold, through one scoped session on `conn`. The outbox rows come
        from `ahead` (a batch the drain read ahead) when it starts where this batch starts,
        from `fetcher` otherwise: a batch read from a stale frontier is read again, so a wrong
        guess costs a fetch, never a verdict."""
        with self._phase(), tenant_scope(conn, self.tenant_id) as session:
            self._handles, areas = _open_tables(self.tables, self.tenant_id)
            txns = {table_id: h.txn for table_id, h in self._handles.items()}
            base, leading = min(txns.values()), max(txns.values())
            decided = _decided_through(session)
            if leading > decided:
                raise InconsistentFrontier(
                    f"tenant {self.tenant_id}: a table records txn {leading} but verdicts are "
                    f"decided only through {decided}"
                )
            batch = self._batch_from(fetcher, ahead, base)
            seqs = tuple(batch.seqs)
            read = BatchRead(
                tenant_id=self.tenant_id,
                batch_start=base,
                batch_end=seqs[-1] if seqs else base,
                leading_txn=leading,
                decided=decided,
                seqs=seqs,
                more=batch.more,
                txns=txns,
            )
            if not seqs:
                return read
            return self._read_ops(session, batch, read=read, areas=areas)

    def _batch_from(self, fetcher: Fetcher, ahead: Batch | None, base: int) -> Batch:
        """The batch after `base`: `ahead` when it starts there (cut to this batch's cap when it
        was read under a larger one; under a smaller one it is a batch as it is), else fetched."""
        cap = self.config.max_batch
        if ahead is not None and ahead.after == base:
            return ahead.head(cap) if ahead.max_ops > cap else ahead
        return fetcher.fetch(
            self.tenant_id, after=base, max_ops=cap, max_bytes=self.config.max_batch_bytes
        )

    def _read_ops(
        self, session: TenantSession, batch: Batch, *, read: BatchRead, areas: list[Row]
    ) -> BatchRead:
        """The batch's ops parsed, the events the columnar checks clear, and every row, body and
        key the ops name."""
        decided, batch_end = read.decided, read.batch_end
        recorded = _refused_in(session, read.batch_start, min(decided, batch_end))
        # The catalog folds every op but the events the columnar checks clear.
        columns = batch.columns
        checked = checked_events(columns)
        ops, rows = _catalog_ops(session, columns.filter(pc.invert(checked[0])))
        catalog_events = [
            op.args["journal_seq"]
            for _, op in ops
            if isinstance(op, Op) and op.name == "journal.event"
        ]
        bronze = self._handles[TableId(BRONZE_EVENTS.name)]
        cleared_seqs = pc.min_max(
            pc.cast(pc.filter(columns["f_journal_seq"], checked[0]), pa.int64())
        )
        held = held_events(
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
            more_ops, more_rows = _catalog_ops(session, columns.filter(cleared.folded))
            ops = sorted([*ops, *more_ops], key=lambda pair: pair[0])
            rows = sorted([*rows, *more_rows], key=lambda row: row[0])
        parsed = [op for _, op in ops if isinstance(op, Op)]
        return dataclasses.replace(
            read,
            ops=tuple(ops),
            rows=tuple(rows),
            recorded=recorded,
            cleared=cleared.rows,
            held=held,
            areas=tuple(areas),
            touched=self._touched(parsed),
            bodies=_bodies(session, parsed),
            api_keys=_api_keys(session, parsed),
            erasure_bound_seconds=int(read_erasure_bound(session).total_seconds()),
        )

    def _touched(self, parsed: list[Op]) -> TouchedRows:
        curated = {
            h.id.workarea_id: h.table
            for h in self._handles.values()
            if h.spec is GOLD_CURATED and h.id.workarea_id and h.table is not None
        }
        return touched_rows(
            ops=parsed,
            silver=self._handles[TableId(SILVER_CLAIMS.name)].table,
            lineage=self._handles[TableId(GOLD_LINEAGE.name)].table,
            curated=curated,
            lookup=self.tables,
        )

    # --- fold ------------------------------------------------------------------------------

    def fold(self, read: BatchRead) -> Folded:
        """The batch through the one fold the reconciler also runs (`catalog.fold`), on working
        copies of the tables made from `read`, under the fold's time bound."""
        state = _working_state(read)
        label = f"tenant {read.tenant_id}, batch ({read.batch_start}, {read.batch_end}]"
        with self._phase(), Watchdog(self.config.fold_timeout_seconds, label) as watchdog:

            def on_op(seq: int, op: Op | RefusedOp) -> None:
                watchdog.on = f"op seq {seq} ({op.name if isinstance(op, Op) else 'unparsed'})"

            verdicts = catalog.fold(
                read.ops, state, decided=read.decided, recorded=read.recorded, on_op=on_op
            )
        return Folded(refused=verdicts.refused, state=state)

    # --- commit ----------------------------------------------------------------------------

    def commit(self, conn: psycopg.Connection, read: BatchRead, folded: Folded) -> BatchResult:
        """The safety-critical order: the batch's verdicts recorded, then one fenced commit per
        table (bronze, lineage, curated, silver, areas), then the frontier cache; last, the
        small files of the tables written to are packed on the way."""
        result = BatchResult(
            read.tenant_id,
            read.batch_start,
            read.batch_end,
            ops=len(read.seqs),
            refused=dict(folded.refused),
            ops_folded=len(read.ops),
        )
        with self._phase():
            if not read.seqs:
                self._update_frontier(conn, read.batch_start)
                return result
            if read.batch_end > read.decided:
                _record_verdicts(conn, read, folded.refused)
            state = folded.state
            self._commit(read, TableId(BRONZE_EVENTS.name), state.bronze, into=result)
            self._commit(read, TableId(GOLD_LINEAGE.name), state.lineage, into=result)
            for workarea_id in sorted(state.curated):
                curated = TableId.curated(workarea_id)
                self._commit(read, curated, state.curated[workarea_id], into=result)
            self._commit(read, TableId(SILVER_CLAIMS.name), state.silver, into=result)
            self._commit(read, TableId(GOLD_AREAS.name), state.areas, into=result)
            for handle in self._handles.values():  # created, or reopened after a conflict
                self.tables.keep(handle.uri, handle.table, handle.txn)
            self._update_frontier(conn, read.batch_end)
            self._compact_on_the_way(conn, result)
        return result

    def _commit(
        self,
        read: BatchRead,
        table_id: TableId,
        work: AppendWork | KeyedWork,
        *,
        into: BatchResult,
    ) -> None:
        """One table's fenced commit of the batch, its outcome added to `into`."""
        handle = self._handles.get(table_id)
        if handle is None:  # a curated table the batch creates
            handle = open_handle(self.tables, read.tenant_id, GOLD_CURATED, table_id.workarea_id)
            self._handles[table_id] = handle
        configuration = handle.spec.configuration(read.erasure_bound_seconds)
        outcome = commit_table(
            lake=self.lake,
            tenant_id=read.tenant_id,
            handle=handle,
            output=work.output,
            op_seqs=read.seqs,
            batch_end=read.batch_end,
            leading_txn=read.leading_txn,
            rules=CommitRules(
                txn_lag_limit=self.config.txn_lag_limit,
                max_commit_attempts=self.config.max_commit_attempts,
                configuration=configuration,
            ),
            work=work if isinstance(work, KeyedWork) else None,
            observer=self.commits,
        )
        into.tables.append(outcome)

    def _update_frontier(self, conn: psycopg.Connection, batch_end: int) -> None:
        """Refresh the frontier cache: each table is drained through `batch_end`."""
        handles = list(self._handles.values())
        with tenant_scope(conn, self.tenant_id) as session:
            session.execute(
                queries.FRONTIER_UPSERT,
                (
                    session.tenant_id,
                    batch_end,
                    [str(h.id) for h in handles],
                    [h.txn for h in handles],
                    [h.table.version() if h.table is not None else None for h in handles],
                ),
            )

    def _compact_on_the_way(self, conn: psycopg.Connection, result: BatchResult) -> None:
        """Once the batch is recorded, bin-pack the small files of the tables it wrote to, every
        SMALL_FILES_EVERY versions of each (ADR 0033). Another rewrite under way, or a commit of
        another writer in between, leaves it for a later batch (a lost race reopens the table)."""
        wrote = {t.table for t in result.tables if t.action == COMMITTED}
        for handle in self._handles.values():
            if handle.id not in wrote or handle.table is None:
                continue
            before = handle.table.version()
            try:
                replaced = compact_small_files(
                    conn,
                    handle.table,
                    handle.spec,
                    tenant_id=self.tenant_id,
                    table_id=handle.id,
                    hooks=post_commit_hooks(handle.table),
                )
            except CommitFailedError:
                self.tables.forget(handle.uri)
                continue
            if replaced:  # a packing commit moved the version, not the txn: no log read for it
                self.tables.keep(handle.uri, handle.table, handle.txn)
                self.tables.repacked(handle.uri, before, handle.table.version())


class _KeepingWhole(CommitObserver):
    """The batch's observer: the caller's observer hears each commit, then a landed one brings
    the tables kept whole forward (`OpenTables.landed`)."""

    def __init__(self, tables: OpenTables, then: CommitObserver | None):
        self.tables, self.then = tables, then or CommitObserver()

    def before(self, commit: TableCommit) -> None:
        self.then.before(commit)

    def landed(self, commit: TableCommit) -> None:
        self.then.landed(commit)
        if commit.version is None:
            return
        self.tables.landed(
            commit.uri,
            operation=commit.operation,
            version=commit.version,
            rows=commit.rows,
            spec=commit.table.spec,
        )


def drain_tenant(
    conn: psycopg.Connection,
    lake: Lake,
    tenant_id: str,
    *,
    config: WriterConfig | None = None,
    commits: CommitObserver | None = None,
    tables: OpenTables | None = None,
) -> BatchResult:
    """Read, fold and commit the tenant's next batch (a fetcher of its own, no read-ahead: the
    drain runs the phases itself to read ahead). `commits` hears each table commit; `tables`
    keeps the tenant's tables open for a next batch."""
    batch = TenantBatch(
        tables=tables or OpenTables(lake),
        tenant_id=tenant_id,
        config=config or WriterConfig(),
        commits=commits,
    )
    with Fetcher(conn) as fetcher:
        read = batch.read(conn, fetcher=fetcher, ahead=None)
    return batch.commit(conn, read, batch.fold(read))


# --- the reads of a batch, in its session --------------------------------------------------------


def _decided_through(session: TenantSession) -> int:
    row = session.execute(queries.DECIDED_THROUGH, (session.tenant_id,)).fetchone()
    return int(row[0]) if row else 0


def _refused_in(session: TenantSession, after: int, through: int) -> dict[int, str]:
    if through <= after:
        return {}
    return dict(session.execute(queries.REFUSED_IN, (session.tenant_id, after, through)).fetchall())


def _bodies(session: TenantSession, parsed: list[Op]) -> dict[Key, bytes]:
    """The claim bodies the batch's promotions and repairs carry into silver."""
    keys = {
        (op.args["artifact_id"], op.args["version"])
        for op in parsed
        if op.name in ("claim.promote", "claim.repair")
    }
    if not keys:
        return {}
    artifacts, versions = zip(*sorted(keys), strict=True)
    rows = session.execute(
        queries.BODIES_OF, (list(artifacts), list(versions), session.tenant_id)
    ).fetchall()
    return {(a, v): bytes(body) for a, v, body in rows}


def _api_keys(session: TenantSession, parsed: list[Op]) -> dict[str, str]:
    """api_key_id -> owning tenant of the keys the batch's events name, other tenants' keys
    included (through the one cross-tenant read a tenant's scope is granted: owners and ids)."""
    key_ids = {op.args["api_key_id"] for op in parsed if op.name == "journal.event"}
    if not key_ids:
        return {}
    return dict(session.execute(queries.API_KEY_OWNERS, (sorted(key_ids),)).fetchall())


def _catalog_ops(
    session: TenantSession, fetched: pa.Table
) -> tuple[list[tuple[int, Op | RefusedOp]], list[OutboxRow]]:
    """The fetched rows parsed for the catalog, with the rows themselves (seq, journal_seq, op,
    payload, origin): each payload from the text the batch's one fetch carried, parsed once."""
    rows: list[OutboxRow] = [
        (seq, journal_seq, name, parse_payload(text), origin)
        for seq, journal_seq, name, text, origin in zip(
            fetched["seq"].to_pylist(),
            fetched["journal_seq"].to_pylist(),
            fetched["op"].to_pylist(),
            fetched["payload_json"].to_pylist(),
            fetched["origin_journal_seq"].to_pylist(),
            strict=True,
        )
    ]
    tenant_id = session.tenant_id
    ops = [
        (
            seq,
            catalog.parsed(
                name,
                payload,
                seq=seq,
                journal_seq=journal_seq,
                tenant_id=tenant_id,
                origin_journal_seq=origin,
            ),
        )
        for seq, journal_seq, name, payload, origin in rows
    ]
    return ops, rows


def _open_tables(
    tables: OpenTables, tenant_id: str
) -> tuple[dict[TableId, TableHandle], list[Row]]:
    """Handles on the tenant's core tables and on one curated table per validated area (read
    from gold.areas, whose rows are returned too)."""
    handles = {TableId(spec.name): open_handle(tables, tenant_id, spec) for spec in CORE_TABLES}
    areas = handles[TableId(GOLD_AREAS.name)]
    area_rows = tables.rows(areas.uri, areas.table, GOLD_AREAS) if areas.table is not None else []
    for area in area_rows:
        if area["status"] == "validated":
            h = open_handle(tables, tenant_id, GOLD_CURATED, area["workarea_id"])
            if h.table is None:
                raise LostCuratedTable(
                    f"tenant {tenant_id}: {h.id} is missing although gold.areas marks the area "
                    f"validated; delete {tables.lake.tenant_uri(tenant_id)} and drain the tenant "
                    "again"
                )
            handles[h.id] = h
    return handles, area_rows


def _working_state(read: BatchRead) -> TenantState:
    """The tables as their latest versions stand, with every row the batch's ops can touch."""

    def keyed(spec_name: str, workarea_id: str | None = None) -> KeyedWork:
        table_id = TableId(spec_name, workarea_id)
        return KeyedWork(table_id.spec, txn=read.txns[table_id])

    touched = read.touched
    state = TenantState(
        tenant_id=read.tenant_id,
        bronze=AppendWork(txn=read.txns[TableId(BRONZE_EVENTS.name)]),
        silver=keyed(SILVER_CLAIMS.name),
        lineage=keyed(GOLD_LINEAGE.name),
        areas=keyed(GOLD_AREAS.name),
        curated={
            t.workarea_id: keyed(GOLD_CURATED.name, t.workarea_id)
            for t in read.txns
            if t.workarea_id is not None
        },
        bodies=dict(read.bodies),
        api_keys=dict(read.api_keys),
    )
    state.areas.load(read.areas)
    state.silver.load(touched.silver)
    state.silver.looked_for(touched.silver_sought)
    state.lineage.load(touched.lineage)
    state.lineage.looked_for(touched.lineage_sought)
    for workarea_id, rows in touched.curated.items():
        state.curated[workarea_id].load(rows)
    state.events.update(read.held)
    state.bronze.columns = read.cleared
    return state


def _record_verdicts(conn: psycopg.Connection, read: BatchRead, refused: Mapping[int, str]) -> None:
    """Record this batch's refusals and decided frontier before any table commits, in one
    transaction: another writer that decided first wins (its rows stand, ours are not
    inserted), and a disagreement stops this run with nothing of its verdicts recorded. The
    check reads after the inserts, in a snapshot of its own (READ COMMITTED), so it sees what
    a writer that decided first committed."""
    by_seq = {r[0]: r for r in read.rows}
    tenant_id, decided, batch_end = read.tenant_id, read.decided, read.batch_end
    with tenant_scope(conn, tenant_id) as session:
        for seq, reason in refused.items():
            _, journal_seq, name, payload, _ = by_seq[seq]
            deadletter.record(
                session, seq=seq, journal_seq=journal_seq, op=name, payload=payload, reason=reason
            )
        session.execute(queries.VERDICTS_UPSERT, (tenant_id, batch_end))
        stored = _refused_in(session, decided, batch_end)
        if set(stored) != set(refused):
            raise VerdictConflict(
                f"tenant {tenant_id}: recorded refusals in ({decided}, {batch_end}] differ from "
                f"this run's: {sorted(set(stored) ^ set(refused))}"
            )
