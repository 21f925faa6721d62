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
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field

import psycopg
import pyarrow as pa
from deltalake import (
    ColumnProperties,
    CommitProperties,
    DeltaTable,
    Transaction,
    WriterProperties,
    write_deltalake,
)
from deltalake.exceptions import CommitFailedError, DeltaError

from . import catalog, deadletter
from .catalog import Op
from .errors import (
    ConflictingCommit,
    InconsistentFrontier,
    LostCuratedTable,
    RefusedOp,
    VerdictConflict,
)
from .state import AppendWork, KeyedWork, TenantState
from .storage import Lake, query, read_rows, sql_in
from .tables import (
    APP_ID,
    BRONZE_EVENTS,
    CORE_TABLES,
    GOLD_AREAS,
    GOLD_CURATED,
    GOLD_LINEAGE,
    SILVER_CLAIMS,
    TableSpec,
)
from .watchdog import Watchdog

DEFAULT_ERASURE_BOUND = dt.timedelta(days=7)


@dataclass(frozen=True)
class WriterConfig:
    max_batch: int = 5000
    # A table with nothing to change gets a txn-only commit once this many of the tenant's ops
    # lie between its txn version and the batch end. Must stay below max_batch.
    txn_lag_limit: int = 2500
    max_commit_attempts: int = 8
    # A fold running longer than this fails with BatchTimeout naming its op (None: no bound).
    fold_timeout_seconds: float | None = 300.0

    def __post_init__(self):
        if self.max_batch < 2 or not 0 < self.txn_lag_limit < self.max_batch:
            raise ValueError("need max_batch >= 2 and 0 < txn_lag_limit < max_batch")


@dataclass
class TableOutcome:
    table: str
    action: str  # committed | txn-only | skipped | unchanged
    rows: int = 0
    txn_before: int = 0
    txn_after: int = 0
    version: int | None = None
    attempts: int = 0


@dataclass
class BatchResult:
    tenant_id: str
    batch_start: int
    batch_end: int
    ops: int = 0
    refused: dict[int, str] = field(default_factory=dict)
    tables: list[TableOutcome] = field(default_factory=list)

    @property
    def committed(self) -> bool:
        return any(t.action in ("committed", "txn-only") for t in self.tables)

    def outcome(self, table: str) -> TableOutcome | None:
        return next((t for t in self.tables if t.table == table), None)


@dataclass
class _Handle:
    spec: TableSpec
    name: str
    uri: str
    table: DeltaTable | None
    txn: int


def _txn(table: DeltaTable | None) -> int:
    return (table.transaction_version(APP_ID) or 0) if table is not None else 0


def _handle(lake: Lake, tenant_id: str, spec: TableSpec, workarea_id: str | None = None) -> _Handle:
    uri = lake.table_uri(tenant_id, spec, workarea_id)
    table = lake.open(uri)
    name = f"{spec.name}/{workarea_id}" if workarea_id else spec.name
    return _Handle(spec, name, uri, table, _txn(table))


def writer_properties(spec: TableSpec) -> WriterProperties:
    """Parquet settings for every write, MERGE and rewrite: no statistics for body columns.
    Compression is named explicitly: WriterProperties without it writes uncompressed files."""
    return WriterProperties(
        compression="SNAPPY",
        column_properties={
            c: ColumnProperties(statistics_enabled="NONE") for c in spec.body_columns
        }
        or None,
    )


# --- Postgres reads ----------------------------------------------------------------------------


def _load_ops(conn: psycopg.Connection, tenant_id: str, after: int, limit: int) -> list[tuple]:
    """(seq, journal_seq, op, payload, origin_journal_seq): the last is the journal_seq of the
    act a re-enqueued dead letter was refused in, NULL for every other row."""
    return conn.execute(
        "SELECT o.seq, o.journal_seq, o.op, o.payload, d.journal_seq FROM oml.outbox o"
        " LEFT JOIN oml.lake_dead_letter d ON d.requeued_id = o.id"
        " WHERE o.tenant_id = %s AND o.seq > %s ORDER BY o.seq LIMIT %s",
        (tenant_id, after, limit),
    ).fetchall()


def erasure_bound(conn: psycopg.Connection, tenant_id: str) -> dt.timedelta:
    row = conn.execute(
        "SELECT lake_erasure_bound FROM oml.tenant_policy WHERE tenant_id = %s", (tenant_id,)
    ).fetchone()
    return row[0] if row else DEFAULT_ERASURE_BOUND


