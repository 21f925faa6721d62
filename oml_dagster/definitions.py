"""The `oml_lake` code location: assembles the definitions of `oml_dagster.defs`, nothing else.
The automation settings are read here, once, when the code location loads; the resources take
theirs when Dagster builds them for a run or a tick."""

from dagster import Definitions

from oml_dagster.defs.analytics import (
    ANALYTICS_ASSETS,
    ANALYTICS_CHECKS,
    build_analytics_schedule,
    lake_analytics_job,
)
from oml_dagster.defs.assets import lake_tables, outbox
from oml_dagster.defs.checks import LAKE_CHECKS, build_reconcile_schedule, erasure_evidence_asset
from oml_dagster.defs.departure import DEPARTURE_JOBS, build_departure_sensor
from oml_dagster.defs.freshness import (
    FreshnessSettings,
    build_freshness_check,
    build_freshness_sensor,
    lake_freshness_job,
)
from oml_dagster.defs.jobs import lake_writer_job
from oml_dagster.defs.maintenance import MAINTENANCE_JOBS, build_schedules
from oml_dagster.defs.resources import DeploymentSettings, build_resources
from oml_dagster.defs.sensors import build_outbox_sensor
from oml_dagster.defs.shards import lake_writer_shard_job
from oml_dagster.settings import Env


def build_definitions(env: Env | None = None) -> Definitions:
    """The code location with its automation as `env` (default: the process environment)
    sets it."""
    deployment = DeploymentSettings.from_env(env)
    freshness = FreshnessSettings.from_env(env)
    return Definitions(
        assets=[outbox, lake_tables, erasure_evidence_asset, *ANALYTICS_ASSETS],
        asset_checks=[*LAKE_CHECKS, build_freshness_check(freshness), *ANALYTICS_CHECKS],
        jobs=[
            lake_writer_job,
            lake_writer_shard_job,
            *MAINTENANCE_JOBS,
            lake_analytics_job,
            lake_freshness_job,
            *DEPARTURE_JOBS,
        ],
        sensors=[
            build_outbox_sensor(deployment),
            build_freshness_sensor(freshness, deployment.autostart),
            build_departure_sensor(deployment),
        ],
        schedules=[
            build_reconcile_schedule(deployment),
            *build_schedules(deployment),
            build_analytics_schedule(deployment),
        ],
        resources=build_resources(),
    )


defs = build_definitions()
