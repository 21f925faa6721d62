"""The lake as tenant-partitioned assets (DESIGN §4): the Postgres outbox upstream, and the five
lake tables that one lake-writer run brings forward together.

The core folds one batch of a tenant's ops into every table at once (`drain_tenant`), so the five
tables are one multi-asset. A run keeps sequencing and draining its tenant, batch after batch,
through the core's drain loop until the tenant is idle or the run's time cap passes (ADR 0021),
and reports each table's commits over the whole run as that asset's materialization. The
dependencies are the data's lineage as an operator reads it (outbox → bronze/silver → gold), not
an execution order: the core owns the commit order.
"""

from collections import Counter
from collections.abc import Iterator

import psycopg
from dagster import (
    AssetExecutionContext,
    AssetKey,
    AssetSpec,
    MaterializeResult,
    MetadataValue,
    TableColumn,
    TableColumnConstraints,
    TableSchema,
    multi_asset,
)

from oml_dagster.lake import queries
from oml_dagster.lake.audit.freshness import tenant_lag
from oml_dagster.lake.model.tables import (
    BRONZE_EVENTS,
    GOLD_AREAS,
    GOLD_CURATED,
    GOLD_LINEAGE,
    SILVER_CLAIMS,
    TableId,
    TableSpec,
)
from oml_dagster.lake.policy import lag
from oml_dagster.lake.queries import tenant_scope
from oml_dagster.lake.store.layout import Lake
from oml_dagster.lake.write import deadletter
from oml_dagster.lake.write.drain import DrainPass, DrainPolicy, drain_riding_through
from oml_dagster.lake.write.writer import COMMITS, BatchResult, TableOutcome

from .failures import RunDrainObserver, failing_clearly, with_retry
from .partitions import tenant_partitions
from .resources import LakeResource, PostgresResource, WriterResource

OUTBOX = AssetKey(["postgres", "outbox"])
BRONZE = AssetKey(["bronze", "events"])
SILVER = AssetKey(["silver", "claims"])
LINEAGE = AssetKey(["gold", "lineage"])
AREAS = AssetKey(["gold", "areas"])
CURATED = AssetKey(["gold", "curated"])

# Which table each asset is, in the core's naming.
TABLE_OF: dict[AssetKey, TableSpec] = {
    BRONZE: BRONZE_EVENTS,
    SILVER: SILVER_CLAIMS,
    LINEAGE: GOLD_LINEAGE,
    AREAS: GOLD_AREAS,
    CURATED: GOLD_CURATED,
}


def _column_schema(spec: TableSpec) -> TableSchema:
    return TableSchema(
        columns=[
            TableColumn(
                name=f.name,
                type=str(f.type),
                description=spec.meanings.get(f.name) or None,
                constraints=None if f.nullable else TableColumnConstraints(nullable=False),
            )
            for f in spec.schema
        ]
    )


def _lake_spec(key: AssetKey, group: str, deps: list[AssetKey], description: str) -> AssetSpec:
    spec = TABLE_OF[key]
    return AssetSpec(
        key,
        deps=deps,
        group_name=group,
        description=description,
        kinds={"deltalake"},
        partitions_def=tenant_partitions,
        metadata={
            "table": spec.name,
            "path": f"<OML_LAKE_URI>/<tenant_id>/{spec.relpath}"
            + ("/<workarea_id>" if spec is GOLD_CURATED else ""),
            "dagster/column_schema": _column_schema(spec),
        },
    )


outbox = AssetSpec(
    OUTBOX,
    group_name="postgres",
    description=(
        "oml.outbox in Postgres, the authority: producers write a tenant's ops in the same "
        "transaction as the act; the outbox sensor sequences them and reports each tenant's "
        "newly sequenced rows here."
    ),
    kinds={"postgres"},
    partitions_def=tenant_partitions,
)

LAKE_SPECS: list[AssetSpec] = [
    _lake_spec(BRONZE, "bronze", [OUTBOX], "Every journal event of the tenant, append-only."),
    _lake_spec(SILVER, "silver", [OUTBOX], "Claims with their lifecycle state and sealed body."),
    _lake_spec(
        LINEAGE, "gold", [SILVER], "Ratified lineage edges between claims, demoted with them."
    ),
    _lake_spec(AREAS, "gold", [BRONZE], "The tenant's workarea tree, folded from its events."),
    _lake_spec(
        CURATED,
        "gold",
        [SILVER, AREAS],
        "One table per validated workarea: silver's promoted rows as of the validation, "
        "retracted with silver afterwards.",
    ),
]


