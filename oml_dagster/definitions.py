"""The `oml_lake` code location: assembles the definitions of `oml_dagster.defs`, nothing else."""

from dagster import Definitions

from oml_dagster.defs.analytics import (
    ANALYTICS_ASSETS,
    ANALYTICS_CHECKS,
    daily_analytics_schedule,
    lake_analytics_job,
)
from oml_dagster.defs.assets import lake_tables, outbox
from oml_dagster.defs.checks import LAKE_CHECKS, erasure_evidence_asset, reconcile_schedule
from oml_dagster.defs.freshness import (
    fresh_within_bound,
    lake_freshness_job,
    lake_freshness_sensor,
)
from oml_dagster.defs.jobs import lake_writer_job
from oml_dagster.defs.maintenance import MAINTENANCE_JOBS, MAINTENANCE_SCHEDULES
from oml_dagster.defs.resources import build_resources
from oml_dagster.defs.sensors import outbox_sensor
from oml_dagster.defs.shards import lake_writer_shard_job

defs = Definitions(
    assets=[outbox, lake_tables, erasure_evidence_asset, *ANALYTICS_ASSETS],
    asset_checks=[*LAKE_CHECKS, fresh_within_bound, *ANALYTICS_CHECKS],
    jobs=[
        lake_writer_job,
        lake_writer_shard_job,
        *MAINTENANCE_JOBS,
        lake_analytics_job,
        lake_freshness_job,
    ],
    sensors=[outbox_sensor, lake_freshness_sensor],
    schedules=[reconcile_schedule, *MAINTENANCE_SCHEDULES, daily_analytics_schedule],
    resources=build_resources(),
)
