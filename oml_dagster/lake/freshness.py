"""How far behind the outbox each tenant's lake is: the age of the tenant's oldest outbox row not
yet drained into every core table (bronze, silver, lineage, areas), whether it waits to be
sequenced or sequenced and waiting for a drain. One query for all lagging tenants, by Postgres's
clock (the rows' `created_at` is its clock too)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import psycopg


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


# Only tenants with something waiting come back: a tenant whose sequencer row is drained and
# that has no unsequenced row is fresh (lag 0). The per-tenant lateral scan reads the
# (tenant_id, seq) index from drained_through up: the waiting rows, not the tenant's history.
_LAGS = """
WITH drained AS (
    SELECT tenant_id, min(batch_end) AS drained FROM oml.lake_frontier
    WHERE table_name NOT LIKE 'gold.curated/%%' {frontier_filter} GROUP BY tenant_id
), sequenced AS (
    SELECT s.tenant_id, s.last_seq, COALESCE(d.drained, 0) AS drained, w.ops, w.oldest
    FROM oml.sequencer_tenant s
    LEFT JOIN drained d ON d.tenant_id = s.tenant_id
    CROSS JOIN LATERAL (
        SELECT count(*) AS ops, min(o.created_at) AS oldest FROM oml.outbox o
        WHERE o.tenant_id = s.tenant_id AND o.seq > COALESCE(d.drained, 0)
    ) w
    WHERE s.last_seq > COALESCE(d.drained, 0) {sequencer_filter}
), unsequenced AS (
    SELECT tenant_id, count(*) AS ops, min(created_at) AS oldest
    FROM oml.outbox WHERE seq IS NULL {outbox_filter} GROUP BY tenant_id
)
SELECT COALESCE(s.tenant_id, u.tenant_id)::text, s.last_seq, COALESCE(s.drained, f.drained, 0),
       COALESCE(s.ops, 0), COALESCE(u.ops, 0), LEAST(s.oldest, u.oldest),
       greatest(extract(epoch FROM clock_timestamp() - LEAST(s.oldest, u.oldest)), 0)::float8
FROM sequenced s
FULL JOIN unsequenced u ON u.tenant_id = s.tenant_id
LEFT JOIN drained f ON f.tenant_id = COALESCE(s.tenant_id, u.tenant_id)
"""


def tenant_lags(
    conn: psycopg.Connection, tenant_ids: list[str] | None = None
) -> dict[str, TenantLag]:
    """Every tenant with a row not yet drained into all its core tables (or only `tenant_ids`),
    with its lag; a tenant left out lags 0 s. One query, whatever the tenant count."""
    filters = {"frontier_filter": "", "sequencer_filter": "", "outbox_filter": ""}
    params: list = []
    if tenant_ids is not None:
        filters = {
            "frontier_filter": "AND tenant_id = ANY(%s::uuid[])",
            "sequencer_filter": "AND s.tenant_id = ANY(%s::uuid[])",
            "outbox_filter": "AND tenant_id = ANY(%s::uuid[])",
        }
        params = [tenant_ids] * 3
    rows = conn.execute(_LAGS.format(**filters), params).fetchall()
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
