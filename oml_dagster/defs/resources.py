"""The code location's settings, read at the edge: the resources (Postgres, the lake, the writer's
batch and run settings) and the automation settings the sensors and schedules are built with.

A resource's fields are a run's config: a field left unset takes its setting from
`oml_dagster.settings`. Each resource resolves all of its settings once, when Dagster builds it
for a run or a tick (`setup_for_execution`), into one plain value the assets and sensors read; a
value given in the run's config is checked as its setting would be, and refused naming the
field. Nothing here reads the environment when the module is imported: `definitions.py` builds
the automation from `DeploymentSettings.from_env()` when the code location loads."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, replace
from typing import TypeVar

import psycopg
from dagster import (
    ConfigurableResource,
    DefaultScheduleStatus,
    DefaultSensorStatus,
    InitResourceContext,
)
from pydantic import PrivateAttr

from oml_dagster import from_settings
from oml_dagster.lake.faults import RetryPolicy
from oml_dagster.lake.store.layout import Lake
from oml_dagster.lake.write.writer import WriterConfig
from oml_dagster.settings import (
    ANALYTICS_CRON,
    COMPACT_CRON,
    DAGSTER_AUTOSTART,
    DRAIN_SHARDS,
    ERASURE_CADENCE_SECONDS,
    PURGE_GRACE_SECONDS,
    RECONCILE_CRON,
    RUN_DRAIN_SECONDS,
    SCHEDULE_TIMEZONE,
    SENSOR_INTERVAL_SECONDS,
    SHARD_RUN_SECONDS,
    SHARD_STANDING,
    VACUUM_CRON,
    ZORDER_CRON,
    Env,
    Setting,
    retry_bounds,
)

from .failures import failing_clearly

T = TypeVar("T")


def resolved(setting: Setting[T], given: object | None, field: str, env: Env | None) -> T:
    """The run's config value of `field` when given (checked as `setting` would check it, and
    refused naming the field), else `setting` as the environment says."""
    return setting.read(env) if given is None else setting.accept(str(given), field)


class PostgresResource(ConfigurableResource):  # type: ignore[type-arg]
    """The authority: schema `oml` (outbox, policies, dead letters, frontier cache). `dsn` unset:
    OML_PG_DSN."""

    dsn: str | None = None
    _dsn: str | None = PrivateAttr(default=None)

    def setup_for_execution(self, context: InitResourceContext) -> None:
        with failing_clearly():
            self._dsn = self.resolve()

    def resolve(self, env: Env | None = None) -> str:
        return self.dsn or from_settings.dsn(env)

    def connect(self) -> psycopg.Connection:  # type: ignore[type-arg]
        """The process's first connection bounded by OML_PG_CONNECT_SECONDS (ADR 0070)."""
        if self._dsn is None:
            self._dsn = self.resolve()
        return from_settings.connector(self._dsn).connect(autocommit=True)


@dataclass(frozen=True)
class LakeSettings:
    """The lake as the settings name it (not yet probed: `LakeResource.get_lake` checks it) and
    the maintenance cadence the erasure evidence allows past the bound."""

    lake: Lake
    erasure_cadence: dt.timedelta


class LakeResource(ConfigurableResource):  # type: ignore[type-arg]
    """The lake root, storage options and tenants' own storage options (`Lake.for_tenant`), and
    the erasure cadence. `uri` unset: OML_LAKE_URI; `erasure_cadence_seconds` unset:
    OML_ERASURE_CADENCE_SECONDS."""

    uri: str | None = None
    erasure_cadence_seconds: int | None = None
    _settings: LakeSettings | None = PrivateAttr(default=None)

    def setup_for_execution(self, context: InitResourceContext) -> None:
        with failing_clearly():
            self._settings = self.resolve()

    def resolve(self, env: Env | None = None) -> LakeSettings:
        lake = from_settings.named_lake(env)
        if self.uri:
            lake = replace(lake, root=self.uri)
        cadence = resolved(
            ERASURE_CADENCE_SECONDS, self.erasure_cadence_seconds, "erasure_cadence_seconds", env
        )
        return LakeSettings(lake, dt.timedelta(seconds=cadence))

    @property
    def settings(self) -> LakeSettings:
        if self._settings is None:
            self._settings = self.resolve()
        return self._settings

    def get_lake(self) -> Lake:
        """The lake, checked: an object store is probed for conditional put (once per store and
        process), so a run calls this inside its retry."""
        return self.settings.lake.with_store_defaults().checked()


