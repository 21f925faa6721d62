"""What is healthy, decided once: `oml-lake doctor`, `oml-lake reconcile`, `oml-lake
erasure-evidence` and the Dagster checks all read their verdicts from here, so they tell an
operator the same story.

- drain lag: sequenced ops newer than the newest batch the tenant's Delta logs record, and the
  age of the oldest; an operator is needed past a limit;
- open dead letters (neither re-enqueued nor resolved): every one is a failed reconciler check
  (`no_open_dead_letters`) and a doctor problem alike;
- tables whose log is a checkpoint interval or more past its last checkpoint;
- failed reconciler checks, every one, counted the same way everywhere;
- a lost lake: tables the frontier cache records that the lake no longer has;
- the erasure SLO, one verdict (`erasure_verdict`) with its bound and cadence stated:
  **breached** when an erased body is past its deadline (bound + one maintenance cadence) still
  in the lake, an erased row still carries a body, or an erase waits past the deadline;
  **at risk** when a dead-lettered erase waits on an operator, or an erased body is within one
  cadence of its deadline; **holds** otherwise."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

import psycopg

from oml_dagster.lake import queries
from oml_dagster.lake.audit.erasure import (
    DEAD_LETTERED,
    ArtifactEvidence,
    ErasedArtifact,
    ErasureEvidence,
    ErasureState,
    erased_artifacts,
    erasure_evidence,
)
from oml_dagster.lake.audit.reconcile import reconcile
from oml_dagster.lake.model.tables import APP_ID, CHECKPOINT_INTERVAL, TableId
from oml_dagster.lake.policy import DEFAULT_CADENCE, lag
from oml_dagster.lake.queries import tenant_scope
from oml_dagster.lake.store.deltalog import last_checkpoint
from oml_dagster.lake.store.layout import Lake
from oml_dagster.lake.store.reads import tenant_tables

DEFAULT_LAG_LIMIT = dt.timedelta(minutes=15)

HOLDS, AT_RISK, BREACHED = "holds", "at risk", "breached"


def span(delta: dt.timedelta) -> str:
    """A duration as an operator reads it: "7 days", "1 day 6 h", "36 min", "45 s"."""
    seconds = int(delta.total_seconds())
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{days} day{'s' if days != 1 else ''}"] if days else []
    parts += [f"{hours} h"] if hours else []
    parts += [f"{minutes} min"] if minutes else []
    if secs or not parts:
        parts.append(f"{secs} s")
    return " ".join(parts)


@dataclass
class ErasureVerdict:
    """The erasure SLO of one tenant, decided once (module docstring): its state, the bound and
    cadence it was judged by, and one line per breach and per risk."""

    tenant_id: str
    bound: dt.timedelta
    cadence: dt.timedelta
    breaches: list[str] = field(default_factory=list)
    risks: list[str] = field(default_factory=list)
    evidence: ErasureEvidence | None = None
    artifacts: ArtifactEvidence | None = None
    # The erased versions at risk (not yet past their deadline), one per risk line.
    at_risk_versions: list[ErasedArtifact] = field(default_factory=list)

    @property
    def state(self) -> str:
        return BREACHED if self.breaches else AT_RISK if self.risks else HOLDS

    @property
    def deadline(self) -> dt.timedelta:
        return self.bound + self.cadence

    def headline(self) -> str:
        return (
            f"erasure SLO {self.state if self.state == HOLDS else self.state.upper()} (bound "
            f"{span(self.bound)} + cadence {span(self.cadence)}: an erased body leaves the lake "
            f"within {span(self.deadline)} of its erase; {len(self.breaches)} breaches, "
            f"{len(self.risks)} at risk)"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "bound_seconds": self.bound.total_seconds(),
            "cadence_seconds": self.cadence.total_seconds(),
            "breaches": self.breaches,
            "at_risk": self.risks,
        }


def erasure_verdict(
    conn: psycopg.Connection,
    lake: Lake,
    tenant_id: str,
    *,
    cadence: dt.timedelta = DEFAULT_CADENCE,
    now: dt.datetime | None = None,
) -> ErasureVerdict:
    """The tenant's erasure SLO verdict from the table evidence and the per-version evidence,
    read at one instant."""
    state = ErasureState.read(conn, lake, tenant_id)
    evidence = erasure_evidence(conn, lake, tenant_id, cadence=cadence, now=now, state=state)
    artifacts = erased_artifacts(
        conn, lake, tenant_id, cadence=cadence, now=evidence.checked_at, state=state
    )
    verdict = ErasureVerdict(
        tenant_id, evidence.bound, cadence, evidence=evidence, artifacts=artifacts
    )
    for t in evidence.tables:
        if t.erased_rows_with_body:
            verdict.breaches.append(
                f"{t.table}: {t.erased_rows_with_body} erased rows still carry a body"
            )
        if t.overdue_files:
            verdict.breaches.append(
                f"{t.table}: {len(t.overdue_files)} unreferenced data files older than "
                f"{span(evidence.data_deadline)}, e.g. {t.overdue_files[0]}"
            )
        if t.overdue_log_entries:
            verdict.breaches.append(
                f"{t.table}: {len(t.overdue_log_entries)} expired log entries below the last "
                f"checkpoint, e.g. {t.overdue_log_entries[0]}"
            )
    for outbox_id, artifact_id, age in evidence.overdue_pending_erases:
        verdict.breaches.append(
            f"erase of {artifact_id} (outbox row {outbox_id}) waiting {span(dt.timedelta(seconds=age))}"
        )
    overdue = {(a.artifact_id, a.version) for a in artifacts.overdue}
    for a in artifacts.overdue:
        verdict.breaches.append(
            f"erasure of {a.artifact_id} v{a.version} ({a.status}) past its deadline "
            f"{a.deadline:%Y-%m-%dT%H:%M:%SZ}: {len(a.copies)} copies left"
        )
    for a in artifacts.at_risk():
        if (a.artifact_id, a.version) in overdue:
            continue
        why = (
            "dead-lettered: a breach in progress, waits on an operator"
            if a.status == DEAD_LETTERED
            else a.status
        )
        verdict.at_risk_versions.append(a)
        verdict.risks.append(
            f"erasure of {a.artifact_id} v{a.version} ({why}) at risk: deadline "
            f"{a.deadline:%Y-%m-%dT%H:%M:%SZ}, {len(a.copies)} copies left"
        )
    return verdict


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
    erasure: ErasureVerdict | None = None
    lost_tables: list[str] = field(default_factory=list)
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
        if self.lost_tables:
            out.append(
                f"a lost lake: {len(self.lost_tables)} tables the frontier records are missing "
                f"({', '.join(self.lost_tables)}): backfill the tenant"
            )
        for table, behind in self.checkpoint_overdue:
            out.append(f"{table}: {behind} versions since its last checkpoint")
        for name, count, first in self.failed_checks:
            out.append(f"check {name} failed: {count} findings, e.g. {first}")
        if self.erasure is not None:
            out.extend(f"erasure SLO breached: {line}" for line in self.erasure.breaches)
            out.extend(line for line in self.erasure.risks)
        return out

    @property
    def healthy(self) -> bool:
        return not self.problems

    @property
    def erasures_at_risk(self) -> list[ErasedArtifact]:
        return self.erasure.at_risk_versions if self.erasure else []

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
            "lost_tables": self.lost_tables,
            "erasure": self.erasure.as_dict() if self.erasure else None,
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


def lost_tables(conn: psycopg.Connection, lake: Lake, tenant_id: str) -> list[str]:
    """The tenant's tables that the frontier cache says were committed to (a txn above 0) and
    the lake no longer has: a lost lake, or a part of one. Empty for a tenant never drained."""
    present = {t.table for t in tenant_tables(lake, tenant_id)}
    with tenant_scope(conn, tenant_id):
        frontier = conn.execute(queries.FRONTIER_VERSIONS, (tenant_id,)).fetchall()
    return sorted(name for name, txn, _ in frontier if txn and TableId.parse(name) not in present)


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
    for table_id, _, uri in tenant_tables(lake, tenant_id):
        table = lake.open(uri)
        if table is None:
            continue
        txns.append(table.transaction_version(APP_ID) or 0)
        checkpoint = last_checkpoint(lake.filesystem(uri))
        behind = table.version() - (checkpoint if checkpoint is not None else -1)
        if behind >= checkpoint_interval:
            health.checkpoint_overdue.append((str(table_id), behind))
    # Drained through the newest batch any table recorded (every batch appends to bronze; a
    # table with nothing to change may lag its txn on purpose). A missing lake: through 0.
    drained_through = max(txns) if txns else 0
    health.lag_ops, health.lag_seconds = lag(conn, tenant_id, drained_through)
    with tenant_scope(conn, tenant_id):
        counts = conn.execute(queries.OPEN_DEAD_LETTER_COUNTS, (tenant_id,)).fetchone()
    health.dead_letters, health.dead_lettered_erases = counts or (0, 0)  # one row: an aggregate
    # Every failed reconciler check, open dead letters included: the count `reconcile` shows.
    for result in reconcile(conn, lake, tenant_id).failed():
        health.failed_checks.append(
            (f"{result.table}/{result.name}", len(result.findings), result.samples(1)[0])
        )
    health.lost_tables = lost_tables(conn, lake, tenant_id)
    health.erasure = erasure_verdict(conn, lake, tenant_id, cadence=cadence, now=now)
    return health
