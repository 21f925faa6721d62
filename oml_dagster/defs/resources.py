"""Resources for Postgres, the lake and the writer's batch settings, configured from the
environment in this one place (OML_PG_DSN, OML_LAKE_URI, OML_LAKE_STORAGE_OPTIONS, the AWS_*
variables, OML_MAX_BATCH and OML_TXN_LAG_LIMIT), and the automation settings below."""

from __future__ import annotations

import os
from dataclasses import dataclass

import psycopg
from dagster import ConfigurableResource

from oml_dagster.lake import db
from oml_dagster.lake.storage import Lake
from oml_dagster.lake.writer import WriterConfig


class PostgresResource(ConfigurableResource):
    """The authority: schema `oml` (outbox, policies, dead letters, frontier cache)."""

    dsn: str | None = None

    def connect(self) -> psycopg.Connection:
        return db.connect(self.dsn or db.dsn_from_env(), autocommit=True)


class LakeResource(ConfigurableResource):
    """The lake root and storage options; defaults come from the environment."""

    uri: str | None = None

    def get_lake(self) -> Lake:
        lake = Lake.from_env()
        return Lake(self.uri, lake.storage_options).checked() if self.uri else lake


class WriterResource(ConfigurableResource):
    """How large one run's batch may be (ops per tenant), and when an idle table gets a
    txn-only commit. Unset fields come from OML_MAX_BATCH / OML_TXN_LAG_LIMIT, else the core's
    defaults."""

    max_batch: int | None = None
    txn_lag_limit: int | None = None

    def config(self) -> WriterConfig:
        default = WriterConfig()
        max_batch = self.max_batch or int(os.environ.get("OML_MAX_BATCH", default.max_batch))
        lag_limit = self.txn_lag_limit or int(
            os.environ.get("OML_TXN_LAG_LIMIT", min(default.txn_lag_limit, max_batch // 2) or 1)
        )
        return WriterConfig(max_batch=max_batch, txn_lag_limit=lag_limit)


def build_resources() -> dict:
    return {"postgres": PostgresResource(), "lake": LakeResource(), "writer": WriterResource()}


@dataclass(frozen=True)
class DeploymentSettings:
    """How the code location runs its automation, from the environment:
    OML_SENSOR_INTERVAL_SECONDS (outbox sensor tick, default 30), OML_DAGSTER_AUTOSTART=1 (sensor
    and schedules start RUNNING instead of STOPPED), OML_RECONCILE_CRON and
    OML_SCHEDULE_TIMEZONE (the reconciler's schedule), OML_ERASURE_CADENCE_SECONDS (the
    maintenance cadence the erasure check allows on top of the bound, default a day)."""

    sensor_interval_seconds: int = 30
    autostart: bool = False
    reconcile_cron: str = "30 5 * * *"
    schedule_timezone: str = "UTC"
    # The maintenance cadence the erasure check allows on top of the bound (a daily VACUUM).
    erasure_cadence_seconds: int = 86400

    @classmethod
    def from_env(cls) -> DeploymentSettings:
        env = os.environ
        return cls(
            sensor_interval_seconds=int(env.get("OML_SENSOR_INTERVAL_SECONDS", "30")),
            autostart=env.get("OML_DAGSTER_AUTOSTART", "") in ("1", "true", "yes"),
            reconcile_cron=env.get("OML_RECONCILE_CRON", "30 5 * * *"),
            schedule_timezone=env.get("OML_SCHEDULE_TIMEZONE", "UTC"),
            erasure_cadence_seconds=int(env.get("OML_ERASURE_CADENCE_SECONDS", "86400")),
        )


settings = DeploymentSettings.from_env()