@dataclass(frozen=True)
class WriterSettings:
    """What a lake-writer run or the outbox sensor reads of the writer's settings, resolved once:
    the batch config, how long a tenant run keeps draining (`run_drain_seconds`, 0: one batch),
    how many shard runs the sensor keeps (`shards`, 0: one run per tenant, ADR 0027), how long a
    shard run drains, whether shard runs stand (ADR 0032: off when a shard run's cap is 0,
    which leaves nothing to stand on) and the bound of a streak of transient faults."""

    config: WriterConfig
    run_drain_seconds: float
    shards: int
    shard_run_seconds: float
    standing: bool
    retry: RetryPolicy


class WriterResource(ConfigurableResource):  # type: ignore[type-arg]
    """How large one batch may be (ops per tenant), when an idle table gets a txn-only commit,
    how long a run keeps draining, the shard runs and the retry bound. Unset fields come from
    OML_MAX_BATCH, OML_TXN_LAG_LIMIT, OML_RUN_DRAIN_SECONDS, OML_DRAIN_SHARDS,
    OML_SHARD_RUN_SECONDS, OML_SHARD_STANDING, OML_RETRY_ATTEMPTS and OML_RETRY_SECONDS."""

    max_batch: int | None = None
    txn_lag_limit: int | None = None
    run_drain_seconds: float | None = None
    drain_shards: int | None = None
    shard_drain_seconds: float | None = None
    shard_standing: bool | None = None
    retry_attempts: int | None = None
    retry_seconds: float | None = None
    _settings: WriterSettings | None = PrivateAttr(default=None)

    def setup_for_execution(self, context: InitResourceContext) -> None:
        with failing_clearly():
            self._settings = self.resolve()

    def resolve(self, env: Env | None = None) -> WriterSettings:
        shard_seconds = resolved(
            SHARD_RUN_SECONDS, self.shard_drain_seconds, "shard_drain_seconds", env
        )
        standing = resolved(SHARD_STANDING, self.shard_standing, "shard_standing", env)
        attempts, seconds = retry_bounds(env)
        if self.retry_seconds is not None:
            seconds = self.retry_seconds
        if self.retry_attempts is not None:
            attempts = self.retry_attempts
        return WriterSettings(
            config=from_settings.writer_config(self.max_batch, self.txn_lag_limit, env),
            run_drain_seconds=resolved(
                RUN_DRAIN_SECONDS, self.run_drain_seconds, "run_drain_seconds", env
            ),
            shards=resolved(DRAIN_SHARDS, self.drain_shards, "drain_shards", env),
            shard_run_seconds=shard_seconds,
            standing=standing and shard_seconds > 0,
            retry=RetryPolicy(attempts=attempts if seconds > 0 else 1, seconds=seconds),
        )

    @property
    def settings(self) -> WriterSettings:
        if self._settings is None:
            self._settings = self.resolve()
        return self._settings


def build_resources() -> dict[str, ConfigurableResource]:  # type: ignore[type-arg]
    """The code location's resources, every field unset: each takes its setting when Dagster
    builds it for a run or a tick."""
    return {"postgres": PostgresResource(), "lake": LakeResource(), "writer": WriterResource()}


@dataclass(frozen=True)
class DeploymentSettings:
    """How the code location runs its automation: the outbox sensor's tick, whether the sensors
    and the schedules start RUNNING, and every schedule's cron and their one timezone. Read once
    when the code location loads (`definitions.py`) and passed to the factories that build the
    sensors and schedules."""

    sensor_interval_seconds: int = SENSOR_INTERVAL_SECONDS.default
    autostart: bool = DAGSTER_AUTOSTART.default
    schedule_timezone: str = SCHEDULE_TIMEZONE.default
    reconcile_cron: str = RECONCILE_CRON.default
    analytics_cron: str = ANALYTICS_CRON.default
    compact_cron: str = COMPACT_CRON.default
    zorder_cron: str = ZORDER_CRON.default
    vacuum_cron: str = VACUUM_CRON.default
    purge_grace_seconds: float = PURGE_GRACE_SECONDS.default

    @property
    def schedule_status(self) -> DefaultScheduleStatus:
        return DefaultScheduleStatus.RUNNING if self.autostart else DefaultScheduleStatus.STOPPED

    @property
    def sensor_status(self) -> DefaultSensorStatus:
        return DefaultSensorStatus.RUNNING if self.autostart else DefaultSensorStatus.STOPPED

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
            purge_grace_seconds=PURGE_GRACE_SECONDS.read(env),
        )
