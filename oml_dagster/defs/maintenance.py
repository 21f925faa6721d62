"""Maintenance jobs and their schedules: a thin layer over `oml_dagster.lake.store.maintenance`.

Every job is partitioned by tenant (`tenant_partitions`), so each run carries the
`dagster/partition` tag that the run queue's per-tenant limit keys on: maintenance of a tenant
never runs next to that tenant's lake-writer run. Each schedule requests one run per tenant
partition. Cron, timezone and autostart come from `DeploymentSettings` (the environment, through
`oml_dagster.settings`): OML_COMPACT_CRON
(bin-pack OPTIMIZE, daily), OML_ZORDER_CRON (Z-order OPTIMIZE, weekly on Sunday),
OML_VACUUM_CRON (checkpoint, VACUUM and log cleanup, daily), OML_SCHEDULE_TIMEZONE (as every
other schedule of the code location) and OML_DAGSTER_AUTOSTART (on by default, so a fresh
deployment vacuums within the erasure bound without being told to).
"""

import datetime as dt
import functools

from dagster import (
    Config,
    In,
    JobDefinition,
    MetadataValue,
    Nothing,
    OpExecutionContext,
    RunRequest,
    ScheduleDefinition,
    ScheduleEvaluationContext,
    SkipReason,
    in_process_executor,
    job,
    op,
)

from oml_dagster.lake.store import maintenance
from oml_dagster.lake.store.maintenance import MaintenanceResult

from .partitions import TENANT_PARTITIONS_NAME, tenant_partitions
from .resources import DeploymentSettings, LakeResource, PostgresResource


class OptimizeConfig(Config):
    """Target file size of OPTIMIZE in bytes; unset: the table's `delta.targetFileSize`, else
    delta-rs's default."""

    target_size: int | None = None


def _report(context: OpExecutionContext, operation: str, results: list[MaintenanceResult]) -> None:
    """Log one line per table and attach the run's numbers to the op's output."""
    for result in results:
        context.log.info(f"tenant {result.tenant_id} {result.describe()}")
    sums = maintenance.totals(results)
    rows = [
        "| table | step | action | files before | files after | removed | bytes removed "
        "| version | seconds |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        rows.append(
            f"| {r.table} | {r.operation} | {r.action} | {r.files_before} | {r.files_after} "
            f"| {r.files_removed} | {r.bytes_removed} | {r.version_before} → {r.version_after} "
            f"| {r.duration_seconds:.2f} |"
        )
    metadata: dict = {
        "operation": operation,
        "tables": sums["tables"],
        "changed": sums["changed"],
        "files_before": sums["files_before"],
        "files_after": sums["files_after"],
        "files_removed": sums["files_removed"],
        "files_added": sums["files_added"],
        "bytes_removed": sums["bytes_removed"],
        "log_files_removed": sums["log_files_removed"],
        "commits": sums["commits"],
        "duration_seconds": MetadataValue.float(float(sums["duration_seconds"])),
        "versions": MetadataValue.json(
            {f"{r.table} {r.operation}": [r.version_before, r.version_after] for r in results}
        ),
        "tables_detail": MetadataValue.md("\n".join(rows)),
    }
    context.add_output_metadata(metadata)


def _run(
    context: OpExecutionContext,
    postgres: PostgresResource,
    lake: LakeResource,
    operation: maintenance.Operation,
    target_size: int | None = None,
) -> None:
    tenant_id = context.partition_key
    with postgres.connect() as conn:
        results = maintenance.run_operation(
            conn, lake.get_lake(), tenant_id, operation=operation, target_size=target_size
        )
    _report(context, operation, results)


def _optimize_op(name: str, operation: maintenance.Operation, description: str):
    """An OPTIMIZE step of one tenant's tables, its target file size from the run config."""

    @op(name=name, description=description)
    def optimize(
        context: OpExecutionContext,
        config: OptimizeConfig,
        postgres: PostgresResource,
        lake: LakeResource,
    ) -> None:
        _run(context, postgres, lake, operation, config.target_size)

    return optimize


def _step_op(name: str, operation: maintenance.Operation, description: str, *, after: bool):
    """A maintenance step of one tenant's tables; `after`: it waits for the step before it."""

    @op(name=name, description=description, ins={"after": In(Nothing)} if after else None)
    def step(context: OpExecutionContext, postgres: PostgresResource, lake: LakeResource) -> None:
        _run(context, postgres, lake, operation)

    return step


compact_tables = _optimize_op(
    "compact_tables",
    maintenance.COMPACT,
    "Bin-pack OPTIMIZE of every table of the tenant (bronze per day partition).",
)
zorder_tables = _optimize_op(
    "zorder_tables",
    maintenance.ZORDER,
    "Z-order OPTIMIZE: silver and curated on (workarea_id, artifact_id), lineage on src_id.",
)
checkpoint_tables = _step_op(
    "checkpoint_tables",
    maintenance.CHECKPOINT,
    "Checkpoint tables 100+ versions behind, or with expired commits after the last.",
    after=False,
)
vacuum_tables = _step_op(
    "vacuum_tables",
    maintenance.VACUUM,
    "Retention properties = the tenant's erasure bound; full-listing VACUUM.",
    after=True,
)
cleanup_logs = _step_op(
    "cleanup_logs",
    maintenance.LOG_CLEANUP,
    "Expire log entries and checkpoints older than the bound; verify the table reads.",
    after=True,
)

# Every maintenance job: one run per tenant partition, its steps in the run's own process.
_tenant_job = functools.partial(
    job, partitions_def=tenant_partitions, executor_def=in_process_executor
)


@_tenant_job(description="Daily bin-pack OPTIMIZE of one tenant's tables.")
def compact_job():
    compact_tables()


@_tenant_job(
    description="Weekly Z-order OPTIMIZE of one tenant's silver, curated and lineage tables."
)
def zorder_job():
    zorder_tables()


@_tenant_job(
    description="Daily checkpoint, VACUUM and log cleanup of one tenant's tables, with retention "
    "= the tenant's lake erasure bound."
)
def vacuum_job():
    cleanup_logs(after=vacuum_tables(after=checkpoint_tables()))


def _per_tenant(job_def: JobDefinition):
    def evaluate(context: ScheduleEvaluationContext):
        tenants = context.instance.get_dynamic_partitions(TENANT_PARTITIONS_NAME)
        if not tenants:
            yield SkipReason("no tenant partitions yet")
            return
        tick = (context.scheduled_execution_time or dt.datetime.now(dt.UTC)).isoformat()
        for t in tenants:
            yield RunRequest(run_key=f"{job_def.name}:{t}:{tick}", partition_key=t)

    return evaluate


def build_schedules(settings: DeploymentSettings) -> list[ScheduleDefinition]:
    plan = (
        ("nightly_compact_schedule", compact_job, settings.compact_cron),
        ("weekly_zorder_schedule", zorder_job, settings.zorder_cron),
        ("nightly_vacuum_schedule", vacuum_job, settings.vacuum_cron),
    )
    return [
        ScheduleDefinition(
            name=name,
            job=job_def,
            cron_schedule=cron,
            execution_timezone=settings.schedule_timezone,
            execution_fn=_per_tenant(job_def),
            default_status=settings.schedule_status,
            description=f"One {job_def.name} run per tenant partition.",
        )
        for name, job_def, cron in plan
    ]


MAINTENANCE_JOBS: list[JobDefinition] = [compact_job, zorder_job, vacuum_job]
