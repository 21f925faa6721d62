"""Freshness per tenant: the `fresh_within_bound` check on `bronze/events`, stored per tenant
partition, fails (severity ERROR) when the tenant's oldest outbox row not yet in every core table
is older than OML_FRESHNESS_BOUND_SECONDS (default 300 s). See
`docs/decisions/0023-freshness-per-tenant.md`.

`lake_freshness_sensor` judges every tenant each tick in one Postgres query and picks the tenants
whose check must be said: those newly past the bound or past it twice as far as last reported
(`oldest_waiting_at` gives the current lag in between), those back within it, those whose
bronze partition was materialized since the last tick (Dagster shows a check result as current
only until the asset partition's next materialization), and partitions never judged yet (a
page per tick). If any, it requests one `lake_freshness_job` run
for all of them, which measures again and logs one check evaluation per tenant partition. A
tenant no run drains (runs failing, the outbox sensor stopped) is flagged all the same. Ten
thousand quiet tenants cost one query a tick and no run; never a run per tenant. (Runless
evaluations from the sensor itself are not an option in this Dagster release: it stores them
under run id "" and refuses a second one for the same partition.)

The check also runs in lake-writer runs from the UI or a backfill (after the drain), judged the
same way; the outbox sensor's runs leave it out, the freshness sensor covers them.
"""

import datetime as dt
import json
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from dagster import (
    AssetCheckEvaluation,
    AssetCheckExecutionContext,
    AssetCheckKey,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    AssetRecordsFilter,
    Config,
    DagsterEventType,
    DagsterInstance,
    DefaultSensorStatus,
    MetadataValue,
    OpExecutionContext,
    PreviewWarning,
    RunConfig,
    RunRequest,
    RunsFilter,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    asset_check,
    in_process_executor,
    job,
    op,
    sensor,
)
from dagster._core.definitions.asset_checks.asset_check_evaluation import (
    AssetCheckEvaluationTargetMaterializationData,
)
from dagster._core.event_api import PartitionKeyFilter

from oml_dagster.lake.audit.freshness import TenantLag, tenant_lags
from oml_dagster.settings import FRESHNESS_BOUND_SECONDS, FRESHNESS_INTERVAL_SECONDS

from .assets import AREAS, BRONZE, LINEAGE, OUTBOX, SILVER
from .partitions import TENANT_PARTITIONS_NAME, tenant_partitions
from .resources import PostgresResource
from .sensors import IN_FLIGHT, writers_in_flight

# A check stored per tenant partition needs `partitions_def`, a preview in this Dagster release.
warnings.filterwarnings(
    "ignore", "Specifying a partitions_def on an AssetCheckSpec", category=PreviewWarning
)

CHECK_NAME = "fresh_within_bound"
FRESHNESS_CHECK = AssetCheckKey(BRONZE, CHECK_NAME)
# Partitions never judged yet, reported per tick at most: a run logs an evaluation in about
# 75 ms on this 2-core machine (bench/freshness_bench.py), so a page is a run of ~20 s and a
# fresh instance with 10,000 tenants has judged them all within 40 ticks.
NEW_PER_TICK = 250
# A tenant still past the bound is reported again once its lag has grown this many times over
# the lag last reported (its `oldest_waiting_at` says the current lag meanwhile): a stuck
# tenant's history gets a point per doubling, not one per tick for each of 1,000 tenants.
REPORT_GROWTH = 2.0


@dataclass(frozen=True)
class FreshnessSettings:
    """OML_FRESHNESS_BOUND_SECONDS (default 300): how old a tenant's oldest undrained outbox row
    may be; OML_FRESHNESS_INTERVAL_SECONDS (default 60): how often the sensor judges every
    tenant. A value that is not a positive number is refused when the code location loads."""

    bound_seconds: float = 300.0
    interval_seconds: int = 60

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "FreshnessSettings":
        return cls(
            bound_seconds=FRESHNESS_BOUND_SECONDS.read(env),
            interval_seconds=FRESHNESS_INTERVAL_SECONDS.read(env),
        )


