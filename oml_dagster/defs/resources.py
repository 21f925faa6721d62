"""Resources for Postgres, the lake and the writer's batch settings, configured from the
environment in this one place (OML_PG_DSN, OML_LAKE_URI, OML_LAKE_STORAGE_OPTIONS, the AWS_*
variables, OML_MAX_BATCH, OML_TXN_LAG_LIMIT and OML_RUN_DRAIN_SECONDS), and the automation
settings below."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

import psycopg
from dagster import ConfigurableResource

from oml_dagster.lake import db
from oml_dagster.lake.erasure import DEFAULT_CADENCE
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


# How long one lake-writer run keeps sequencing and draining its tenant (ADR 0021).
DEFAULT_RUN_DRAIN_SECONDS = 60.0
# Shard runs the outbox sensor keeps under load (ADR 0027): half of dagster.yaml's run slots,
# leaving the rest for maintenance, the reconciler and backfills.
DEFAULT_DRAIN_SHARDS = 4


class WriterResource(ConfigurableResource):
    """How large one batch may be (ops per tenant), when an idle table gets a txn-only commit,
    and how long a run keeps draining its tenant batch after batch (0: one batch per run).
    Unset fields come from OML_MAX_BATCH / OML_TXN_LAG_LIMIT / OML_RUN_DRAIN_SECONDS, else the
    defaults."""

    max_batch: int | None = None
    txn_lag_limit: int | None = None
    run_drain_seconds: float | None = None
    drain_shards: int | None = None

    def shards(self) -> int:
        """How many shard runs the outbox sensor keeps (ADR 0027); 0: one run per tenant.
        From the field, else OML_DRAIN_SHARDS, else DEFAULT_DRAIN_SHARDS."""
        raw = self.drain_shards
        if raw is None:
            raw = os.environ.get("OML_DRAIN_SHARDS", "").strip() or DEFAULT_DRAIN_SHARDS
        try:
            value = int(raw)
        except ValueError:
            value = -1
        if value < 0:
            raise ValueError(f"OML_DRAIN_SHARDS={raw!r}: expected a whole number >= 0")
        return value

    def drain_seconds(self) -> float:
        raw = self.run_drain_seconds
        if raw is None:
            raw = os.environ.get("OML_RUN_DRAIN_SECONDS", "").strip() or DEFAULT_RUN_DRAIN_SECONDS
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"OML_RUN_DRAIN_SECONDS={raw!r}: expected seconds (a number >= 0)")
        return value

    def config(self) -> WriterConfig:
        max_batch = self.max_batch or int(os.environ.get("OML_MAX_BATCH", WriterConfig.max_batch))
        lag_limit = self.txn_lag_limit or os.environ.get("OML_TXN_LAG_LIMIT")
        return WriterConfig.for_batch(max_batch, int(lag_limit) if lag_limit else None)


def build_resources() -> dict:
    return {"postgres": PostgresResource(), "lake": LakeResource(), "writer": WriterResource()}


@dataclass(frozen=True)
class DeploymentSettings:
    """How the code location runs its automation, from the environment:
    OML_SENSOR_INTERVAL_SECONDS (outbox sensor tick, default 30), OML_DAGSTER_AUTOSTART (on by
    default: the sensor and every schedule start RUNNING; 0/false/no starts them STOPPED),
    OML_RECONCILE_CRON and
    OML_SCHEDULE_TIMEZONE (the reconciler's schedule), OML_ERASURE_CADENCE_SECONDS (the
    maintenance cadence the erasure check allows on top of the bound, default a day)."""

    sensor_interval_seconds: int = 30
    autostart: bool = True
    reconcile_cron: str = "30 5 * * *"
    schedule_timezone: str = "UTC"
    # The maintenance cadence the erasure check allows on top of the bound (a daily VACUUM).
    erasure_cadence_seconds: int = int(DEFAULT_CADENCE.total_seconds())

    @classmethod
    def from_env(cls) -> DeploymentSettings:
        env = os.environ
        return cls(
            sensor_interval_seconds=int(
                env.get("OML_SENSOR_INTERVAL_SECONDS", cls.sensor_interval_seconds)
            ),
            autostart=autostart_from(env),
            reconcile_cron=env.get("OML_RECONCILE_CRON", cls.reconcile_cron),
            schedule_timezone=schedule_timezone(env) or cls.schedule_timezone,
            erasure_cadence_seconds=int(
                env.get("OML_ERASURE_CADENCE_SECONDS", cls.erasure_cadence_seconds)
            ),
        )


def schedule_timezone(env: Mapping[str, str]) -> str | None:
    """OML_SCHEDULE_TIMEZONE, every schedule's timezone (None: unset). OML_MAINTENANCE_TZ, the
    maintenance schedules' earlier name for it, is still read; both set and different is
    refused, since the schedules would disagree about what "nightly" means."""
    current = env.get("OML_SCHEDULE_TIMEZONE") or None
    earlier = env.get("OML_MAINTENANCE_TZ") or None
    if current and earlier and current != earlier:
        raise ValueError(
            f"OML_SCHEDULE_TIMEZONE={current!r} and OML_MAINTENANCE_TZ={earlier!r} disagree; "
            "set OML_SCHEDULE_TIMEZONE only"
        )
    return current or earlier


def autostart_from(env: Mapping[str, str]) -> bool:
    """OML_DAGSTER_AUTOSTART: unset or empty, 1/true/yes/on: on; 0/false/no/off: off; anything
    else is refused, so a typo cannot silently stop maintenance (or start it)."""
    raw = env.get("OML_DAGSTER_AUTOSTART", "")
    value = raw.strip().lower()
    if value in ("", "1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(
        f"OML_DAGSTER_AUTOSTART={raw!r}: expected 1/true/yes/on or 0/false/no/off (unset: on)"
    )


settings = DeploymentSettings.from_env()
