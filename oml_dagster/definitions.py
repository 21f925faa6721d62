"""The `oml_lake` code location: assembles the definitions of `oml_dagster.defs`, nothing else."""

from dagster import Definitions

from oml_dagster.defs.assets import lake_tables, outbox
from oml_dagster.defs.checks import LAKE_CHECKS, erasure_evidence_asset, reconcile_schedule
from oml_dagster.defs.jobs import lake_writer_job
from oml_dagster.defs.maintenance import MAINTENANCE_JOBS, MAINTENANCE_SCHEDULES
from oml_dagster.defs.resources import build_resources
from oml_dagster.defs.sensors import outbox_sensor

defs = Definitions(
    assets=[outbox, lake_tables, erasure_evidence_asset],
    asset_checks=LAKE_CHECKS,
    jobs=[lake_writer_job, *MAINTENANCE_JOBS],
    sensors=[outbox_sensor],
    schedules=[reconcile_schedule, *MAINTENANCE_SCHEDULES],
    resources=build_resources(),
)