def judge(
    lag: TenantLag | None, bound: float, in_flight: bool | None = None
) -> tuple[bool, str, dict]:
    """(passed, description, metadata) of the check for one tenant; `lag` None: nothing waits.
    `in_flight` (the sensor knows it, a run does not need to) says whether a lake-writer run of
    the tenant is queued or running."""
    seconds = lag.seconds if lag else 0.0
    passed = seconds <= bound
    metadata: dict = {
        "lag_seconds": float(seconds),
        "bound_seconds": float(bound),
        "ops_waiting": lag.ops_waiting if lag else 0,
        "ops_unsequenced": lag.ops_unsequenced if lag else 0,
    }
    if lag:
        metadata["drained_through"] = lag.drained_through
        metadata["oldest_waiting_at"] = MetadataValue.timestamp(lag.oldest_at)
        if lag.last_seq is not None:
            metadata["last_seq"] = lag.last_seq
    if in_flight is not None:
        metadata["lake_writer_run_in_flight"] = in_flight
    if not lag:
        return passed, "nothing waits: every outbox row is in every core table", metadata
    where = (
        f"{lag.ops_waiting} ops not yet in every core table (drained through seq "
        f"{lag.drained_through}), {lag.ops_unsequenced} not yet sequenced"
    )
    verdict = "past" if not passed else "within"
    description = f"lag {seconds:.0f} s, {verdict} the bound of {bound:.0f} s: {where}"
    if not passed and in_flight is False:
        description += "; no lake-writer run is queued or running for the tenant"
    return passed, description, metadata


# The lag plot: at most this many past points of each source, drawn in PLOT_COLUMNS columns.
HISTORY_POINTS = 60
PLOT_COLUMNS = 40
LEVELS = "▁▂▃▄▅▆▇█"
NO_POINT = "·"


def sparkline(points: Sequence[tuple[float, float]], columns: int = PLOT_COLUMNS) -> str:
    """`points` (unix time, lag seconds) as a one-line plot over time: the span from the first
    point to the last cut into `columns` equal slices, each drawn by the greatest lag in it, from
    ▁ (none) to █ (the greatest of all); a slice without a point is ·, so a stretch nobody
    measured shows as a gap rather than as a flat line."""
    if not points:
        return ""
    ordered = sorted(points)
    first, last = ordered[0][0], ordered[-1][0]
    span = last - first
    width = 1 if span <= 0 else columns
    slices: list[float | None] = [None] * width
    for at, lag in ordered:
        i = 0 if span <= 0 else min(width - 1, int((at - first) / span * width))
        held = slices[i]
        slices[i] = lag if held is None else max(lag, held)
    top = max(v for v in slices if v is not None)
    chars = []
    for value in slices:
        if value is None:
            chars.append(NO_POINT)
        else:
            level = 0 if top <= 0 else round(value / top * (len(LEVELS) - 1))
            chars.append(LEVELS[max(0, min(len(LEVELS) - 1, level))])
    return "".join(chars)


def lag_history(
    instance: DagsterInstance, tenant_id: str, lag_now: float, now: float | None = None
) -> list[tuple[float, float]]:
    """The tenant's lag over time as Dagster recorded it: `drain_lag_seconds` of its latest
    bronze materializations (each lake-writer report), `lag_seconds` of its latest freshness
    evaluations, and `lag_now` at `now`; (unix time, seconds), oldest first."""
    points = [(now if now is not None else time.time(), float(lag_now))]
    materialized = instance.fetch_materializations(
        AssetRecordsFilter(asset_key=BRONZE, asset_partitions=[tenant_id]), limit=HISTORY_POINTS
    ).records
    for record in materialized:
        materialization = record.asset_materialization
        value = materialization.metadata.get("drain_lag_seconds") if materialization else None
        if value is not None:
            points.append((record.timestamp, _seconds(value.value)))
    judged = instance.event_log_storage.get_asset_check_execution_history(
        FRESHNESS_CHECK, limit=HISTORY_POINTS, partition_filter=PartitionKeyFilter(key=tenant_id)
    )
    for execution in judged:
        event = execution.event
        data = event.dagster_event.event_specific_data if event and event.dagster_event else None
        # An execution still under way (this run's own) has only its planned event.
        value = data.metadata.get("lag_seconds") if isinstance(data, AssetCheckEvaluation) else None
        if event is not None and value is not None:
            points.append((event.timestamp, _seconds(value.value)))
    return sorted(points)


def _seconds(value: object) -> float:
    """A lag Dagster stored as metadata (a float this module wrote)."""
    return float(value) if isinstance(value, int | float) else 0.0


