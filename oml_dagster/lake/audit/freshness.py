"""How far behind the outbox each tenant's lake is: the age of the tenant's oldest outbox row not
yet drained into every core table (bronze, silver, lineage, areas), whether it waits to be
sequenced or sequenced and waiting for a drain. One query for all lagging tenants, by Postgres's
clock (the rows' `created_at` is its clock too)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import psycopg

from oml_dagster.lake import queries
from oml_dagster.lake.queries import cross_scope


@dataclass(frozen=True)
class TenantLag:
    """A tenant with rows not yet in every core table. `drained_through` is the least batch end
    of its core tables (0: never drained); `last_seq` its last sequenced seq (None: nothing
    sequenced yet)."""

    tenant_id: str
    seconds: float
    ops_waiting: int  # sequenced, above drained_through
    ops_unsequenced: int  # not sequenced yet (a cut not run, or held behind a journal gap)
    oldest_at: dt.datetime
    drained_through: int
    last_seq: int | None


def tenant_lags(
    conn: psycopg.Connection, tenant_ids: list[str] | None = None
) -> dict[str, TenantLag]:
    """Every tenant with a row not yet drained into all its core tables (or only `tenant_ids`),
    with its lag; a tenant left out lags 0 s. One query, whatever the tenant count."""
    filters = queries.TENANT_LAGS_ALL
    params: list[list[str]] = []
    if tenant_ids is not None:
        filters = queries.TENANT_LAGS_OF
        params = [tenant_ids] * 3
    with cross_scope(conn):
        rows = conn.execute(queries.TENANT_LAGS.format(**filters), params).fetchall()
    return {
        tenant_id: TenantLag(
            tenant_id=tenant_id,
            seconds=seconds,
            ops_waiting=waiting,
            ops_unsequenced=unsequenced,
            oldest_at=oldest,
            drained_through=drained,
            last_seq=last_seq,
        )
        for tenant_id, last_seq, drained, waiting, unsequenced, oldest, seconds in rows
    }


def tenant_lag(conn: psycopg.Connection, tenant_id: str) -> TenantLag | None:
    """The tenant's lag, None when nothing of it waits."""
    return tenant_lags(conn, [tenant_id]).get(tenant_id)
