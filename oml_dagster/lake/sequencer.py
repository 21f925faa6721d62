"""The stable-prefix cut (DESIGN §2): assigns the global, gap-free `seq` to each tenant's
contiguous run of visible outbox rows, in one transaction under an advisory lock.

A tenant's acts commit in `journal_seq` order (the chain head lock), so a tenant's rows are
ordered by (journal_seq, id) and never by xid, insert order or identity values, none of which
follows commit order. Rows at or below the tenant's last sequenced journal_seq (another row of an
act already sequenced, or a re-enqueued op) or at the next position continue the run; a gap means
an act not yet visible, and that tenant's rows behind it wait (reported, never skipped).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

import psycopg

from . import queries


@dataclass
class TenantCut:
    tenant_id: str
    sequenced: int = 0
    first_seq: int | None = None
    last_seq: int | None = None
    last_journal_seq: int | None = None


@dataclass
class Gap:
    """Rows of a tenant waiting behind a journal position not yet visible."""

    tenant_id: str
    waiting_rows: int
    missing_journal_seq: int
    oldest_waiting: dt.datetime
    age_seconds: float


@dataclass
class SequencerReport:
    tenants: dict[str, TenantCut] = field(default_factory=dict)
    gaps: list[Gap] = field(default_factory=list)
    # Rows that could be sequenced but were left for the next pass by the per-pass limit.
    deferred_rows: int = 0

    @property
    def sequenced(self) -> int:
        return sum(t.sequenced for t in self.tenants.values())


def sequence(conn: psycopg.Connection, limit: int = 100_000) -> SequencerReport:
    """Run one cut; commits its own transaction."""
    report = SequencerReport()
    with conn.transaction():
        conn.execute(queries.ADVISORY_XACT_LOCK, (queries.SEQUENCER_LOCK,))
        # The statement's snapshot is taken after the lock: it sees every earlier cut's seqs.
        start = conn.execute(queries.MAX_SEQ).fetchone()[0]
        assigned = conn.execute(
            queries.SEQUENCE_ASSIGN, {"limit": limit, "start": start}
        ).fetchall()
        for tenant_id, journal_seq, seq in assigned:
            cut = report.tenants.setdefault(tenant_id, TenantCut(tenant_id))
            cut.sequenced += 1
            cut.first_seq = seq if cut.first_seq is None else min(cut.first_seq, seq)
            cut.last_seq = seq if cut.last_seq is None else max(cut.last_seq, seq)
            cut.last_journal_seq = max(cut.last_journal_seq or 0, journal_seq)
        for cut in report.tenants.values():
            conn.execute(
                queries.SEQUENCER_TENANT_UPSERT,
                (cut.tenant_id, cut.last_journal_seq, cut.last_seq),
            )
        now = conn.execute(queries.CLOCK).fetchone()[0]
        for tenant_id, count, min_journal, oldest, last_journal in conn.execute(
            queries.UNSEQUENCED_BY_TENANT
        ):
            if last_journal is not None and min_journal > last_journal + 1:
                report.gaps.append(
                    Gap(tenant_id, count, last_journal + 1, oldest, (now - oldest).total_seconds())
                )
            else:
                report.deferred_rows += count
    return report


def pending_tenants(
    conn: psycopg.Connection, tenant_ids: list[str] | None = None
) -> list[tuple[str, int, int]]:
    """Tenants with sequenced ops beyond what the frontier cache says is drained, as
    (tenant_id, last_seq, drained_through). One aggregate query, whatever the tenant count."""
    query = queries.PENDING_TENANTS
    params: list = []
    if tenant_ids:
        query += queries.PENDING_TENANTS_OF
        params.append(tenant_ids)
    return [tuple(r) for r in conn.execute(query + queries.PENDING_TENANTS_ORDER, params)]