def _bodies(conn: psycopg.Connection, tenant_id: str, keys: set[tuple[str, int]]) -> dict:
    if not keys:
        return {}
    artifacts, versions = zip(*sorted(keys), strict=True)
    rows = conn.execute(
        "SELECT b.artifact_id::text, b.version, b.body_ciphertext FROM oml.claim_bodies b"
        " JOIN unnest(%s::uuid[], %s::bigint[]) AS k(artifact_id, version)"
        " ON b.artifact_id = k.artifact_id AND b.version = k.version WHERE b.tenant_id = %s",
        (list(artifacts), list(versions), tenant_id),
    ).fetchall()
    return {(a, v): bytes(body) for a, v, body in rows}


def _api_keys(conn: psycopg.Connection, key_ids: set[str]) -> dict[str, str]:
    if not key_ids:
        return {}
    rows = conn.execute(
        "SELECT api_key_id, tenant_id::text FROM oml.api_keys WHERE api_key_id = ANY(%s)",
        (sorted(key_ids),),
    ).fetchall()
    return dict(rows)


def decided_through(conn: psycopg.Connection, tenant_id: str) -> int:
    row = conn.execute(
        "SELECT decided_through FROM oml.lake_verdicts WHERE tenant_id = %s", (tenant_id,)
    ).fetchone()
    return row[0] if row else 0


# --- reading the tables a fold needs -----------------------------------------------------------


def _matching_silver_keys(table: DeltaTable, sims: set, tainted: set, workareas: set) -> set:
    """Keys of silver rows a simulation end or a validation reads, from a narrow scan."""
    light = query(
        table, "artifact_id, version, simulation_id, sim_derived_ids, workarea_id"
    ).to_pylist()
    keys = set()
    for row in light:
        derived = set(row["sim_derived_ids"] or ())
        if row["simulation_id"] in sims or derived & tainted or row["workarea_id"] in workareas:
            keys.add((row["artifact_id"], row["version"]))
    return keys


