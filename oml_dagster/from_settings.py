"""The core's config objects built from the settings: the one place the edges (the command line,
the Dagster resources, a benchmark's main) turn `oml_dagster.settings` into the values they pass
down, as kafka-delta-ingest reads its options once in `main` (ADR 0052). The core
(`oml_dagster.lake`) imports neither this module nor the settings. Each function reads the
process environment unless given `env`; none caches (a command reads what it needs when it
needs it). This module does not import Dagster."""

from __future__ import annotations

import datetime as dt

import psycopg

from oml_dagster.lake.faults import Connector, RetryPolicy
from oml_dagster.lake.store.layout import Lake
from oml_dagster.lake.write.writer import WriterConfig
from oml_dagster.settings import (
    ERASURE_CADENCE_SECONDS,
    FOLD_TIMEOUT_SECONDS,
    LAKE_URI,
    MEMORY_BUDGET_MIB,
    PG_CONNECT_SECONDS,
    PG_DSN,
    Env,
    TenantStorageReferences,
    lake_storage_options,
    retry_bounds,
    writer_batch,
)


def dsn(env: Env | None = None) -> str:
    """The lake's Postgres: OML_PG_DSN."""
    return PG_DSN.read(env)


# Whether this process ever reached a server is a fact of the process (ADR 0070): a command
# or a run that connected once and then lost PostgreSQL rides through, one that never reached it
# says so within OML_PG_CONNECT_SECONDS. So each (DSN, bound) has one Connector per process.
_CONNECTORS: dict[tuple[str, float], Connector] = {}


def connector(dsn_: str | None = None, env: Env | None = None) -> Connector:
    """This process's Connector to `dsn_` (default OML_PG_DSN), its first contact bounded by
    OML_PG_CONNECT_SECONDS."""
    key = (dsn_ or dsn(env), PG_CONNECT_SECONDS.read(env))
    return _CONNECTORS.setdefault(key, Connector(key[0], first_contact_seconds=key[1]))


def connect(*, autocommit: bool = True, env: Env | None = None) -> psycopg.Connection:
    """A connection to OML_PG_DSN (autocommit unless told otherwise, as every command takes it):
    the process's first one bounded by OML_PG_CONNECT_SECONDS (`PostgresUnreachable`), later
    ones failing as a lost connection does."""
    return connector(env=env).connect(autocommit=autocommit)


def named_lake(env: Env | None = None) -> Lake:
    """The lake OML_LAKE_URI names, with OML_LAKE_STORAGE_OPTIONS and the `AWS_*` variables, and
    the tenants' own storage options where OML_TENANT_STORAGE_OPTIONS_DIR and the
    `OML_LAKE_STORAGE_OPTIONS__<tenant>` variables say; not yet checked (`lake` checks it)."""
    return Lake(
        LAKE_URI.read(env), lake_storage_options(env), TenantStorageReferences.from_env(env)
    )


def lake(env: Env | None = None) -> Lake:
    """`named_lake` with, on S3, object_store's retry and timeouts (STORE_RETRY_DEFAULTS under
    the options), checked for conditional put."""
    return named_lake(env).with_store_defaults().checked()


def writer_config(
    max_batch: int | None = None, txn_lag_limit: int | None = None, env: Env | None = None
) -> WriterConfig:
    """The writer's config: batches of OML_MAX_BATCH ops with OML_TXN_LAG_LIMIT (`max_batch`
    and `txn_lag_limit` over them: `--max-batch`, a run's config), OML_FOLD_TIMEOUT_SECONDS
    and OML_MEMORY_BUDGET_MIB. One rule for the command line and the Dagster resources."""
    default_batch, lag_limit = writer_batch(env)
    return WriterConfig.for_batch(
        max_batch or default_batch,
        txn_lag_limit or lag_limit,
        fold_timeout_seconds=FOLD_TIMEOUT_SECONDS.read(env),
        memory_budget_mib=MEMORY_BUDGET_MIB.read(env),
    )


def retry_policy(env: Env | None = None) -> RetryPolicy:
    """The bound of a streak of transient faults: OML_RETRY_ATTEMPTS / OML_RETRY_SECONDS."""
    attempts, seconds = retry_bounds(env)
    return RetryPolicy(attempts=attempts, seconds=seconds)


def erasure_cadence(env: Env | None = None) -> dt.timedelta:
    """The maintenance cadence the erasure evidence allows past the bound:
    OML_ERASURE_CADENCE_SECONDS (default: a day)."""
    return dt.timedelta(seconds=ERASURE_CADENCE_SECONDS.read(env))


def export_target(uri: str, env: Env | None = None) -> Lake:
    """Where a tenant's export goes: a local path, or an object-store prefix reached with the
    lake's shared storage options (OML_LAKE_STORAGE_OPTIONS and the `AWS_*` variables; never a
    tenant's own set, which reaches only that tenant's prefix of the lake)."""
    shared = lake_storage_options(env) if "://" in uri and not uri.startswith("file://") else {}
    return Lake(uri, shared).with_store_defaults()