def lag_plot(points: Sequence[tuple[float, float]]) -> MetadataValue:
    """The tenant's lag plot as Markdown: the sparkline, its span and its greatest lag."""
    first, last = points[0][0], points[-1][0]

    def clock(at: float) -> str:
        return dt.datetime.fromtimestamp(at, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")

    top = max(lag for _, lag in points)
    return MetadataValue.md(
        f"`{sparkline(points)}`\n\n"
        f"{len(points)} points from {clock(first)} to {clock(last)} UTC (lake-writer reports "
        f"and freshness checks of this tenant); greatest lag {top:.0f} s, latest "
        f"{points[-1][1]:.0f} s. One column per {max(last - first, 0) / PLOT_COLUMNS:.0f} s: "
        f"▁ none … █ {top:.0f} s, {NO_POINT} no point."
    )


def build_freshness_check(freshness: FreshnessSettings) -> AssetChecksDefinition:
    """`fresh_within_bound`, judged against `freshness.bound_seconds`."""

    @asset_check(
        asset=BRONZE,
        name=CHECK_NAME,
        partitions_def=tenant_partitions,
        additional_deps=[OUTBOX, SILVER, LINEAGE, AREAS],
        description=(
            "The tenant's oldest outbox row not yet in every core table (bronze, silver, "
            "lineage, areas; unsequenced rows included) is at most OML_FRESHNESS_BOUND_SECONDS "
            f"old (here {freshness.bound_seconds:.0f} s). Judged every "
            "OML_FRESHNESS_INTERVAL_SECONDS by lake_freshness_sensor (one run per tick for all "
            "tenants to report, never one per tenant); fails with severity ERROR, naming the lag."
        ),
    )
    def fresh_within_bound(
        context: AssetCheckExecutionContext, postgres: PostgresResource
    ) -> AssetCheckResult:
        tenant_id = context.partition_key
        with postgres.connect() as conn:
            lag = tenant_lags(conn, [tenant_id]).get(tenant_id)
        passed, description, metadata = judge(lag, freshness.bound_seconds)
        metadata["lag_over_time"] = lag_plot(
            lag_history(context.instance, tenant_id, metadata["lag_seconds"])
        )
        return AssetCheckResult(
            passed=passed,
            severity=AssetCheckSeverity.ERROR,
            description=description,
            metadata=metadata,
        )

    return fresh_within_bound


# --- the sensor ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cursor:
    """What the last tick left: the event storage id up to which bronze materializations were
    seen, the page cursor of partitions already judged once, and the tenants past the bound with
    the lag last reported for each (they are reported again when it has grown REPORT_GROWTH
    times, and with a passing evaluation when they are back)."""

    through: int | None = None
    partitions: str | None = None
    failing: Mapping[str, float] = field(default_factory=dict)

    @classmethod
    def parse(cls, raw: str | None) -> "Cursor":
        if not raw:
            return cls()
        data = json.loads(raw)
        return cls(data.get("through"), data.get("partitions"), dict(data.get("failing", {})))

    def dumps(self) -> str:
        return json.dumps(
            {
                "through": self.through,
                "partitions": self.partitions,
                "failing": dict(sorted(self.failing.items())),
            }
        )


def _targets(
    instance: DagsterInstance, tenants: set[str]
) -> dict[str, AssetCheckEvaluationTargetMaterializationData]:
    """Each tenant's latest bronze materialization (two queries for all of them): the evaluation
    targets it, so the UI shows the status as current until the partition's next run."""
    if not tenants:
        return {}
    latest = instance.event_log_storage.get_latest_storage_id_by_partition(
        BRONZE, DagsterEventType.ASSET_MATERIALIZATION, partitions=tenants
    )
    if not latest:
        return {}
    records = instance.fetch_materializations(
        AssetRecordsFilter(asset_key=BRONZE, storage_ids=list(latest.values())), limit=len(latest)
    ).records
    return {
        r.partition_key: AssetCheckEvaluationTargetMaterializationData(
            storage_id=r.storage_id, run_id=r.run_id, timestamp=r.timestamp
        )
        for r in records
        if r.partition_key is not None
    }


class FreshnessRunConfig(Config):
    """The tenants a freshness run judges, and the bound it judges them by."""

    tenants: list[str]
    bound_seconds: float


@op(description="Judge the listed tenants' lake lag and report fresh_within_bound on each.")
def report_freshness(
    context: OpExecutionContext, config: FreshnessRunConfig, postgres: PostgresResource
) -> None:
    tenants = set(config.tenants)
    busy = writers_in_flight(context.instance, tenants)
    targets = _targets(context.instance, tenants)
    with postgres.connect() as conn:
        lags = tenant_lags(conn, sorted(tenants))
    failed = 0
    for tenant_id in sorted(tenants):
        passed, description, metadata = judge(
            lags.get(tenant_id), config.bound_seconds, tenant_id in busy
        )
        failed += not passed
        metadata["lag_over_time"] = lag_plot(
            lag_history(context.instance, tenant_id, metadata["lag_seconds"])
        )
        # Dagster logs a check evaluation of another step's check this way; log_event's
        # annotation leaves the type out.
        context.log_event(
            AssetCheckEvaluation(  # type: ignore[arg-type]
                asset_key=BRONZE,
                check_name=CHECK_NAME,
                passed=passed,
                severity=AssetCheckSeverity.ERROR,
                description=description,
                metadata=metadata,
                target_materialization_data=targets.get(tenant_id),
                partition=tenant_id,
            )
        )
    context.log.info(
        f"{len(tenants)} tenants judged against {config.bound_seconds:.0f} s: {failed} past it"
    )


@job(
    executor_def=in_process_executor,
    description=(
        "Reports bronze/events' fresh_within_bound check on each listed tenant partition, in "
        "one run for all of them (lake_freshness_sensor lists them). Reads Postgres only."
    ),
)
def lake_freshness_job():
    report_freshness()


def due_tenants(
    context: SensorEvaluationContext, postgres: PostgresResource, bound: float
) -> tuple[set[str], Cursor]:
    """The tenants to judge this tick, and the cursor for the next (see the module docstring)."""
    instance = context.instance
    storage = instance.event_log_storage
    cursor = Cursor.parse(context.cursor)
    partitions = set(instance.get_dynamic_partitions(TENANT_PARTITIONS_NAME))
    if cursor.through is None:  # first tick: every partition comes through the pages below
        materialized: Mapping[str, int] = {}
        through = storage.get_maximum_record_id() or 0
    else:
        materialized = storage.get_latest_storage_id_by_partition(
            BRONZE, DagsterEventType.ASSET_MATERIALIZATION, after_cursor=cursor.through
        )
        through = max([cursor.through, *materialized.values()])
    page = instance.get_paginated_dynamic_partitions(
        TENANT_PARTITIONS_NAME, limit=NEW_PER_TICK, ascending=True, cursor=cursor.partitions
    )
    with postgres.connect() as conn:
        lags = tenant_lags(conn)
    failing = {t: lag.seconds for t, lag in lags.items() if t in partitions and lag.seconds > bound}
    grown = {
        t
        for t, seconds in failing.items()
        if t not in cursor.failing or seconds >= REPORT_GROWTH * cursor.failing[t]
    }
    recovered = (set(cursor.failing) - set(failing)) & partitions
    due = (grown | recovered | set(materialized) | set(page.results)) & partitions
    # The lag last reported: this tick's for the tenants it reports, the earlier one otherwise.
    reported = {t: failing[t] if t in due else cursor.failing[t] for t in failing}
    context.log.info(
        f"{len(lags)} tenants lag, {len(failing)} past the {bound:.0f} s bound "
        f"({len(grown)} newly or twice as far), {len(recovered)} back within it; "
        f"{len(due)} to judge"
    )
    return due, Cursor(through, page.cursor, reported)


def freshness_in_flight(instance: DagsterInstance) -> bool:
    return bool(
        instance.get_run_ids(RunsFilter(job_name="lake_freshness_job", statuses=IN_FLIGHT), limit=1)
    )


def build_freshness_sensor(freshness: FreshnessSettings, autostart: bool) -> SensorDefinition:
    @sensor(
        name="lake_freshness_sensor",
        job=lake_freshness_job,
        minimum_interval_seconds=freshness.interval_seconds,
        default_status=DefaultSensorStatus.RUNNING if autostart else DefaultSensorStatus.STOPPED,
        description=(
            "Judges every tenant's lake lag against OML_FRESHNESS_BOUND_SECONDS and requests "
            "one lake_freshness_job run per tick for the tenants whose check must be reported."
        ),
    )
    def lake_freshness_sensor(
        context: SensorEvaluationContext, postgres: PostgresResource
    ) -> SensorResult:
        if freshness_in_flight(context.instance):  # one at a time; the cursor stays as it is
            # (said explicitly: a result without a cursor makes the daemon store none)
            return SensorResult(
                skip_reason="a lake_freshness_job run is still in flight", cursor=context.cursor
            )
        due, cursor = due_tenants(context, postgres, freshness.bound_seconds)
        if not due:
            return SensorResult(skip_reason="no tenant changed freshness", cursor=cursor.dumps())
        config = FreshnessRunConfig(tenants=sorted(due), bound_seconds=freshness.bound_seconds)
        request = RunRequest(
            run_config=RunConfig(ops={"report_freshness": config}),
            tags={"oml/tenants": str(len(due))},
        )
        return SensorResult(run_requests=[request], cursor=cursor.dumps())

    return lake_freshness_sensor
