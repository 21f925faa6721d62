"""What Postgres says about tenants that the writer, maintenance, the erasure evidence, the
doctor, the sensor and the command line all need the same answer to: which tenants there are,
each one's lake erasure bound (spec: "The erasure-SLO interaction"), the maintenance cadence the
erasure SLO allows, and how far a tenant's drain lags its outbox."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence

import psycopg

from oml_dagster.lake import queries
from oml_dagster.lake.errors import UnknownTenant
from oml_dagster.lake.queries import TenantSession, cross_scope, tenant_scope

# A tenant without a policy row gets this bound (oml.tenant_policy's own default).
DEFAULT_ERASURE_BOUND = dt.timedelta(days=7)
# The maintenance cadence the erasure SLO allows on top of the bound: a daily VACUUM (the
# default of OML_ERASURE_CADENCE_SECONDS, which the edge reads and passes down; a test pins the
# two the same).
DEFAULT_CADENCE = dt.timedelta(days=1)


def known_tenants(conn: psycopg.Connection) -> list[str]:
    """Every tenant the policy table or the sequencer knows, in id order: the tenants the command
    line, maintenance and the sensor's partitions cover when none is named."""
    with cross_scope(conn):
        return sorted(t for (t,) in conn.execute(queries.KNOWN_TENANTS))


def resolve_tenants(conn: psycopg.Connection, named: Sequence[str] | None) -> list[str]:
    """The tenants a command covers: every tenant Postgres knows when none is named, else the
    ones named, each a UUID that Postgres knows (a policy, sequencer or outbox row), in the order
    given, once each. An unknown one is refused (`UnknownTenant`, exit 2) before anything is read
    or written: a mistyped id must never get a clean "ok"."""
    known = known_tenants(conn)
    if not named:
        return known
    resolved: list[str] = []
    for text in named:
        try:
            tenant_id = str(uuid.UUID(text))
        except ValueError:
            raise UnknownTenant(f"tenant {text!r} is not a UUID") from None
        if tenant_id not in known and not _in_outbox(conn, tenant_id):
            raise UnknownTenant(
                f"tenant {tenant_id} is not known to PostgreSQL (no policy, sequencer or outbox "
                f"row; {len(known)} tenants are): check the id, or `oml-lake doctor` lists them"
            )
        if tenant_id not in resolved:
            resolved.append(tenant_id)
    return resolved


def _in_outbox(conn: psycopg.Connection, tenant_id: str) -> bool:
    with tenant_scope(conn, tenant_id):
        row = conn.execute(queries.TENANT_IN_OUTBOX, (tenant_id,)).fetchone()
    return bool(row and row[0])


def erasure_bound(conn: psycopg.Connection, tenant_id: str) -> dt.timedelta:
    """The tenant's `lake_erasure_bound`; DEFAULT_ERASURE_BOUND without a policy row."""
    with tenant_scope(conn, tenant_id) as session:
        return read_erasure_bound(session)


def read_erasure_bound(session: TenantSession) -> dt.timedelta:
    """`erasure_bound` in a session already open for the tenant."""
    row = session.execute(queries.ERASURE_BOUND, (session.tenant_id,)).fetchone()
    return row[0] if row else DEFAULT_ERASURE_BOUND


def lag(conn: psycopg.Connection, tenant_id: str, drained_through: int) -> tuple[int, float]:
    """(ops sequenced but not drained, seconds since the oldest of them was written)."""
    with tenant_scope(conn, tenant_id):
        row = conn.execute(queries.OUTBOX_LAG, (tenant_id, drained_through)).fetchone()
    count, oldest = row if row else (0, None)  # one row: an aggregate
    seconds = (dt.datetime.now(dt.UTC) - oldest).total_seconds() if oldest else 0.0
    return count, max(seconds, 0.0)
