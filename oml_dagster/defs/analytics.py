"""Lake analytics as tenant-partitioned assets downstream of the lake tables: event volume
(bronze), lake lag per table (commit metadata against outbox time), claims by state, workarea and
provenance (silver joined to gold.areas), and lineage statistics (gold.lineage). Each reports a
small table in its metadata and numbers the UI plots over time.

They read through DuckDB's Delta extension (`oml_dagster.lake.analytics.sandbox`), so each asset also has
a check, `second_reader_agrees`, that the tables it read count the same rows as their Delta logs
say: every analytics run is a read check by a second implementation.

They have their own job and a daily schedule, one run per tenant partition (under the same
per-tenant run limit as the writer; reading is harmless there), and are never part of the outbox
sensor's lake-writer runs (`docs/decisions/0019-analytics-assets.md`).
"""

import datetime as dt
import functools
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

import dagster as dg

from oml_dagster.lake.analytics import lag, reports, sandbox, second_reader
from oml_dagster.lake.model.tables import DEMOTED, ERASED, HELD, PROMOTED, TableId
from oml_dagster.lake.store.layout import Lake

from .assets import AREAS, BRONZE, CURATED, LINEAGE, OUTBOX, SILVER, TABLE_OF
from .partitions import TENANT_PARTITIONS_NAME, tenant_partitions
from .resources import DeploymentSettings, LakeResource, PostgresResource

warnings.filterwarnings(
    "ignore", "Specifying a partitions_def on an AssetCheckSpec", category=dg.PreviewWarning
)

EVENT_VOLUME = dg.AssetKey(["analytics", "event_volume"])
LAKE_LAG = dg.AssetKey(["analytics", "lake_lag"])
CLAIMS_BY_STATE = dg.AssetKey(["analytics", "claims_by_state"])
LINEAGE_STATS = dg.AssetKey(["analytics", "lineage_stats"])

# The lake tables each analytics asset reads (what its second-reader check counts).
READS: dict[dg.AssetKey, list[dg.AssetKey]] = {
    EVENT_VOLUME: [BRONZE],
    LAKE_LAG: [BRONZE, SILVER, LINEAGE, AREAS, CURATED],
    CLAIMS_BY_STATE: [SILVER, AREAS],
    LINEAGE_STATS: [LINEAGE, SILVER],
}
ANALYTICS_KEYS: list[dg.AssetKey] = list(READS)
ROWS_SHOWN = 50


def md_table(rows: list[dict[str, Any]], limit: int = ROWS_SHOWN) -> dg.MetadataValue:
    """A Markdown table of `rows` (the first `limit`, saying how many were left out)."""
    if not rows:
        return dg.MetadataValue.md("_no rows_")
    columns = list(rows[0])

    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.3f}"
        return "" if value is None else str(value).replace("|", "\\|")

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r[c]) for c in columns) + " |" for r in rows[:limit]]
    if len(rows) > limit:
        lines.append(f"\n_{len(rows) - limit} more rows not shown_")
    return dg.MetadataValue.md("\n".join(lines))


