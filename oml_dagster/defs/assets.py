"""The lake as tenant-partitioned assets (DESIGN §4): the Postgres outbox upstream, and the five
lake tables that one lake-writer run brings forward together.

The core folds one batch of a tenant's ops into every table at once (a `TenantBatch`), so the five
tables are one multi-asset. A run keeps sequencing and draining its tenant, batch after batch,
through the core's drain loop until the tenant is idle or the run's time cap passes (ADR 0021),
and reports each table's commits over the whole run as that asset's materialization. The
dependencies are the data's lineage as an operator reads it (outbox → bronze/silver → gold), not
an execution order: the core owns the commit order.
"""

from collections import Counter
from collections.abc import Iterator
from typing import Any

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

from oml_dagster.lake.audit.run_report import RunReport, run_report
from oml_dagster.lake.model.tables import (
    BRONZE_EVENTS,
    GOLD_AREAS,
    GOLD_CURATED,
    GOLD_LINEAGE,
    SILVER_CLAIMS,
    TableSpec,
)
from oml_dagster.lake.store.layout import Lake
from oml_dagster.lake.write.counters import WriterCounters
from oml_dagster.lake.write.drain import DrainPass, DrainPolicy, drain_riding_through
from oml_dagster.lake.write.writer import COMMITS, BatchResult

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


def run_metadata(report: RunReport, lake: Lake) -> dict[AssetKey, dict[str, Any]]:
    """The core's report of one run (`run_report`) as each lake asset's materialization
    metadata: the run's numbers on every table, each kind of table's own beside them."""
    shared = {
        **report.run_numbers(),
        "drain_lag_seconds": report.drain_lag_seconds,
        "drain_lag_ops": report.drain_lag_ops,
    }
    return {key: _table_metadata(report, spec, shared, lake) for key, spec in TABLE_OF.items()}


def _table_metadata(
    report: RunReport, spec: TableSpec, shared: dict[str, Any], lake: Lake
) -> dict[str, Any]:
    table = report.tables[spec.name]
    meta: dict[str, Any] = {
        "rows_written": table.rows_written,
        # From each commit's own result (the MERGE's metrics), not a second log read.
        "rows_added": table.rows_added,
        "rows_updated": table.rows_updated,
        "commit_attempts": table.commit_attempts,
        "action": table.action,
        **shared,
    }
    if table.txn_version is not None:
        meta.update(
            txn_version=table.txn_version,
            lag_ops=table.lag_ops,
            lag_seconds=float(table.lag_seconds or 0.0),
        )
    if spec is GOLD_CURATED:
        meta["curated_tables"] = len(table.versions)
        meta["table_versions"] = MetadataValue.json(
            {str(workarea): version for workarea, version in table.versions.items()}
        )
    elif table.versions.get(None) is not None:
        meta["table_version"] = table.versions[None]
        meta["table_uri"] = MetadataValue.path(lake.table_uri(report.tenant_id, spec))
    return meta


def _summary(passes: list[DrainPass], results: list[BatchResult], metadata: dict) -> str:
    commits: Counter[str] = Counter()
    rows: Counter[str] = Counter()
    for t in (t for r in results for t in r.tables):
        commits[t.name] += t.action in COMMITS
        rows[t.name] += t.rows
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
    settings = writer.settings
    cap, retry = settings.run_drain_seconds, settings.retry
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
            policy=DrainPolicy(until_idle=cap > 0, max_seconds=cap, config=settings.config),
            observer=RunDrainObserver(context),
            counters=WriterCounters(postgres.connect),
        )
        results = [b for p in passes for b in p.batches]

        def report() -> RunReport:
            with postgres.connect() as conn:
                return run_report(conn, results)

        metadata = run_metadata(with_retry(context, retry, report), store)
    context.log.info(_summary(passes, results, metadata))
    for key in TABLE_OF:
        yield MaterializeResult(asset_key=key, metadata=metadata[key])
