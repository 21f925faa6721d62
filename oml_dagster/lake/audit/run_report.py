"""What one writer run did to one tenant's tables over its batches, as numbers an operator plots
over time: the run's bounds, the ops it read and those new to the lake (applied or
dead-lettered), each kind of table's commits, where each table stands after the run and how far
its txn version lags the sequenced outbox, and how far the tenant still lags (the number the
freshness check judges). The Dagster layer shows it as each lake asset's materialization; the
core computes it, from the batches' results and PostgreSQL."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import psycopg

from oml_dagster.lake import queries
from oml_dagster.lake.audit.freshness import tenant_lag
from oml_dagster.lake.model.tables import CORE_TABLES, GOLD_CURATED, TableId, TableSpec
from oml_dagster.lake.policy import lag
from oml_dagster.lake.queries import tenant_scope
from oml_dagster.lake.write import deadletter
from oml_dagster.lake.write.writer import BatchResult, TableOutcome

# Every kind of table a run reports on: the core tables and the curated ones.
REPORTED: tuple[TableSpec, ...] = (*CORE_TABLES, GOLD_CURATED)


@dataclass(frozen=True)
class TableReport:
    """One kind of table (`spec`; the curated tables together) over one run. `versions`: the
    Delta version of each of the tenant's tables of that kind after the run, by workarea id
    (None for a core table); `txn_version` the least of their txn versions and `lag_ops`,
    `lag_seconds` how far it lags the sequenced outbox (all None while no such table exists)."""

    spec: TableSpec
    rows_written: int
    rows_added: int
    rows_updated: int
    commit_attempts: int
    action: str
    versions: dict[str | None, int | None]
    txn_version: int | None = None
    lag_ops: int | None = None
    lag_seconds: float | None = None


@dataclass(frozen=True)
class RunReport:
    """One run of one tenant (at least one batch). `batches` counts the batches that read ops
    (a drain's last, empty look for more is not one); `ops_new` the ops above the most advanced
    table when the run's earliest batch began, `ops_dead_lettered` those of them refused (a
    verdict recorded by an earlier run of the same ops counts too: a replay reuses it)."""

    tenant_id: str
    batch_start: int
    batch_end: int
    batches: int
    ops_in_batch: int
    ops_new: int
    ops_dead_lettered: int
    drain_lag_seconds: float
    drain_lag_ops: int
    tables: dict[str, TableReport]  # by spec name

    @property
    def ops_applied(self) -> int:
        return self.ops_new - self.ops_dead_lettered

    def run_numbers(self) -> dict[str, Any]:
        """The numbers every table of the run shares."""
        return {
            "batch_start": self.batch_start,
            "batch_end": self.batch_end,
            "batches": self.batches,
            "ops_in_batch": self.ops_in_batch,
            "ops_new": self.ops_new,
            "ops_applied": self.ops_applied,
            "ops_dead_lettered": self.ops_dead_lettered,
        }


def run_report(conn: psycopg.Connection[Any], results: Sequence[BatchResult]) -> RunReport:
    """The report of the run whose batches gave `results` (all of one tenant, at least one)."""
    first, last = results[0], results[-1]
    tenant_id = first.tenant_id
    # A batch starts at the least advanced table, so it may re-read ops other tables hold
    # already (ADR 0002); the ops above the most advanced table are the ones new to the lake.
    # A replay after a loss finds every table gone: all its ops are new again. Over a run, the
    # new ops start where its earliest batch found the most advanced table.
    new_from = min(max((t.txn_before for t in r.tables), default=r.batch_end) for r in results)
    new_ops = 0
    with tenant_scope(conn, tenant_id):
        if new_from < last.batch_end:
            new_ops = queries.ops_in(conn, tenant_id, new_from, last.batch_end)
        # Where every table stands after the run (the run has just refreshed this cache).
        frontier = {
            TableId.parse(name): state
            for name, state in queries.frontier_versions(conn, tenant_id).items()
        }
    refused = len(deadletter.refused_seqs(conn, tenant_id, new_from, last.batch_end))
    # The tenant's lag after the run: a table's own lag counts from its txn version, which an
    # idle table (no op of its kind) keeps for up to txn_lag_limit ops, drained or not.
    behind = tenant_lag(conn, tenant_id)
    outcomes = [t for r in results for t in r.tables]
    return RunReport(
        tenant_id=tenant_id,
        batch_start=first.batch_start,
        batch_end=last.batch_end,
        batches=sum(1 for r in results if r.ops),
        ops_in_batch=sum(r.ops for r in results),
        ops_new=new_ops,
        ops_dead_lettered=refused,
        drain_lag_seconds=float(behind.seconds) if behind else 0.0,
        drain_lag_ops=(behind.ops_waiting + behind.ops_unsequenced) if behind else 0,
        tables={
            spec.name: _table_report(conn, tenant_id, spec, outcomes, frontier) for spec in REPORTED
        },
    )


def _table_report(
    conn: psycopg.Connection[Any],
    tenant_id: str,
    spec: TableSpec,
    outcomes: list[TableOutcome],
    frontier: Mapping[TableId, tuple[int, int | None]],
) -> TableReport:
    mine = [t for t in outcomes if t.table.spec_name == spec.name]
    standing = {
        table.workarea_id: state
        for table, state in frontier.items()
        if table.spec_name == spec.name
    }
    actions = sorted({t.action for t in mine})
    report = TableReport(
        spec=spec,
        rows_written=sum(t.rows for t in mine),
        rows_added=sum(t.rows_added for t in mine),
        rows_updated=sum(t.rows_updated for t in mine),
        commit_attempts=sum(t.attempts for t in mine),
        action="+".join(actions) if actions else "nothing pending",
        versions={
            workarea: version
            for workarea, (_, version) in sorted(standing.items(), key=lambda kv: kv[0] or "")
        },
    )
    if not standing:
        return report
    txn = min(t for t, _ in standing.values())
    lag_ops, lag_seconds = lag(conn, tenant_id, txn)
    return replace(report, txn_version=txn, lag_ops=lag_ops, lag_seconds=lag_seconds)
