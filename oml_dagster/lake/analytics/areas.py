"""The workarea tree at a past instant (spec: "what was the tree on date X is a bronze replay"):
the tenant's journalled area events, each mapped to the op it journals, replayed through the op
catalog's own `check` and `apply` on a state that holds areas only. The rules are the catalog's:
a change to them changes `oml-lake areas-at` with the writer."""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import psycopg

from oml_dagster.lake import queries
from oml_dagster.lake.analytics.sandbox import TenantConnection
from oml_dagster.lake.errors import RefusedOp
from oml_dagster.lake.model import catalog
from oml_dagster.lake.model.tables import TenantState
from oml_dagster.lake.queries import tenant_scope
from oml_dagster.lake.store.sql import sql_in

# The journal events of the area acts, and the op each one journals (DESIGN §2): the event's
# payload is the op's.
AREA_EVENTS = {
    "workarea.updated": "area.upsert",
    "workarea.reparented": "area.reparent",
    "workarea.validated": "area.validate",
}
AREA_COLUMNS = (
    "workarea_id",
    "parent_id",
    "path",
    "status",
    "crew_name",
    "crew_charter_uri",
    "crew_external_manager",
    "created_at",
    "updated_at",
)


@dataclass(frozen=True)
class AreaEvent:
    """One journalled area event as bronze holds it (`payload`: the JSON text)."""

    journal_seq: int
    outbox_seq: int
    event_type: str
    payload: str


@dataclass
class AreaReplay:
    """The tree replayed from bronze up to `as_of` (None: every event): rows by workarea_id, in
    `AREA_COLUMNS`; the events applied; and the events skipped (`skipped`: journal_seq and
    reason) because the writer refused their op, which gold.areas never shows either. `latest`
    is the act instant of the latest area event journalled, whatever `as_of`."""

    as_of: dt.datetime | None
    areas: dict[str, dict[str, Any]]
    events_applied: int
    last_journal_seq: int | None
    skipped: list[tuple[int, str]]
    latest: dt.datetime | None

    @property
    def at_present(self) -> bool:
        """Whether the replay holds every event journalled: then it must equal gold.areas."""
        return self.as_of is None or self.latest is None or self.as_of >= self.latest


def parse_instant(text: str) -> dt.datetime:
    """An ISO date (the end of that UTC day: the tree as the day closed) or an ISO instant
    (naive means UTC)."""
    try:
        if re.fullmatch(r"\d{4}-\d{2}-\d{2}", text):
            day = dt.date.fromisoformat(text)
            return dt.datetime.combine(day, dt.time.max, dt.UTC)
        at = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"not an ISO date or instant: {text!r}") from None
    return at if at.tzinfo else at.replace(tzinfo=dt.UTC)


def area_events(tc: TenantConnection) -> list[AreaEvent]:
    """The tenant's journalled area events in chain order."""
    return [
        AreaEvent(
            int(row["journal_seq"]),
            int(row["outbox_seq"]),
            str(row["event_type"]),
            str(row["payload"]),
        )
        for row in tc.rows(
            "SELECT journal_seq, outbox_seq, event_type, payload FROM bronze_events"
            f" WHERE {sql_in('event_type', AREA_EVENTS)} ORDER BY journal_seq"
        )
    ]


def _act_instant(payload: Any) -> dt.datetime | None:
    """The act's instant (its payload's `at`), or None when the payload names none readable."""
    try:
        return catalog.instant("at", payload.get("at")) if isinstance(payload, dict) else None
    except RefusedOp:
        return None


def replay_areas(
    tenant_id: str,
    events: Iterable[AreaEvent],
    *,
    as_of: dt.datetime | None = None,
    refused_journal_seqs: frozenset[int] = frozenset(),
) -> AreaReplay:
    """Replay area events (chain order) whose act instant is at or before `as_of` (all when
    None) through the op catalog, each op checked and then applied as the writer does. A
    refused op's event is `skipped` with the catalog's reason, and so is an event whose payload
    names no readable instant (the writer refuses its op whatever the instant).
    `refused_journal_seqs` are acts whose area ops the writer dead-lettered (from PostgreSQL,
    when at hand): that covers the refusals the catalog reads from other tables than gold.areas
    (a validation refused over simulation-tainted silver rows)."""
    state = TenantState.blank(tenant_id, bodies={}, api_keys={})
    applied = 0
    last: int | None = None
    latest: dt.datetime | None = None
    skipped: list[tuple[int, str]] = []
    for event in events:
        try:
            payload = json.loads(event.payload)
        except ValueError:
            payload = None
        at = _act_instant(payload)
        if at is not None:
            latest = at if latest is None else max(latest, at)
            if as_of is not None and at > as_of:
                continue
        if event.journal_seq in refused_journal_seqs:
            skipped.append((event.journal_seq, "its area op was dead-lettered"))
            continue
        try:
            op = catalog.parse(
                AREA_EVENTS[event.event_type],
                payload,
                seq=event.outbox_seq,
                journal_seq=event.journal_seq,
                tenant_id=tenant_id,
            )
            catalog.check(op, state)
        except RefusedOp as refused:
            skipped.append((event.journal_seq, refused.reason))
            continue
        catalog.apply(op, state)
        applied += 1
        last = event.journal_seq
    areas = {row["workarea_id"]: {c: row[c] for c in AREA_COLUMNS} for row in state.areas.values()}
    return AreaReplay(as_of, areas, applied, last, skipped, latest)


def gold_areas(tc: TenantConnection) -> dict[str, dict[str, Any]]:
    """gold.areas now, by workarea_id, in the replay's columns."""
    return {
        row["workarea_id"]: row
        for row in tc.rows(f"SELECT {', '.join(AREA_COLUMNS)} FROM gold_areas")
    }


def area_differences(
    replayed: dict[str, dict[str, Any]], gold: dict[str, dict[str, Any]]
) -> list[str]:
    """What differs between a replayed tree and gold.areas, one line per node and column."""
    found = []
    for node in sorted(set(replayed) | set(gold)):
        mine, theirs = replayed.get(node), gold.get(node)
        if mine is None or theirs is None:
            found.append(f"{node}: only in {'gold.areas' if mine is None else 'the replay'}")
            continue
        for column in AREA_COLUMNS:
            if mine.get(column) != theirs.get(column):
                found.append(
                    f"{node} {column}: replay {mine.get(column)!r}, gold {theirs.get(column)!r}"
                )
    return found


def refused_area_acts(conn: psycopg.Connection[Any], tenant_id: str) -> frozenset[int]:
    """journal_seqs of the tenant's acts none of whose area ops the writer applied (each one
    dead-lettered and not re-enqueued). An act that also carried a refused copy of a good op
    keeps its place: only acts with no applied area op are left out of a replay."""
    with tenant_scope(conn, tenant_id):
        return frozenset(js for (js,) in conn.execute(queries.REFUSED_AREA_ACTS, (tenant_id,)))
