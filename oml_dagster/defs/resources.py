"""Resources for Postgres, the lake and the writer's batch settings, and the automation settings
of the code location. Every value comes from `oml_dagster.settings` (the environment, read
there; `oml_dagster.from_settings` builds the core's config objects from it), unless a resource
field is set in the run's config: the code location's edge, passing values down to the core."""

from __future__ import annotations

from dataclasses import dataclass, replace

import psycopg
from dagster import ConfigurableResource

from oml_dagster import from_settings
from oml_dagster.lake.faults import RetryPolicy
from oml_dagster.lake.store.storage import Lake
from oml_dagster.lake.write.writer import WriterConfig
from oml_dagster.settings import (
    ANALYTICS_CRON,
    COMPACT_CRON,
    DAGSTER_AUTOSTART,
    DRAIN_SHARDS,
    ERASURE_CADENCE_SECONDS,
    RECONCILE_CRON,
    RUN_DRAIN_SECONDS,
    SCHEDULE_TIMEZONE,
    SENSOR_INTERVAL_SECONDS,
    SHARD_RUN_SECONDS,
    SHARD_STANDING,
    VACUUM_CRON,
    ZORDER_CRON,
    Env,
    retry_bounds,
)


class PostgresResource(ConfigurableResource):
    """The authority: schema `oml` (outbox, policies, dead letters, frontier cache)."""

    dsn: str | None = None

    def connect(self) -> psycopg.Connection:
        """The process's first connection bounded by OML_PG_CONNECT_SECONDS (ADR 0070)."""
        return from_settings.connector(self.dsn).connect(autocommit=True)


class LakeResource(ConfigurableResource):
    """The lake root, storage options and tenants' own storage options (`Lake.for_tenant`);
    defaults come from the environment."""

    uri: str | None = None

    def get_lake(self) -> Lake:
        lake = from_settings.lake()
        if not self.uri:
            return lake
        return replace(lake, root=self.uri).with_store_defaults().checked()


class WriterResource(ConfigurableResource):
    """How large one batch may be (ops per tenant), when an idle table gets a txn-only commit,
    and how long a run keeps draining its tenant batch after batch (0: one batch per run).
    Unset fields come from OML_MAX_BATCH / OML_TXN_LAG_LIMIT / OML_RUN_DRAIN_SECONDS."""

    max_batch: int | None = None
    txn_lag_limit: int | None = None
    run_drain_seconds: float | None = None
    drain_shards: int | None = None
    shard_drain_seconds: float | None = None
    shard_standing: bool | None = None
    retry_attempts: int | None = None
    retry_seconds: float | None = None

    def shard_run_seconds(self) -> float:
        """How long a shard run keeps draining (ADR 0027); 0: one pass per run."""
        if self.shard_drain_seconds is None:
            return SHARD_RUN_SECONDS.read()
        return SHARD_RUN_SECONDS.accept(str(self.shard_drain_seconds), "shard_drain_seconds")

    def standing(self) -> bool:
        """Whether shard runs stand (ADR 0032): the sensor keeps one in flight per shard, and a
        shard run out of work polls the outbox until its cap instead of ending. A cap of 0 (one
        pass per run) leaves nothing to stand on: off."""
        switch = SHARD_STANDING.read() if self.shard_standing is None else self.shard_standing
        return switch and self.shard_run_seconds() > 0

    def shards(self) -> int:
        """How many shard runs the outbox sensor keeps (ADR 0027); 0: one run per tenant."""
        if self.drain_shards is None:
            return DRAIN_SHARDS.read()
        return DRAIN_SHARDS.accept(str(self.drain_shards), "drain_shards")

    def drain_seconds(self) -> float:
        if self.run_drain_seconds is None:
            return RUN_DRAIN_SECONDS.read()
        return RUN_DRAIN_SECONDS.accept(str(self.run_drain_seconds), "run_drain_seconds")

    def retry_policy(self) -> RetryPolicy:
        """The bound of a streak of transient faults inside a run (OML_RETRY_ATTEMPTS /
        OML_RETRY_SECONDS unless set here)."""
        attempts, seconds = retry_bounds()
        if self.retry_seconds is not None:
            seconds = self.retry_seconds
        if self.retry_attempts is not None:
            attempts = self.retry_attempts
        return RetryPolicy(attempts=attempts if seconds > 0 else 1, seconds=seconds)

    def config(self) -> WriterConfig:
        return from_settings.writer_config(self.max_batch, self.txn_lag_limit)


def build_resources() -> dict:
    return {"postgres": PostgresResource(), "lake": LakeResource(), "writer": WriterResource()}


@dataclass(frozen=True)
class DeploymentSettings:
    """How the code location runs its automation: the outbox sensor's tick, whether the sensors
    and the schedules start RUNNING, every schedule's cron and their one timezone, and the
    maintenance cadence the erasure check allows on top of the bound."""

    sensor_interval_seconds: int = SENSOR_INTERVAL_SECONDS.default
    autostart: bool = DAGSTER_AUTOSTART.default
    schedule_timezone: str = SCHEDULE_TIMEZONE.default
    reconcile_cron: str = RECONCILE_CRON.default
    analytics_cron: str = ANALYTICS_CRON.default
    compact_cron: str = COMPACT_CRON.default
    zorder_cron: str = ZORDER_CRON.default
    vacuum_cron: str = VACUUM_CRON.default
    erasure_cadence_seconds: int = ERASURE_CADENCE_SECONDS.default

    @classmethod
    def from_env(cls, env: Env | None = None) -> DeploymentSettings:
        return cls(
            sensor_interval_seconds=SENSOR_INTERVAL_SECONDS.read(env),
            autostart=DAGSTER_AUTOSTART.read(env),
            schedule_timezone=SCHEDULE_TIMEZONE.read(env),
            reconcile_cron=RECONCILE_CRON.read(env),
            analytics_cron=ANALYTICS_CRON.read(env),
            compact_cron=COMPACT_CRON.read(env),
            zorder_cron=ZORDER_CRON.read(env),
            vacuum_cron=VACUUM_CRON.read(env),
            erasure_cadence_seconds=ERASURE_CADENCE_SECONDS.read(env),
        )


settings = DeploymentSettings.from_env()
