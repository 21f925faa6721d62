"""Dead letters (DESIGN §2): ops the writer refused, keyed by seq so a replay or an overlapping
writer records each once; listing them, re-enqueueing one after an operator's fix, and resolving one that is wrong for good
(kept for audit, no longer an open finding)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from oml_dagster.lake import queries
from oml_dagster.lake.errors import RequeueError
from oml_dagster.lake.queries import TenantSession, cross_scope, tenant_scope


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
    resolved_at: Any = None
    resolved_by: str | None = None
    resolution: str | None = None


def record(
    session: TenantSession,
    *,
    seq: int,
    journal_seq: int,
    op: str,
    payload: Any,
    reason: str,
) -> None:
    """Record a refusal in the tenant's session (the writer records a batch's refusals and its
    verdict in one transaction)."""
    session.execute(
        queries.DEAD_LETTER_INSERT,
        (seq, session.tenant_id, journal_seq, op, Jsonb(payload), reason),
    )


def refused_seqs(
    conn: psycopg.Connection, tenant_id: str, after: int, through: int
) -> dict[int, str]:
    if through <= after:
        return {}
    with tenant_scope(conn, tenant_id):
        rows = conn.execute(queries.REFUSED_IN, (tenant_id, after, through)).fetchall()
    return dict(rows)


def list_dead_letters(
    conn: psycopg.Connection, tenant_id: str | None = None, include_requeued: bool = False
) -> list[DeadLetter]:
    """One tenant's dead letters (in its scope), or every tenant's (the cross-tenant scope)."""
    query = queries.DEAD_LETTERS_LIST
    params: list[Any] = []
    if tenant_id:
        query += queries.DEAD_LETTERS_OF_TENANT
        params.append(tenant_id)
    if not include_requeued:
        query += queries.DEAD_LETTERS_OPEN
    with tenant_scope(conn, tenant_id) if tenant_id else cross_scope(conn):
        rows = conn.execute(query + queries.DEAD_LETTERS_ORDER, params).fetchall()
    return [DeadLetter(*row) for row in rows]


def _tenant_of(conn: psycopg.Connection, seq: int) -> str:
    """The tenant dead letter `seq` belongs to (`RequeueError` when there is none): the one
    cross-tenant read before a requeue or a resolution runs in that tenant's scope."""
    with cross_scope(conn):
        row = conn.execute(queries.DEAD_LETTER_TENANT, (seq,)).fetchone()
    if row is None:
        raise RequeueError(f"no dead letter with seq {seq}")
    return str(row[0])


def _lock_open(conn: psycopg.Connection, seq: int) -> tuple[str, str, Any]:
    """Lock dead letter `seq` for a requeue or a resolution and return (tenant_id, op, payload);
    refused (`RequeueError`) when there is none or it is closed already."""
    row = conn.execute(queries.DEAD_LETTER_FOR_REQUEUE, (seq,)).fetchone()
    if row is None:
        raise RequeueError(f"no dead letter with seq {seq}")
    tenant_id, op, stored, requeued_at, resolved_at = row
    if requeued_at is not None:
        raise RequeueError(f"dead letter {seq} was already re-enqueued at {requeued_at}")
    if resolved_at is not None:
        raise RequeueError(
            f"dead letter {seq} was resolved at {resolved_at}: already resolved, nothing to do"
        )
    return tenant_id, op, stored


def requeue(conn: psycopg.Connection, seq: int, by: str, payload: Any = None) -> int:
    """Re-enqueue dead letter `seq` as a new outbox row (the same op, its payload or a corrected
    one) at the tenant's last sequenced journal_seq, so it applies after everything already
    sequenced. Returns the new outbox id."""
    with tenant_scope(conn, _tenant_of(conn, seq)):
        tenant_id, op, stored = _lock_open(conn, seq)
        last = queries.scalar(conn.execute(queries.LAST_JOURNAL_SEQ, (tenant_id,)))
        new_id = int(
            queries.scalar(
                conn.execute(
                    queries.REQUEUE_INTO_OUTBOX,
                    (tenant_id, last, op, Jsonb(stored if payload is None else payload)),
                )
            )
        )
        conn.execute(
            queries.MARK_REQUEUED,
            (by, new_id, seq),
        )
    return new_id


def resolve(conn: psycopg.Connection, seq: int, by: str, reason: str) -> Any:
    """Close dead letter `seq` for good: who and why are recorded beside it (`list --all` shows
    them), it is no longer an open finding, and the op stays refused. Returns when it was
    resolved. One already re-enqueued or resolved is refused (`RequeueError`)."""
    reason, by = reason.strip(), by.strip()
    if not reason:
        raise RequeueError(f"resolving dead letter {seq} needs a reason (--reason)")
    if not by:
        raise RequeueError(f"resolving dead letter {seq} needs a name (--by)")
    with tenant_scope(conn, _tenant_of(conn, seq)):
        _lock_open(conn, seq)
        return queries.scalar(conn.execute(queries.MARK_RESOLVED, (by, reason, seq)))