def _prefetch(state: TenantState, handles: dict[str, _Handle], ops: list[Op]) -> None:
    """Read every existing row the batch's ops can touch into the working tables."""
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
            rows = read_rows(silver, SILVER_CLAIMS, sql_in("artifact_id", {k[0] for k in keys}))
            state.silver.load(r for r in rows if (r["artifact_id"], r["version"]) in keys)

    bronze = handles[BRONZE_EVENTS.name].table
    journal_seqs = [op.args["journal_seq"] for op in ops if op.name == "journal.event"]
    if bronze is not None and journal_seqs:
        held = query(
            bronze,
            "journal_seq, event_id, hash",
            f"journal_seq BETWEEN {min(journal_seqs)} AND {max(journal_seqs)}",
        ).to_pylist()
        state.events.update((r["journal_seq"], (r["event_id"], r["hash"])) for r in held)

    lineage = handles[GOLD_LINEAGE.name].table
    if lineage is not None and (edge_ids or sims):
        condition = f"{sql_in('edge_id', edge_ids)} OR {sql_in('simulation_id', sims)}"
        state.lineage.load(read_rows(lineage, GOLD_LINEAGE, condition))

    # Curated rows a demote, erase or repair reaches: routed by the silver row's workarea.
    retracted = {
        (op.args["artifact_id"], op.args["version"])
        for op in ops
        if op.name in ("claim.demote", "claim.erase", "claim.repair")
    }
    for workarea_id, work in state.curated.items():
        handle = handles.get(f"{GOLD_CURATED.name}/{workarea_id}")
        if handle is None or handle.table is None:
            continue
        wanted = {
            k
            for k in retracted
            if (row := state.silver.get(k)) is None or row["workarea_id"] == workarea_id
        }
        if wanted:
            rows = read_rows(
                handle.table, GOLD_CURATED, sql_in("artifact_id", {k[0] for k in wanted})
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


def _write(
    handle: _Handle,
    lake: Lake,
    rows: list[dict],
    props: CommitProperties,
    configuration: dict[str, str],
) -> None:
    spec = handle.spec
    data = pa.Table.from_pylist(rows, schema=spec.schema)
    parquet = writer_properties(spec)
    if handle.table is None:
        write_deltalake(
            handle.uri,
            data,
            mode="error",
            partition_by=list(spec.partition_by) or None,
            configuration=configuration,
            storage_options=lake.storage_options or None,
            writer_properties=parquet,
            commit_properties=props,
        )
    elif spec.merge_key and rows:
        predicate = " AND ".join(f"t.{c} = s.{c}" for c in spec.merge_key)
        (
            handle.table.merge(
                data,
                predicate,
                source_alias="s",
                target_alias="t",
                writer_properties=parquet,
                streamed_exec=False,
                commit_properties=props,
            )
            .when_matched_update_all()
            .when_not_matched_insert_all()
            .execute()
        )
    else:
        write_deltalake(
            handle.table,
            data,
            mode="append",
            partition_by=list(spec.partition_by) or None,
            writer_properties=parquet,
            commit_properties=props,
        )


def _commit_table(
    lake: Lake,
    tenant_id: str,
    handle: _Handle,
    output: Callable[[int], list[dict]],
    op_seqs: list[int],
    batch_end: int,
    leading_txn: int,
    config: WriterConfig,
    configuration: dict[str, str],
) -> TableOutcome:
    """Land `output(txn)` in one fenced commit, re-checking the skip rule after any conflict."""
    outcome = TableOutcome(handle.name, "skipped", txn_before=handle.txn, txn_after=handle.txn)
    last_conflict: Exception | None = None
    for attempt in range(1, config.max_commit_attempts + 1):
        outcome.attempts = attempt
        txn = _txn(handle.table)
        outcome.txn_after = txn
        if batch_end <= txn:
            outcome.action = "skipped"
            return outcome
        rows = output(txn)
        lag = sum(1 for s in op_seqs if s > txn)
        # A table that does not exist yet is created even empty: a tenant's first batch makes
        # every core table (an absent one counts as txn 0, so each later batch would re-read the
        # tenant's ops from the start), and a validation makes its curated table.
        if (
            not rows
            and handle.table is not None
            and lag <= config.txn_lag_limit
            and batch_end >= leading_txn
        ):
            outcome.action = "unchanged"
            return outcome
        props = _commit_properties(tenant_id, txn, batch_end, lag)
        try:
            _write(handle, lake, rows, props, configuration)
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
        handle.table = lake.open(handle.uri)
        outcome.action = "committed" if rows else "txn-only"
        outcome.rows = len(rows)
        outcome.txn_after = batch_end
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
) -> BatchResult:
    """Fold and commit the tenant's next batch. `before_commit(table_name)` is a test hook."""
    config = config or WriterConfig()
    handles, area_rows = _open_tables(lake, tenant_id)
    txns = [h.txn for h in handles.values()]
    base, leading = min(txns), max(txns)
    decided = decided_through(conn, tenant_id)
    if leading > decided:
        raise InconsistentFrontier(
            f"tenant {tenant_id}: a table records txn {leading} but verdicts are decided only "
            f"through {decided}"
        )
    rows = _load_ops(conn, tenant_id, base, config.max_batch)
    if not rows:
        result = BatchResult(tenant_id, base, base)
        _update_frontier(conn, tenant_id, handles, base)
        return result
    batch_end = rows[-1][0]
    result = BatchResult(tenant_id, base, batch_end, ops=len(rows))
    recorded = deadletter.refused_seqs(conn, tenant_id, base, min(decided, batch_end))

    ops: list[tuple[int, Op | RefusedOp]] = []
    for seq, journal_seq, name, payload, origin in rows:
        try:
            ops.append((seq, catalog.parse(seq, journal_seq, tenant_id, name, payload, origin)))
        except RefusedOp as refused:
            ops.append((seq, refused))
    parsed = [op for _, op in ops if isinstance(op, Op)]

    state = _working_state(conn, tenant_id, handles, area_rows, parsed)
    batch = f"tenant {tenant_id}, batch ({base}, {batch_end}]"
    with Watchdog(config.fold_timeout_seconds, batch) as watchdog:
        refused = _fold(ops, decided, recorded, state, watchdog)
    result.refused = refused

    if batch_end > decided:
        _record_verdicts(conn, tenant_id, rows, refused, decided, batch_end)

    bound = erasure_bound(conn, tenant_id)
    op_seqs = [r[0] for r in rows]

    def commit(handle: _Handle, output) -> None:
        if before_commit is not None:
            before_commit(handle.name)
        configuration = handle.spec.configuration(int(bound.total_seconds()))
        result.tables.append(
            _commit_table(
                lake,
                tenant_id,
                handle,
                output,
                op_seqs,
                batch_end,
                leading,
                config,
                configuration,
            )
        )

    commit(handles[BRONZE_EVENTS.name], state.bronze.output)
    commit(handles[GOLD_LINEAGE.name], state.lineage.output)
    for workarea_id in sorted(state.curated):
        name = f"{GOLD_CURATED.name}/{workarea_id}"
        handle = handles.get(name) or _handle(lake, tenant_id, GOLD_CURATED, workarea_id)
        handles[name] = handle
        commit(handle, state.curated[workarea_id].output)
    commit(handles[SILVER_CLAIMS.name], state.silver.output)
    commit(handles[GOLD_AREAS.name], state.areas.output)
    _update_frontier(conn, tenant_id, handles, batch_end)
    return result


