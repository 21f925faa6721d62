"""Dead letters (DESIGN §2): ops the writer refused, keyed by seq so a replay or an overlapping
writer records each once; listing them and re-enqueueing one after an operator's fix."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from .errors import RequeueError


@dataclass(frozen=True)
class DeadLetter:
    seq: int
    tenant_id: str
    journal_seq: int
    op: str
    payload: Any
    reason: str
    refused_at: Any
    requeued_at: Any
    requeued_by: str | None
    requeued_id: int | None


def record(conn, seq, tenant_id, journal_seq, op, payload, reason) -> None:
    conn.execute(
        "INSERT INTO oml.lake_dead_letter (seq, tenant_id, journal_seq, op, payload, reason)"
        " VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (seq) DO NOTHING",
        (seq, tenant_id, journal_seq, op, Jsonb(payload), reason),
    )


def refused_seqs(
    conn: psycopg.Connection, tenant_id: str, after: int, through: int
) -> dict[int, str]:
    if through <= after:
        return {}
    rows = conn.execute(
        "SELECT seq, reason FROM oml.lake_dead_letter"
        " WHERE tenant_id = %s AND seq > %s AND seq <= %s",
        (tenant_id, after, through),
    ).fetchall()
    return dict(rows)


def list_dead_letters(
    conn: psycopg.Connection, tenant_id: str | None = None, include_requeued: bool = False
) -> list[DeadLetter]:
    query = (
        "SELECT seq, tenant_id::text, journal_seq, op, payload, reason, refused_at,"
        " requeued_at, requeued_by, requeued_id FROM oml.lake_dead_letter WHERE true"
    )
    params: list[Any] = []
    if tenant_id:
        query += " AND tenant_id = %s"
        params.append(tenant_id)
    if not include_requeued:
        query += " AND requeued_at IS NULL"
    return [DeadLetter(*row) for row in conn.execute(query + " ORDER BY seq", params)]


def requeue(conn: psycopg.Connection, seq: int, by: str, payload: Any = None) -> int:
    """Re-enqueue dead letter `seq` as a new outbox row (the same op, its payload or a corrected
    one) at the tenant's last sequenced journal_seq, so it applies after everything already
    sequenced. Returns the new outbox id."""
    with conn.transaction():
        row = conn.execute(
            "SELECT tenant_id, op, payload, requeued_at FROM oml.lake_dead_letter"
            " WHERE seq = %s FOR UPDATE",
            (seq,),
        ).fetchone()
        if row is None:
            raise RequeueError(f"no dead letter with seq {seq}")
        tenant_id, op, stored, requeued_at = row
        if requeued_at is not None:
            raise RequeueError(f"dead letter {seq} was already re-enqueued at {requeued_at}")
        last = conn.execute(
            "SELECT last_journal_seq FROM oml.sequencer_tenant WHERE tenant_id = %s", (tenant_id,)
        ).fetchone()
        new_id = conn.execute(
            "INSERT INTO oml.outbox (tenant_id, journal_seq, op, payload)"
            " VALUES (%s, %s, %s, %s) RETURNING id",
            (tenant_id, last[0], op, Jsonb(stored if payload is None else payload)),
        ).fetchone()[0]
        conn.execute(
            "UPDATE oml.lake_dead_letter SET requeued_at = now(), requeued_by = %s,"
            " requeued_id = %s WHERE seq = %s",
            (by, new_id, seq),
        )
    return new_id
