"""A tenant's departure in Dagster (ADR 0075, 0076, 0077): a thin layer over
`oml_dagster.lake.audit.export` and `.purge`.

- `tenant_export_job`: one run per tenant partition exports its live tables to the `to` of the
  run config (a local path or an `s3://` prefix), as `oml-lake tenant export --tenant T --to URI`.
- `tenant_purge_job`: one run per tenant partition purges the departed tenant, as `oml-lake tenant
  purge --tenant T`, then deletes what the instance keeps of it: its runs (each one's record,
  tags and event log; the purge run itself stays, beside the receipt), its asset partitions and
  its dynamic partition. Being a tenant partition's run, it waits for the tenant's lake-writer run
  in the run queue (the per-tenant limit), never writes beside it.
- `departure_sensor`: starts `tenant_purge_job` for each departed tenant whose grace period is
  over (OML_PURGE_GRACE_SECONDS, at most half its erasure bound), and deletes the partitions of
  tenants purged from the command line.
"""

import contextlib
import datetime as dt

from dagster import (
    AssetKey,
    Config,
    DagsterInstance,
    MetadataValue,
    OpExecutionContext,
    RunRequest,
    RunsFilter,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    in_process_executor,
    job,
    op,
    sensor,
)

from oml_dagster import from_settings
from oml_dagster.lake.audit import export, purge

from .jobs import ERASURE_EVIDENCE, LAKE_ASSET_KEYS
from .partitions import TENANT_PARTITIONS_NAME, tenant_partitions
from .resources import DeploymentSettings, LakeResource, PostgresResource
from .shards import PARTITION_TAG


class ExportConfig(Config):
    """Where the export goes: an empty local path or `s3://` prefix outside the lake."""

    to: str


class PurgeConfig(Config):
    """Who asked for the purge (recorded in the receipt)."""

    by: str = "dagster"


@op(description="Export the tenant's live tables and a manifest to the configured target.")
def export_tenant(
    context: OpExecutionContext,
    config: ExportConfig,
    postgres: PostgresResource,
    lake: LakeResource,
) -> None:
    tenant_id = context.partition_key
    with postgres.connect() as conn:
        result = export.export_tenant(
            conn, lake.get_lake(), tenant_id, from_settings.export_target(config.to)
        )
    manifest = result.manifest
    context.add_output_metadata(
        {
            "to": config.to,
            "resumed": result.resumed,
            "journal_head": MetadataValue.json(manifest["journal_head"]),
            "rows": MetadataValue.json({t["name"]: t["rows"] for t in manifest["tables"]}),
        }
    )


def forget_tenant(instance: DagsterInstance, tenant_id: str) -> int:
    """Delete what the instance keeps of a purged tenant: every run of its partition but its
    purge runs, kept as the Dagster side of the receipt (record, tags, event log), its asset
    partitions' materializations and its dynamic partition. Returns the runs deleted."""
    records = instance.get_run_records(RunsFilter(tags={PARTITION_TAG: tenant_id}))
    doomed = [
        r.dagster_run.run_id for r in records if r.dagster_run.job_name != tenant_purge_job.name
    ]
    for run_id in doomed:
        instance.delete_run(run_id)
    deleted = len(doomed)
    keys: list[AssetKey] = [*LAKE_ASSET_KEYS, ERASURE_EVIDENCE]
    for key in keys:
        # The materializations went with the runs' event logs; this also drops the asset index
        # where the event log storage can (the SQLite one of a test instance cannot).
        with contextlib.suppress(NotImplementedError):
            instance.wipe_asset_partitions(key, [tenant_id])
    if instance.has_dynamic_partition(TENANT_PARTITIONS_NAME, tenant_id):
        instance.delete_dynamic_partition(TENANT_PARTITIONS_NAME, tenant_id)
    return deleted


@op(description="Purge the departed tenant's prefix and records; forget its partition and runs.")
def purge_tenant(
    context: OpExecutionContext,
    config: PurgeConfig,
    postgres: PostgresResource,
    lake: LakeResource,
) -> None:
    tenant_id = context.partition_key
    by = f"{config.by} (dagster run {context.run_id})"
    with postgres.connect() as conn:
        made = purge.purge_tenant(conn, lake.get_lake(), tenant_id, by=by)
    runs = forget_tenant(context.instance, tenant_id)
    context.log.info(
        f"tenant {tenant_id} purged: {made['objects']} objects ({made['bytes']} bytes), "
        f"{runs} runs of its partition deleted, its partition deleted"
    )
    context.add_output_metadata({"receipt": MetadataValue.json(made), "runs_deleted": runs})


@job(
    partitions_def=tenant_partitions,
    executor_def=in_process_executor,
    description="Export one tenant's live tables as fresh Delta tables with a manifest.",
)
def tenant_export_job():
    export_tenant()


@job(
    partitions_def=tenant_partitions,
    executor_def=in_process_executor,
    description="Purge one departed tenant: its prefix, the writer's rows, its partition.",
)
def tenant_purge_job():
    purge_tenant()


def build_departure_sensor(settings: DeploymentSettings) -> SensorDefinition:
    grace = dt.timedelta(seconds=settings.purge_grace_seconds)

    @sensor(
        name="departure_sensor",
        job=tenant_purge_job,
        minimum_interval_seconds=max(settings.sensor_interval_seconds, 60),
        default_status=settings.sensor_status,
        description="Purge each departed tenant once its grace period is over.",
    )
    def departure_sensor(context: SensorEvaluationContext, postgres: PostgresResource):
        with postgres.connect() as conn:
            due = purge.due_for_purge(conn, grace)
            purged = [d.tenant_id for d in purge.departures(conn) if d.purge_state == purge.PURGED]
        present = set(context.instance.get_dynamic_partitions(TENANT_PARTITIONS_NAME))
        for tenant_id in purged:
            if tenant_id in present:
                forget_tenant(context.instance, tenant_id)
        # One request per tenant and hour: a purge that failed (an undrained gap, a store
        # away) is asked again an hour later, never twice within one.
        hour = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H")
        requests = [
            RunRequest(
                run_key=f"purge:{tenant_id}:{hour}",
                partition_key=tenant_id,
                run_config={"ops": {"purge_tenant": {"config": {"by": "departure_sensor"}}}},
            )
            for tenant_id in due
            if tenant_id in present
        ]
        return SensorResult(run_requests=requests)

    return departure_sensor


DEPARTURE_JOBS = [tenant_export_job, tenant_purge_job]