def _open_tables(lake: Lake, tenant_id: str) -> tuple[dict[str, _Handle], list[dict]]:
    """Handles on the tenant's core tables and on one curated table per validated area (read
    from gold.areas, whose rows are returned too)."""
    handles = {spec.name: _handle(lake, tenant_id, spec) for spec in CORE_TABLES}
    areas_table = handles[GOLD_AREAS.name].table
    area_rows = read_rows(areas_table, GOLD_AREAS) if areas_table is not None else []
    for area in area_rows:
        if area["status"] == "validated":
            h = _handle(lake, tenant_id, GOLD_CURATED, area["workarea_id"])
            if h.table is None:
                raise LostCuratedTable(
                    f"tenant {tenant_id}: {h.name} is missing although gold.areas marks the area "
                    f"validated; delete {lake.tenant_uri(tenant_id)} and drain the tenant again"
                )
            handles[h.name] = h
    return handles, area_rows


def _working_state(
    conn: psycopg.Connection,
    tenant_id: str,
    handles: dict[str, _Handle],
    area_rows: list[dict],
    parsed: list[Op],
) -> TenantState:
    """The tables as their latest versions stand, with every row the batch's ops can touch, plus
    the claim bodies and api keys those ops need from Postgres."""
    state = TenantState(
        tenant_id=tenant_id,
        bronze=AppendWork(txn=handles[BRONZE_EVENTS.name].txn),
        silver=_keyed(handles[SILVER_CLAIMS.name]),
        lineage=_keyed(handles[GOLD_LINEAGE.name]),
        areas=_keyed(handles[GOLD_AREAS.name]),
        curated={
            h.name.split("/", 1)[1]: _keyed(h) for h in handles.values() if h.spec is GOLD_CURATED
        },
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
            conn, {op.args["api_key_id"] for op in parsed if op.name == "journal.event"}
        ),
    )
    state.areas.load(area_rows)
    _prefetch(state, handles, parsed)
    return state


def _fold(
    ops: list[tuple[int, Op | RefusedOp]],
    decided: int,
    recorded: dict[int, str],
    state: TenantState,
    watchdog: Watchdog,
) -> dict[int, str]:
    """Apply the batch's ops in seq order. Ops at or below `decided` keep their recorded
    verdict; later ones are checked against the tables as of the op. Returns new refusals."""
    refused: dict[int, str] = {}
    for seq, op in ops:
        watchdog.on = f"op seq {seq} ({op.name if isinstance(op, Op) else 'unparsed'})"
        if seq <= decided:
            if seq in recorded or isinstance(op, RefusedOp):
                continue
            catalog.apply(op, state)
            continue
        if isinstance(op, RefusedOp):
            refused[seq] = op.reason
            continue
        try:
            catalog.check(op, state)
        except RefusedOp as refusal:
            refused[seq] = refusal.reason
            continue
        catalog.apply(op, state)
    return refused


def _keyed(handle: _Handle) -> KeyedWork:
    return KeyedWork(handle.spec, txn=handle.txn)


def _record_verdicts(conn, tenant_id, rows, refused, decided, batch_end) -> None:
    """Record this batch's refusals and decided frontier before any table commits; another
    writer that decided first wins, and a disagreement stops this run."""
    by_seq = {r[0]: r for r in rows}
    with conn.transaction():
        for seq, reason in refused.items():
            _, journal_seq, name, payload, _ = by_seq[seq]
            deadletter.record(conn, seq, tenant_id, journal_seq, name, payload, reason)
        conn.execute(
            "INSERT INTO oml.lake_verdicts (tenant_id, decided_through) VALUES (%s, %s)"
            " ON CONFLICT (tenant_id) DO UPDATE SET decided_through ="
            " GREATEST(oml.lake_verdicts.decided_through, EXCLUDED.decided_through),"
            " updated_at = now()",
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
    with conn.transaction():
        for h in handles.values():
            conn.execute(
                "INSERT INTO oml.lake_frontier"
                " (tenant_id, table_name, batch_end, txn_version, table_version)"
                " VALUES (%s, %s, %s, %s, %s)"
                " ON CONFLICT (tenant_id, table_name) DO UPDATE SET"
                " batch_end = EXCLUDED.batch_end, txn_version = EXCLUDED.txn_version,"
                " table_version = EXCLUDED.table_version, updated_at = now()",
                (
                    tenant_id,
                    h.name,
                    batch_end,
                    _txn(h.table),
                    h.table.version() if h.table is not None else None,
                ),
            )


def lag(conn: psycopg.Connection, tenant_id: str, drained_through: int) -> tuple[int, float]:
    """(ops sequenced but not drained, seconds since the oldest of them was written)."""
    count, oldest = conn.execute(
        "SELECT count(*), min(created_at) FROM oml.outbox WHERE tenant_id = %s AND seq > %s",
        (tenant_id, drained_through),
    ).fetchone()
    seconds = (dt.datetime.now(dt.UTC) - oldest).total_seconds() if oldest else 0.0
    return count, max(seconds, 0.0)