def _jsonable(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    def value(v: Any) -> Any:
        return v.isoformat() if isinstance(v, dt.date | dt.datetime) else v

    return [{k: value(v) for k, v in r.items()} for r in rows]


def _partition_tenant(context: dg.AssetExecutionContext | dg.AssetCheckExecutionContext) -> str:
    return context.partition_key


# --- the assets ----------------------------------------------------------------------------------


# Every analytics asset: in the `analytics` group, one partition per tenant, computed by DuckDB.
_analytics_asset = functools.partial(
    dg.asset, group_name="analytics", partitions_def=tenant_partitions, kinds={"duckdb"}
)


@_analytics_asset(
    key=EVENT_VOLUME,
    deps=[BRONZE],
    description="Bronze events per day, event_type and provenance.",
)
def event_volume(context: dg.AssetExecutionContext, lake: LakeResource) -> dg.MaterializeResult:
    with sandbox.tenant_connection(lake.get_lake(), _partition_tenant(context)) as tc:
        rows = reports.event_volume(tc)
    today = dt.datetime.now(dt.UTC).date()
    by_type: dict[str, int] = {}
    by_provenance: dict[str, int] = {}
    for r in rows:
        by_type[r["event_type"]] = by_type.get(r["event_type"], 0) + r["events"]
        by_provenance[r["provenance"]] = by_provenance.get(r["provenance"], 0) + r["events"]
    return dg.MaterializeResult(
        metadata={
            "events": sum(r["events"] for r in rows),
            "events_today": sum(r["events"] for r in rows if r["event_date"] == today),
            "days": len({r["event_date"] for r in rows}),
            "volume": md_table(rows),
            "by_event_type": dg.MetadataValue.json(by_type),
            "by_provenance": dg.MetadataValue.json(by_provenance),
        }
    )


@_analytics_asset(
    key=LAKE_LAG,
    deps=[OUTBOX, BRONZE, SILVER, LINEAGE, AREAS, CURATED],
    description=(
        "Per table, how long each writer commit's oldest op waited in the outbox "
        "(commit time minus oml.outbox.created_at), over the commits the Delta log holds."
    ),
)
def lake_lag(
    context: dg.AssetExecutionContext, postgres: PostgresResource, lake: LakeResource
) -> dg.MaterializeResult:
    tenant_id = _partition_tenant(context)
    store = lake.get_lake()
    with sandbox.tenant_connection(store, tenant_id) as tc:
        tables = [(v.table, v.uri) for v in tc.views.values() if v.uri is not None]
    with postgres.connect() as conn:
        commits = lag.lake_lag(conn, store, tenant_id, tables)
    summary = lag.lag_summary(commits)
    recent = sorted(commits, key=lambda c: c.committed_at)[-ROWS_SHOWN:]
    metadata: dict[str, Any] = {
        "writer_commits": len(commits),
        "lag": md_table(summary),
        "recent_commits": dg.MetadataValue.json(
            _jsonable(
                {
                    "table": c.table,
                    "version": c.version,
                    "committed_at": c.committed_at,
                    "batch_end": c.batch_end,
                    "lag_seconds": c.lag_seconds,
                }
                for c in recent
            )
        ),
    }
    lags = [r["latest_lag_seconds"] for r in summary if r["latest_lag_seconds"] is not None]
    if lags:
        metadata["latest_lag_seconds_max"] = float(max(lags))
    for r in summary:
        if r["latest_lag_seconds"] is not None and "/" not in r["table"]:
            metadata[f"latest_lag_seconds/{r['table']}"] = float(r["latest_lag_seconds"])
    return dg.MaterializeResult(metadata=metadata)


@_analytics_asset(
    key=CLAIMS_BY_STATE,
    deps=[SILVER, AREAS],
    description="Silver claims by state, workarea (path and status from gold.areas) and provenance.",
)
def claims_by_state(context: dg.AssetExecutionContext, lake: LakeResource) -> dg.MaterializeResult:
    with sandbox.tenant_connection(lake.get_lake(), _partition_tenant(context)) as tc:
        rows = reports.claims_by_state(tc)
    states: dict[str, int] = {}
    for r in rows:
        states[r["state"]] = states.get(r["state"], 0) + r["claims"]
    metadata: dict[str, Any] = {
        "claims": sum(states.values()),
        "workareas_with_claims": len({r["workarea_id"] for r in rows}),
        "claims_by_state": md_table(rows),
        "states": dg.MetadataValue.json(states),
    }
    for state in (PROMOTED, HELD, DEMOTED, ERASED):
        metadata[f"claims_{state}"] = states.get(state, 0)
    return dg.MaterializeResult(metadata=metadata)


@_analytics_asset(
    key=LINEAGE_STATS,
    deps=[LINEAGE, SILVER],
    description=(
        "Lineage edges by graph, label and state; the longest derivation chains; and per "
        "simulation its taint closure in silver and the edges it marks."
    ),
)
def lineage_stats(context: dg.AssetExecutionContext, lake: LakeResource) -> dg.MaterializeResult:
    with sandbox.tenant_connection(lake.get_lake(), _partition_tenant(context)) as tc:
        stats = reports.lineage_stats(tc)
    return dg.MaterializeResult(
        metadata={
            "edges": sum(r["edges"] for r in stats.edges),
            "edges_ratified": sum(r["edges"] for r in stats.edges if r["state"] == "ratified"),
            "longest_derivation_chain": stats.longest_chain,
            "simulations": len(stats.tainted),
            "largest_taint_closure": max((r["closure_rows"] for r in stats.tainted), default=0),
            "edges_by_label": md_table(stats.edges),
            "longest_chains": md_table(stats.chains),
            "taint_closures": md_table(stats.tainted),
        }
    )


ANALYTICS_ASSETS = [event_volume, lake_lag, claims_by_state, lineage_stats]


# --- the second reader's checks ------------------------------------------------------------------


def read_check_result(lake: Lake, tenant_id: str, reads: list[dg.AssetKey]) -> dg.AssetCheckResult:
    tables = [TableId(TABLE_OF[k].name) for k in reads]
    with sandbox.tenant_connection(lake, tenant_id) as tc:
        checks = second_reader.second_reader_check(lake, tc, tables)
    failing = [c for c in checks if not c.agrees]
    return dg.AssetCheckResult(
        passed=not failing,
        metadata={
            "tables_read": len(checks),
            "tables_disagreeing": len(failing),
            "rows_read": sum(c.duckdb_rows or 0 for c in checks),
            "counts": md_table(
                [
                    {
                        "table": c.table,
                        "version": c.version,
                        "duckdb_rows": c.duckdb_rows,
                        "delta_log_rows": c.log_rows,
                        "error": c.error,
                    }
                    for c in checks
                ]
            ),
        },
    )


def _read_check(key: dg.AssetKey) -> dg.AssetChecksDefinition:
    reads = READS[key]

    @dg.asset_check(
        asset=key,
        name="second_reader_agrees",
        partitions_def=tenant_partitions,
        additional_deps=reads,
        description=(
            "DuckDB (delta-kernel) counts the same rows in each table this asset reads as the "
            "table's Delta log records (delta-rs): the lake reads the same in a second "
            "implementation."
        ),
    )
    def check(context: dg.AssetCheckExecutionContext, lake: LakeResource) -> dg.AssetCheckResult:
        return read_check_result(lake.get_lake(), _partition_tenant(context), reads)

    return check


ANALYTICS_CHECKS: list[dg.AssetChecksDefinition] = [_read_check(k) for k in ANALYTICS_KEYS]


# --- job and schedule ----------------------------------------------------------------------------

lake_analytics_job = dg.define_asset_job(
    name="lake_analytics_job",
    selection=dg.AssetSelection.assets(*ANALYTICS_KEYS),
    executor_def=dg.in_process_executor,
    description="Answer the tenant's volume, lag, claims and lineage questions from its lake.",
)


def analytics_requests(
    context: dg.ScheduleEvaluationContext,
) -> Iterator[dg.SkipReason | dg.RunRequest]:
    tenants = context.instance.get_dynamic_partitions(TENANT_PARTITIONS_NAME)
    if not tenants:
        yield dg.SkipReason("no tenant partitions yet")
        return
    tick = context.scheduled_execution_time.isoformat()
    for t in tenants:
        yield dg.RunRequest(run_key=f"analytics:{t}:{tick}", partition_key=t)


def build_analytics_schedule(settings: DeploymentSettings) -> dg.ScheduleDefinition:
    return dg.ScheduleDefinition(
        name="daily_analytics_schedule",
        job=lake_analytics_job,
        cron_schedule=settings.analytics_cron,
        execution_timezone=settings.schedule_timezone,
        execution_fn=analytics_requests,
        default_status=settings.schedule_status,
        description="One lake_analytics_job run per tenant partition.",
    )
