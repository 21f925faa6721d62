"""A departed tenant's purge (DESIGN "A tenant's departure"; ADR 0076): what is left of its
outbox drained, then every object under `<root>/<tenant_id>/` removed and the writer's own rows
of it (frontier, verdicts, dead letters), with a receipt kept in `oml.lake_tenant_purge`.

The steps, each safe to run again from wherever a crash stopped the last run:
1. Refused unless `tenant_policy.departed_at` is set. A finished purge returns its receipt.
2. Before its record exists: the tenant's outbox drained; refused while ops remain undrained
   (a gap the producer must close first). Then the record is written (state purging) with the
   inventory of what is there: each table and its version, each object and its size. From then
   on the drain and the tenant list leave the tenant out, so nothing refills the prefix.
3. Every object under the prefix listed (objects a previous run did not see are added to the
   inventory first) and deleted; again, up to `PASSES` times, until a listing finds nothing.
4. The writer's rows of the tenant deleted, their counts added to the inventory in the same
   transaction.
5. The prefix listed once more (it must be empty), and the receipt written (state purged).

The listing is the tenant's own prefix as a directory (`<root>/<tenant_id>/`, object_store
lists by whole path segments), through the tenant's own credentials when it has them (ADR 0048):
another tenant's objects, even one whose id extends this one's as a string, are never listed.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from oml_dagster.lake import queries
from oml_dagster.lake.audit.doctor import drained_through
from oml_dagster.lake.audit.export import list_objects
from oml_dagster.lake.errors import PurgeUnfinished, TenantNotDeparted
from oml_dagster.lake.model.tables import APP_ID
from oml_dagster.lake.policy import DEFAULT_ERASURE_BOUND, lag
from oml_dagster.lake.queries import cross_scope, tenant_scope, tenant_text
from oml_dagster.lake.store.layout import Lake
from oml_dagster.lake.store.reads import tenant_tables
from oml_dagster.lake.write.drain import DrainPolicy, drain

# Listing-and-deleting passes before a purge gives up with what is left named (a writer still
# committing to the prefix would need a second pass; a fifth means something keeps writing).
PASSES = 5
PURGING, PURGED = "purging", "purged"


@dataclass(frozen=True)
class Departure:
    """A departed tenant as PostgreSQL records it, and how far its purge got."""

    tenant_id: str
    departed_at: dt.datetime
    bound: dt.timedelta
    purge_state: str | None
    purged_at: dt.datetime | None

    @property
    def deadline(self) -> dt.datetime:
        return self.departed_at + self.bound

    def overdue(self, now: dt.datetime) -> bool:
        """Past its deadline and not purged: a breach of what the writer owes the tenant."""
        return self.purge_state != PURGED and now > self.deadline

    def finding(self) -> str:
        state = "its purge started and did not finish" if self.purge_state else "not purged"
        return (
            f"departed tenant {self.tenant_id}: {state} by its deadline "
            f"{self.deadline:%Y-%m-%dT%H:%M:%SZ} (departed {self.departed_at:%Y-%m-%dT%H:%M:%SZ}, "
            f"bound {self.bound}): run `oml-lake tenant purge --tenant {self.tenant_id}`"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "tenant_id": self.tenant_id,
            "departed_at": self.departed_at.isoformat(),
            "deadline": self.deadline.isoformat(),
            "purge_state": self.purge_state,
            "purged_at": self.purged_at.isoformat() if self.purged_at else None,
        }


def departures(conn: psycopg.Connection) -> list[Departure]:
    """Every departed tenant, in id order."""
    with cross_scope(conn):
        rows = conn.execute(queries.DEPARTURES).fetchall()
    return [
        Departure(t, at, bound or DEFAULT_ERASURE_BOUND, state, done)
        for t, at, bound, state, done in rows
    ]


def overdue_departures(
    conn: psycopg.Connection, now: dt.datetime | None = None, tenants: list[str] | None = None
) -> list[Departure]:
    """The departed tenants past their deadline and not purged (of `tenants`, when given)."""
    moment = now or dt.datetime.now(dt.UTC)
    return [
        d
        for d in departures(conn)
        if d.overdue(moment) and (tenants is None or d.tenant_id in tenants)
    ]


def due_for_purge(
    conn: psycopg.Connection, grace: dt.timedelta, now: dt.datetime | None = None
) -> list[str]:
    """The departed tenants not purged whose grace period since departure is over (`grace`, or
    half the tenant's erasure bound when that is shorter, so the purge lands within the bound):
    what the departure sensor starts a purge for."""
    moment = now or dt.datetime.now(dt.UTC)
    return [
        d.tenant_id
        for d in departures(conn)
        if d.purge_state != PURGED and moment >= d.departed_at + min(grace, d.bound / 2)
    ]


def receipt(conn: psycopg.Connection, tenant_id: str) -> dict[str, Any] | None:
    """The tenant's purge receipt; None before its purge finished."""
    with tenant_scope(conn, tenant_id):
        row = conn.execute(queries.PURGE_ROW, (tenant_text(tenant_id),)).fetchone()
    if row is None or row[0] != PURGED:
        return None
    stored: dict[str, Any] = row[5]
    return stored


def _listing(lake: Lake, tenant_id: str) -> tuple[Lake, dict[str, int]]:
    """(the tenant's lake, every object under its prefix: path relative to it -> size)."""
    own = lake.for_tenant(tenant_id)
    prefix = own.tenant_uri(tenant_id)
    if own.is_local and not os.path.isdir(own.local_path(prefix)):
        return own, {}
    return own, list_objects(own.filesystem(prefix))


def _inventory(lake: Lake, tenant_id: str) -> dict[str, Any]:
    tables = []
    for table_id, _spec, uri in tenant_tables(lake.for_tenant(tenant_id), tenant_id):
        table = lake.for_tenant(tenant_id).open(uri)
        if table is not None:
            tables.append(
                {
                    "name": str(table_id),
                    "version": table.version(),
                    "txn_version": table.transaction_version(APP_ID) or 0,
                }
            )
    _, objects = _listing(lake, tenant_id)
    return {"tables": tables, "objects": objects, "writer_rows": {}}


def _drained(conn: psycopg.Connection, lake: Lake, tenant_id: str) -> None:
    """Drain what is left of the tenant's outbox; refuse while any of it stays undrained."""
    drain(conn, lake, [tenant_id], policy=DrainPolicy(until_idle=True))
    through = drained_through(lake, tenant_id)
    waiting, _ = lag(conn, tenant_id, through)
    with tenant_scope(conn, tenant_id):
        row = conn.execute(queries.OUTBOX_UNSEQUENCED, (tenant_id,)).fetchone()
    unsequenced = int(row[0]) if row else 0
    if waiting or unsequenced:
        raise PurgeUnfinished(
            f"tenant {tenant_id}: {waiting} sequenced and {unsequenced} unsequenced outbox ops "
            "are not drained (a journal gap holds them: `oml-lake doctor --tenant "
            f"{tenant_id}`); nothing was removed: drain them, then purge again"
        )


def purge_tenant(
    conn: psycopg.Connection,
    lake: Lake,
    tenant_id: str,
    *,
    by: str,
    step: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Purge a departed tenant (module docstring); returns its receipt. `step(name)` is called
    between the steps and after each object deleted (progress, and a crash seam for tests)."""
    tenant_id = tenant_text(tenant_id)
    seam = step or (lambda _name: None)
    with tenant_scope(conn, tenant_id):
        policy = conn.execute(queries.DEPARTED_AT, (tenant_id,)).fetchone()
        record = conn.execute(queries.PURGE_ROW, (tenant_id,)).fetchone()
    if policy is None or policy[0] is None:
        raise TenantNotDeparted(
            f"tenant {tenant_id} has not departed (oml.tenant_policy.departed_at is "
            f"{'NULL' if policy else 'absent: no policy row'}): only a departed tenant is purged"
        )
    departed_at = policy[0]
    if record is not None and record[0] == PURGED:
        done: dict[str, Any] = record[5]
        return done
    if record is None:
        _drained(conn, lake, tenant_id)
        seam("drained")
        inventory = _inventory(lake, tenant_id)
        with tenant_scope(conn, tenant_id):
            conn.execute(queries.PURGE_START, (tenant_id, by, Jsonb(inventory)))
            record = conn.execute(queries.PURGE_ROW, (tenant_id,)).fetchone()
        assert record is not None
        seam("recorded")
    requested_by, started_at, removed = record[1], record[2], record[4]

    own, found = _listing(lake, tenant_id)
    for _ in range(PASSES):
        if not found:
            break
        unseen = {p: s for p, s in found.items() if p not in removed["objects"]}
        if unseen:
            removed["objects"].update(unseen)
            with tenant_scope(conn, tenant_id):
                conn.execute(queries.PURGE_REMOVED, (Jsonb(removed), tenant_id))
        fs = own.filesystem(own.tenant_uri(tenant_id))
        for path in sorted(found):
            # Gone since the listing (a concurrent purge) is what was wanted.
            with contextlib.suppress(FileNotFoundError):
                fs.delete_file(path)
            seam("deleted")
        if own.is_local:
            shutil.rmtree(own.local_path(own.tenant_uri(tenant_id)), ignore_errors=True)
        own, found = _listing(lake, tenant_id)
    if found:
        raise PurgeUnfinished(
            f"tenant {tenant_id}: {len(found)} objects are still under {own.tenant_uri(tenant_id)}/ "
            f"after {PASSES} passes (first: {sorted(found)[0]}); something still writes there: "
            "stop it, then purge again"
        )
    seam("emptied")

    with tenant_scope(conn, tenant_id):
        counts = removed.get("writer_rows", {})
        for table, statement in queries.PURGE_WRITER_ROWS:
            deleted = conn.execute(statement, (tenant_id,)).rowcount
            counts[table] = counts.get(table, 0) + max(deleted, 0)
        removed["writer_rows"] = counts
        conn.execute(queries.PURGE_REMOVED, (Jsonb(removed), tenant_id))
    seam("rows")

    _, after = _listing(lake, tenant_id)
    finished_at = dt.datetime.now(dt.UTC)
    objects: dict[str, int] = removed["objects"]
    shared = own.own_source is None
    made = {
        "tenant_id": tenant_id,
        "prefix": f"{own.tenant_uri(tenant_id)}/",
        "departed_at": departed_at.isoformat(),
        "requested_by": requested_by,
        "started_at": started_at.isoformat(),
        "finished_at": finished_at.isoformat(),
        "tables": removed["tables"],
        "table_versions": sum(t["version"] + 1 for t in removed["tables"]),
        "objects": len(objects),
        "bytes": sum(objects.values()),
        "log_entries": sum(1 for p in objects if "/_delta_log/" in f"/{p}"),
        "writer_rows": removed["writer_rows"],
        "listing_after": sorted(after),
        "credentials": {
            "own": not shared,
            "source": own.own_source,
            "revocable": not shared,
            "why": (
                "the shared credential set serves every other tenant: it stays"
                if shared
                else "the tenant's own credential set reached only this prefix, now empty: "
                "revoke it (the object store's user itself is the operator's)"
            ),
        },
    }
    if after:
        raise PurgeUnfinished(
            f"tenant {tenant_id}: {sorted(after)[0]} appeared under its prefix after the purge "
            "emptied it; purge again"
        )
    with tenant_scope(conn, tenant_id):
        conn.execute(queries.PURGE_FINISH, (finished_at, Jsonb(made), tenant_id))
    seam("receipt")
    return made