def run_metadata(
    conn: psycopg.Connection, lake: Lake, results: list[BatchResult]
) -> dict[AssetKey, dict]:
    """What one run did to each table over its batches (at least one), as numbers the UI plots
    over time: rows added and updated by its commits, the table's version and txn version
    afterwards, the run's bounds (first batch's start, last batch's end), the number of batches
    that read ops (the loop's last, empty look for more is not one),
    the ops they read and those new to the lake (applied or dead-lettered), how far the
    table's txn version lags the sequenced outbox, and how far the tenant still lags: the age
    and count of its outbox rows not yet in every core table (`drain_lag_*`, the number the
    freshness check judges; the same on every table)."""
    first, last = results[0], results[-1]
    tenant_id = first.tenant_id
    batch_start, batch_end = first.batch_start, last.batch_end
    # A batch starts at the least advanced table, so it may re-read ops other tables hold
    # already (ADR 0002); the ops above the most advanced table are the ones new to the lake.
    # A replay after a loss finds every table gone: all its ops are new again. Over a run, the
    # new ops start where its earliest batch found the most advanced table.
    new_from = min(max((t.txn_before for t in r.tables), default=r.batch_end) for r in results)
    new_ops = 0
    with tenant_scope(conn, tenant_id):
        if new_from < batch_end:
            new_ops = queries.ops_in(conn, tenant_id, new_from, batch_end)
        # Where every table stands after the run (the run has just refreshed this cache).
        frontier = queries.frontier_versions(conn, tenant_id)
    # Verdicts recorded by an earlier run of the same ops count too: a replay reuses them.
    refused = len(deadletter.refused_seqs(conn, tenant_id, new_from, batch_end))
    outcomes_of_run = [t for r in results for t in r.tables]
    # The tenant's lag after the run: a table's own lag above counts from its txn version, which
    # an idle table (no op of its kind) keeps for up to txn_lag_limit ops, drained or not.
    behind = tenant_lag(conn, tenant_id)
    drain_lag = {
        "drain_lag_seconds": float(behind.seconds) if behind else 0.0,
        "drain_lag_ops": (behind.ops_waiting + behind.ops_unsequenced) if behind else 0,
    }
    found: dict[AssetKey, dict] = {}
    for key, spec in TABLE_OF.items():
        outcomes = [t for t in outcomes_of_run if TableId.parse(t.table).spec_name == spec.name]
        tables = {
            n: state for n, state in frontier.items() if TableId.parse(n).spec_name == spec.name
        }
        meta: dict = {
            "rows_written": sum(t.rows for t in outcomes),
            # From each commit's own result (the MERGE's metrics), not a second log read.
            "rows_added": sum(t.rows_added for t in outcomes),
            "rows_updated": sum(t.rows_updated for t in outcomes),
            "batch_start": batch_start,
            "batch_end": batch_end,
            "batches": sum(1 for r in results if r.ops),
            "ops_in_batch": sum(r.ops for r in results),
            "ops_new": new_ops,
            "ops_applied": new_ops - refused,
            "ops_dead_lettered": refused,
            "commit_attempts": sum(t.attempts for t in outcomes),
            "action": _action(outcomes),
        }
        if tables:
            txn = min(t for t, _ in tables.values())
            meta["txn_version"] = txn
            meta["lag_ops"], lag_seconds = lag(conn, tenant_id, txn)
            meta["lag_seconds"] = float(lag_seconds)
        meta.update(drain_lag)
        if spec is GOLD_CURATED:
            meta["curated_tables"] = len(tables)
            meta["table_versions"] = MetadataValue.json(
                {
                    TableId.parse(name).workarea_id: version
                    for name, (_, version) in sorted(tables.items())
                }
            )
        elif tables.get(spec.name, (None, None))[1] is not None:
            meta["table_version"] = tables[spec.name][1]
            meta["table_uri"] = MetadataValue.path(lake.table_uri(tenant_id, spec))
        found[key] = meta
    return found


def _action(outcomes: list[TableOutcome]) -> str:
    if not outcomes:
        return "nothing pending"
    actions = sorted({t.action for t in outcomes})
    return "+".join(actions)


def _summary(passes: list[DrainPass], results: list[BatchResult], metadata: dict) -> str:
    commits: Counter[str] = Counter()
    rows: Counter[str] = Counter()
    for t in (t for r in results for t in r.tables):
        commits[t.table] += t.action in COMMITS
        rows[t.table] += t.rows
    tables = ", ".join(f"{name} {commits[name]} commits {rows[name]} rows" for name in rows)
    run = next(iter(metadata.values()))  # the run's bounds and counts, the same for every table
    lag_ops = max((m.get("lag_ops", 0) for m in metadata.values()), default=0)
    return (
        f"tenant {results[0].tenant_id} run ({run['batch_start']}, {run['batch_end']}]: "
        f"{run['batches']} batches in {len(passes)} passes, "
        f"{sum(p.sequenced_here for p in passes)} ops sequenced, {run['ops_in_batch']} "
        f"ops; {tables or 'nothing pending'}; lag {lag_ops} ops"
    )


@multi_asset(
    name="lake_writer",
    specs=LAKE_SPECS,
    partitions_def=tenant_partitions,
    can_subset=False,
    description=(
        "The tenant's sequenced ops, folded into every lake table batch after batch; the run "
        "sequences the outbox itself and keeps draining until the tenant is idle or its time "
        "cap (OML_RUN_DRAIN_SECONDS) passes."
    ),
)
def lake_tables(
    context: AssetExecutionContext,
    postgres: PostgresResource,
    lake: LakeResource,
    writer: WriterResource,
) -> Iterator[MaterializeResult]:
    tenant_id = context.partition_key
    cap = writer.drain_seconds()
    retry = writer.retry_policy()
    with failing_clearly():
        store = with_retry(context, retry, lake.get_lake)
        # The core's loop, as `oml-lake drain --until-idle` runs it, for this tenant only, riding
        # through transient faults; the run queue's per-partition limit keeps it the tenant's only
        # writer meanwhile. Cap 0: one sequencing cut and one batch.
        passes = drain_riding_through(
            postgres.connect,
            store,
            [tenant_id],
            retry=retry,
            policy=DrainPolicy(until_idle=cap > 0, max_seconds=cap, config=writer.config()),
            observer=RunDrainObserver(context),
        )
        results = [b for p in passes for b in p.batches]

        def report() -> dict:
            with postgres.connect() as conn:
                return run_metadata(conn, store, results)

        metadata = with_retry(context, retry, report)
    context.log.info(_summary(passes, results, metadata))
    for key in TABLE_OF:
        yield MaterializeResult(asset_key=key, metadata=metadata[key])
