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
from typing import Any

import psycopg

from oml_dagster.lake import queries
from oml_dagster.lake.queries import cross_scope

# The most rows one cut numbers, shared by the tenants' quotas (`quotas`): a drain pass's cuts,
# the sensor's and the drain's cut ahead take this many at a time.
CUT_LIMIT = 100_000


def quotas(pending: dict[str, int], limit: int) -> dict[str, int]:
    """How many of each tenant's pending rows a cut of at most `limit` reads: fair shares,
    a tenant with fewer rows than its share leaving the rest to the others (the fewest first,
    then by tenant id). Each tenant gets at least one row while the limit lasts."""
    left, out = limit, {}
    ordered = sorted(pending.items(), key=lambda item: (item[1], item[0]))
    for i, (tenant_id, count) in enumerate(ordered):
        take = min(count, max(left // (len(ordered) - i), 1), left)
        if take > 0:
            out[tenant_id] = take
            left -= take
    return out


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

    def then(self, later: SequencerReport) -> SequencerReport:
        """This cut and a later one as one: rows cut by either, gaps and deferral as of the
        later."""
        merged = SequencerReport(gaps=later.gaps, deferred_rows=later.deferred_rows)
        for tenant_id in {*self.tenants, *later.tenants}:
            cuts = [r.tenants[tenant_id] for r in (self, later) if tenant_id in r.tenants]
            firsts = [c.first_seq for c in cuts if c.first_seq is not None]
            lasts = [c.last_seq for c in cuts if c.last_seq is not None]
            journals = [c.last_journal_seq for c in cuts if c.last_journal_seq is not None]
            merged.tenants[tenant_id] = TenantCut(
                tenant_id,
                sum(c.sequenced for c in cuts),
                min(firsts, default=None),
                max(lasts, default=None),
                max(journals, default=None),
            )
        return merged


def sequence(conn: psycopg.Connection, limit: int | None = None) -> SequencerReport:
    """Run one cut of at most `limit` rows (CUT_LIMIT); commits its own transaction."""
    with cross_scope(conn):
        report, _ = cut_in_transaction(conn, CUT_LIMIT if limit is None else limit, None)
        _count_waiting(conn, report)
    return report


def cut_in_transaction(
    conn: psycopg.Connection, limit: int, pending: dict[str, int] | None
) -> tuple[SequencerReport, dict[str, int]]:
    """One cut, in the caller's transaction, sharing `limit` by `pending` (each tenant's
    unsequenced rows, counted here when None). Returns the cut (rows left waiting not counted)
    and the pending rows it shared."""
    report = SequencerReport()
    conn.execute(queries.ADVISORY_XACT_LOCK, (queries.SEQUENCER_LOCK,))
    conn.execute(queries.CUT_SETTINGS)
    # The statement's snapshot is taken after the lock: it sees every earlier cut's seqs.
    start = queries.scalar(conn.execute(queries.MAX_SEQ))
    if pending is None:
        pending = (
            dict(conn.execute(queries.SEQUENCE_PENDING).fetchall())
            if _any_unsequenced(conn)
            else {}
        )
    shares = quotas(pending, limit)
    params = {
        "tenants": list(shares),
        "quotas": list(shares.values()),
        "start": start,
    }
    for tenant_id, count, first_seq, last_seq, last_journal_seq in (
        _assign(conn, params) if shares else []
    ):
        report.tenants[tenant_id] = TenantCut(
            tenant_id, count, first_seq, last_seq, last_journal_seq
        )
    if report.tenants:
        cuts = list(report.tenants.values())
        conn.execute(
            queries.SEQUENCER_TENANT_UPSERT,
            (
                [c.tenant_id for c in cuts],
                [c.last_journal_seq for c in cuts],
                [c.last_seq for c in cuts],
            ),
        )
    return report, pending


def _assign(
    conn: psycopg.Connection, params: dict[str, Any]
) -> list[tuple[str, int, int, int, int]]:
    """Numbers the cut's rows, each found by its primary key (queries.INDEX_JOINS_ONLY says
    why). Per tenant: (tenant_id, rows, first seq, last seq, last journal_seq)."""
    conn.execute(queries.INDEX_JOINS_ONLY)
    assigned = conn.execute(queries.SEQUENCE_ASSIGN, params).fetchall()
    conn.execute(queries.ANY_JOINS)  # a failed statement rolls back the SET LOCAL with the rest
    return assigned


def _any_unsequenced(conn: psycopg.Connection) -> bool:
    """Whether any outbox row is unsequenced (queries.ANY_UNSEQUENCED says why it is asked)."""
    return conn.execute(queries.ANY_UNSEQUENCED).fetchone() is not None


def _count_waiting(conn: psycopg.Connection, report: SequencerReport) -> None:
    """The rows still unsequenced, into `report`: behind a gap, or deferred to a later cut."""
    if not _any_unsequenced(conn):
        return
    now = queries.scalar(conn.execute(queries.CLOCK))
    for tenant_id, count, min_journal, oldest, last_journal in conn.execute(
        queries.UNSEQUENCED_BY_TENANT
    ):
        if last_journal is not None and min_journal > last_journal + 1:
            report.gaps.append(
                Gap(tenant_id, count, last_journal + 1, oldest, (now - oldest).total_seconds())
            )
        else:
            report.deferred_rows += count


# A drain pass cuts again while rows were left for later and its cuts hold less than a full
# batch per tenant cut, up to this many cuts (a backlog of 20 tenants takes ten 100,000-row cuts
# to give each a batch of 50,000 instead of ten batches of 5,000).
MOST_CUTS_PER_PASS = 10


def sequence_for_batches(
    conn: psycopg.Connection, max_batch: int, limit: int | None = None
) -> SequencerReport:
    """Cuts until nothing is left to cut, the cuts hold `max_batch` rows for each tenant they
    cut, or MOST_CUTS_PER_PASS cuts are done; one report for all of them. Each cut is its own
    transaction, so a pass over a long backlog drains full batches rather than one slice of
    each tenant per cut. Only the first cut counts each tenant's unsequenced rows, and only the
    last counts the rows it leaves waiting: both aggregates read every unsequenced row, which
    over a backlog of a million rows cost more than the cut itself (bench/RESULTS.md, 3 Dec).
    A later cut shares its limit by the first count less what the cuts took; rows arriving
    meanwhile wait for the next pass's cut."""
    limit = CUT_LIMIT if limit is None else limit
    report = SequencerReport()
    pending: dict[str, int] | None = None
    for n in range(MOST_CUTS_PER_PASS):
        with cross_scope(conn):
            cut, pending = cut_in_transaction(conn, limit, pending)
            report = report.then(cut)
            pending = {
                t: left
                for t, count in pending.items()
                if (left := count - (cut.tenants[t].sequenced if t in cut.tenants else 0)) > 0
            }
            done = (
                n + 1 == MOST_CUTS_PER_PASS
                or not cut.sequenced
                or not pending
                or report.sequenced >= max_batch * len(report.tenants)
            )
            if done:
                _count_waiting(conn, report)
        if done:
            break
    return report


def pending_tenants(
    conn: psycopg.Connection, tenant_ids: list[str] | None = None
) -> list[tuple[str, int, int]]:
    """Tenants with sequenced ops beyond what the frontier cache says is drained, as
    (tenant_id, last_seq, drained_through). One aggregate query, whatever the tenant count."""
    query = queries.PENDING_TENANTS
    params: list[Any] = []
    if tenant_ids:
        query += queries.PENDING_TENANTS_OF
        params.append(tenant_ids)
    with cross_scope(conn):
        return [tuple(r) for r in conn.execute(query + queries.PENDING_TENANTS_ORDER, params)]
