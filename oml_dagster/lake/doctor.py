"""`oml-lake doctor`: one screen per tenant of what needs an operator — drain lag (sequenced ops
newer than the newest batch the tenant's Delta logs record, and the age of the oldest; an operator
is needed past a limit), open dead letters,
tables whose log is a checkpoint interval or more past its last checkpoint, failed reconciler
checks, and erasure deadlines at risk (a dead-lettered erase, or an erased body still in the lake
or an erase still waiting within one maintenance cadence of its deadline)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

import psycopg

from . import queries
from .deltalog import last_checkpoint
from .erasure import DEFAULT_CADENCE, ErasedArtifact, erased_artifacts
from .policy import lag
from .reconcile import DEAD_LETTERS, reconcile
from .storage import Lake, tenant_tables
from .tables import APP_ID, CHECKPOINT_INTERVAL

DEFAULT_LAG_LIMIT = dt.timedelta(minutes=15)


@dataclass
class TenantHealth:
    tenant_id: str
    lag_ops: int = 0
    lag_seconds: float = 0.0
    dead_letters: int = 0
    dead_lettered_erases: int = 0
    # (table, versions since its last checkpoint)
    checkpoint_overdue: list[tuple[str, int]] = field(default_factory=list)
    # (table/check, findings, first finding)
    failed_checks: list[tuple[str, int, str]] = field(default_factory=list)
    erasures_at_risk: list[ErasedArtifact] = field(default_factory=list)
    lag_limit: dt.timedelta = DEFAULT_LAG_LIMIT

    @property
    def problems(self) -> list[str]:
        """What needs an operator, one line each (empty when nothing does)."""
        out = []
        if self.lag_seconds > self.lag_limit.total_seconds():
            out.append(
                f"drain lag {self.lag_ops} ops, {self.lag_seconds:.0f}s (limit "
                f"{self.lag_limit.total_seconds():.0f}s)"
            )
        if self.dead_letters:
            out.append(
                f"{self.dead_letters} open dead letters ({self.dead_lettered_erases} erases)"
            )
        for table, behind in self.checkpoint_overdue:
            out.append(f"{table}: {behind} versions since its last checkpoint")
        for name, count, first in self.failed_checks:
            out.append(f"check {name} failed: {count} findings, e.g. {first}")
        for a in self.erasures_at_risk:
            out.append(
                f"erasure of {a.artifact_id} v{a.version} ({a.status}) at risk: deadline "
                f"{a.deadline:%Y-%m-%dT%H:%M:%SZ}, {len(a.copies)} copies left"
            )
        return out

    @property
    def healthy(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict[str, Any]:
        return {
            "tenant_id": self.tenant_id,
            "healthy": self.healthy,  # no problems (below)
            "lag_ops": self.lag_ops,
            "lag_seconds": self.lag_seconds,
            "dead_letters": self.dead_letters,
            "dead_lettered_erases": self.dead_lettered_erases,
            "checkpoint_overdue": [{"table": t, "versions": v} for t, v in self.checkpoint_overdue],
            "failed_checks": [
                {"check": n, "findings": c, "first": f} for n, c, f in self.failed_checks
            ],
            "erasures_at_risk": [a.as_dict() for a in self.erasures_at_risk],
            "problems": self.problems,
        }


def drained_through(lake: Lake, tenant_id: str) -> int:
    """The newest batch end any of the tenant's tables records (every batch appends to bronze; a
    table with nothing to change may lag its txn on purpose); 0 for a tenant with no lake."""
    txns = []
    for _, _, uri in tenant_tables(lake, tenant_id):
        table = lake.open(uri)
        if table is not None:
            txns.append(table.transaction_version(APP_ID) or 0)
    return max(txns, default=0)


def examine(
    conn: psycopg.Connection,
    lake: Lake,
    tenant_id: str,
    *,
    cadence: dt.timedelta = DEFAULT_CADENCE,
    lag_limit: dt.timedelta = DEFAULT_LAG_LIMIT,
    checkpoint_interval: int = CHECKPOINT_INTERVAL,
    now: dt.datetime | None = None,
) -> TenantHealth:
    now = now or dt.datetime.now(dt.UTC)
    health = TenantHealth(tenant_id, lag_limit=lag_limit)
    txns = []
    for name, _, uri in tenant_tables(lake, tenant_id):
        table = lake.open(uri)
        if table is None:
            continue
        txns.append(table.transaction_version(APP_ID) or 0)
        checkpoint = last_checkpoint(lake.filesystem(uri))
        behind = table.version() - (checkpoint if checkpoint is not None else -1)
        if behind >= checkpoint_interval:
            health.checkpoint_overdue.append((name, behind))
    # Drained through the newest batch any table recorded (every batch appends to bronze; a
    # table with nothing to change may lag its txn on purpose). A missing lake: through 0.
    drained_through = max(txns) if txns else 0
    health.lag_ops, health.lag_seconds = lag(conn, tenant_id, drained_through)
    health.dead_letters, health.dead_lettered_erases = conn.execute(
        queries.OPEN_DEAD_LETTER_COUNTS,
        (tenant_id,),
    ).fetchone()
    for result in reconcile(conn, lake, tenant_id).failed():
        if result.name == DEAD_LETTERS:
            continue  # counted above
        health.failed_checks.append(
            (f"{result.table}/{result.name}", len(result.findings), result.samples(1)[0])
        )
    evidence = erased_artifacts(conn, lake, tenant_id, cadence=cadence, now=now)
    health.erasures_at_risk = evidence.at_risk()
    return health
