"""Lake maintenance (spec: "Maintenance" and "The erasure-SLO interaction"): bin-pack and Z-order
OPTIMIZE, checkpoints, VACUUM and log cleanup, per tenant, over every table `tenant_tables` finds.

What this module decides:
- Retention is the tenant's `lake_erasure_bound` (oml.tenant_policy), applied through the table
  properties `delta.deletedFileRetentionDuration` and `delta.logRetentionDuration` (delta-rs
  honours them to the second; `retention_hours` only takes whole hours). Every step that
  expires anything (checkpoint, VACUUM, log cleanup) first brings the properties back to the
  spec's configuration for the current bound, so a policy change reaches the tables at the
  next run.
- VACUUM always lists the whole table (`full=True`): tombstoned files and orphans left by failed
  or killed commits both go once older than the bound. Every file the log references must still
  be there afterwards, or the run fails loudly.
- delta-rs deletes a log entry only below a checkpoint at or before the oldest version still
  inside the bound (every version inside the bound stays readable). So the checkpoint step also
  writes a checkpoint whenever commits after the last one have already expired, and it runs
  before VACUUM: a checkpoint above VACUUM's two fresh commits could release nothing until the
  next run.
- OPTIMIZE commits carry no app transaction (delta-rs drops them); the writer's skip rule reads
  `transaction_version`, which is the last txn recorded in the log or its checkpoint, so commits
  without one leave it where it was. Every rewrite passes the writer's Parquet settings again,
  or footer statistics of `body_ciphertext` would come back.
- Maintenance of a tenant never runs next to a Dagster drain of that tenant: both are runs of the
  same tenant partition under the per-tenant run limit (DESIGN §4), and shard runs leave a
  tenant alone while such a run holds it. Rewrites (bin-pack, Z-order) also take the table's
  rewrite lock in Postgres (`rewrite_lock`), which the writer's packing on the way takes too:
  two OPTIMIZEs of the same files would both commit and double the rows (ADR 0033).

Why one file: the maintenance operations share one loop over a tenant's tables, one lock per
table rewrite and one result record, and the erasure SLO reads their order (checkpoint,
VACUUM, log cleanup) as a whole.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

import psycopg
from deltalake import DeltaTable, PostCommitHookProperties

from oml_dagster.lake.errors import MaintenanceDamage
from oml_dagster.lake.model.tables import (
    APP_ID,
    CHECKPOINT_INTERVAL,
    TableId,
    TableSpec,
    writer_properties,
)
from oml_dagster.lake.policy import erasure_bound
from oml_dagster.lake.store.deltalog import Listing, commit_name, list_files, live_files
from oml_dagster.lake.store.layout import Lake
from oml_dagster.lake.store.reads import tenant_tables
from oml_dagster.lake.store.rewrites import maintenance_commit, rewrite_lock

# One maintenance step on one table.
Operation = Literal["compact", "zorder", "checkpoint", "vacuum", "log-cleanup", "properties"]
COMPACT: Operation = "compact"
ZORDER: Operation = "zorder"
CHECKPOINT: Operation = "checkpoint"
VACUUM: Operation = "vacuum"
LOG_CLEANUP: Operation = "log-cleanup"
PROPERTIES: Operation = "properties"
# What a step did: it changed the table, or left it `unchanged`, or was `skipped`.
Action = Literal[
    "rewrote", "checkpointed", "vacuumed", "cleaned", "updated", "unchanged", "skipped"
]

# What one `oml-lake maintain <task>` (or one scheduled job) runs, in order.
Task = Literal["compact", "zorder", "checkpoint", "vacuum", "all"]
TASKS: dict[Task, tuple[Operation, ...]] = {
    "compact": (COMPACT,),
    "zorder": (ZORDER,),
    "checkpoint": (CHECKPOINT,),
    "vacuum": (CHECKPOINT, VACUUM, LOG_CLEANUP),
    "all": (COMPACT, ZORDER, CHECKPOINT, VACUUM, LOG_CLEANUP),
}


@dataclass(frozen=True)
class MaintenanceResult:
    """One operation on one table. `files_*` count what the operation works on (`scope`): live
    data files for OPTIMIZE, data files on storage for VACUUM, log files for checkpoints and
    log cleanup. OPTIMIZE "removes" files from the live set (they stay on storage until VACUUM);
    VACUUM and log cleanup delete them."""

    tenant_id: str
    table: str
    operation: Operation
    action: Action
    scope: str
    files_before: int = 0
    files_after: int = 0
    files_added: int = 0
    files_removed: int = 0
    bytes_added: int = 0
    bytes_removed: int = 0
    version_before: int = 0
    version_after: int = 0
    live_files: int = 0
    # Log entries and checkpoints expired during the step: delta-rs also expires them when it
    # writes a checkpoint or commits a VACUUM, not only in log cleanup.
    log_files_removed: int = 0
    checkpoint_version: int | None = None
    duration_seconds: float = 0.0
    detail: str = ""

    @property
    def changed(self) -> bool:
        return self.action not in ("unchanged", "skipped")

    def describe(self) -> str:
        """One line for the command line: what was rewritten, removed and kept."""
        head = f"{self.table} {self.operation}"
        versions = f"version {self.version_before} -> {self.version_after}"
        took = f"{self.duration_seconds:.2f}s"
        if self.operation in (COMPACT, ZORDER) and self.changed:
            body = (
                f"rewrote {self.files_removed} files ({_size(self.bytes_removed)}) into "
                f"{self.files_added} ({_size(self.bytes_added)}); live files "
                f"{self.files_before} -> {self.files_after}"
            )
        elif self.operation == VACUUM:
            body = (
                f"removed {self.files_removed} files ({_size(self.bytes_removed)}); kept "
                f"{self.files_after} on storage ({self.live_files} live, "
                f"{self.files_after - self.live_files} inside the bound)"
            )
            if self.log_files_removed:
                body += f"; expired {self.log_files_removed} log files"
        elif self.operation == LOG_CLEANUP:
            body = (
                f"removed {self.files_removed} log files ({_size(self.bytes_removed)}); kept "
                f"{self.files_after} ("
                + (
                    f"checkpoint at {self.checkpoint_version}"
                    if self.checkpoint_version is not None
                    else "no checkpoint yet"
                )
                + ")"
            )
        elif self.operation == CHECKPOINT and self.changed:
            body = f"checkpoint at version {self.checkpoint_version}"
        else:
            body = self.action
        detail = f"; {self.detail}" if self.detail else ""
        return f"{head}: {body}; {versions}; {took}{detail}"


def _size(n: float) -> str:
    if n < 1024:
        return f"{int(n)} B"
    for unit in ("KiB", "MiB", "GiB"):
        n /= 1024
        if n < 1024 or unit == "GiB":
            break
    return f"{n:.1f} {unit}"


# OPTIMIZE and property commits leave log expiry to the steps that check the table reads back
# afterwards. delta-rs still expires logs on its own when it writes a checkpoint or commits a
# VACUUM (whatever the hook settings), so every step reports the log files it saw go.
_HOOKS = PostCommitHookProperties(create_checkpoint=True, cleanup_expired_logs=False)


def _metric_size(metrics: dict[str, Any], key: str) -> int:
    value = metrics.get(key) or {}
    if isinstance(value, str):
        value = json.loads(value)
    return int(value.get("totalSize") or 0)


# --- one table ---------------------------------------------------------------------------------


@dataclass
class _Table:
    """One table of one tenant, as `tenant_tables` names it."""

    lake: Lake
    tenant_id: str
    table: TableId
    spec: TableSpec
    uri: str

    def open(self) -> DeltaTable:
        table = self.lake.open(self.uri)
        if table is None:
            raise MaintenanceDamage(
                f"{self.table} of tenant {self.tenant_id}: no table at {self.uri}"
            )
        return table

    def listing(self) -> Listing:
        return list_files(self.lake.filesystem(self.uri))

    def result(
        self, operation: Operation, action: Action, scope: str, **fields: Any
    ) -> MaintenanceResult:
        return MaintenanceResult(
            self.tenant_id, str(self.table), operation, action, scope, **fields
        )


def _optimize(
    conn: psycopg.Connection, t: _Table, *, operation: Operation, target_size: int | None
) -> MaintenanceResult:
    """A rewrite under the table's rewrite lock: the table is read (and the rewrite planned)
    only once no other rewrite of it can be under way."""
    with rewrite_lock(conn, t.tenant_id, t.table):
        return _optimize_locked(t, operation, target_size)


def _optimize_locked(t: _Table, operation: Operation, target_size: int | None) -> MaintenanceResult:
    started = time.monotonic()
    table = t.open()
    before = live_files(table)
    version = table.version()
    scope = "live data files"

    def untouched(status: Action, detail: str) -> MaintenanceResult:
        return t.result(
            operation,
            status,
            scope,
            files_before=len(before),
            files_after=len(before),
            version_before=version,
            version_after=version,
            live_files=len(before),
            detail=detail,
        )

    if operation == ZORDER:
        if not t.spec.zorder_by:
            return untouched("skipped", "no Z-order columns declared")
        if len(before) < 2:
            # One file is as clustered as file skipping can use; rewriting it buys nothing.
            return untouched("unchanged", "fewer than two files")
        metrics = table.optimize.z_order(
            list(t.spec.zorder_by),
            target_size=target_size,
            writer_properties=writer_properties(t.spec),
            commit_properties=maintenance_commit(t.tenant_id, operation),
            post_commithook_properties=_HOOKS,
        )
    else:
        metrics = table.optimize.compact(
            target_size=target_size,
            writer_properties=writer_properties(t.spec),
            commit_properties=maintenance_commit(t.tenant_id, operation),
            post_commithook_properties=_HOOKS,
        )
    after = live_files(t.open())
    added, removed = (
        int(metrics.get("numFilesAdded") or 0),
        int(metrics.get("numFilesRemoved") or 0),
    )
    detail = f"by {', '.join(t.spec.zorder_by)}" if operation == ZORDER else ""
    return t.result(
        operation,
        "rewrote" if added or removed else "unchanged",
        scope,
        files_before=len(before),
        files_after=len(after),
        files_added=added,
        files_removed=removed,
        bytes_added=_metric_size(metrics, "filesAdded"),
        bytes_removed=_metric_size(metrics, "filesRemoved"),
        version_before=version,
        version_after=t.open().version(),
        live_files=len(after),
        duration_seconds=time.monotonic() - started,
        detail=detail,
    )


def _sync_properties(t: _Table, bound_seconds: int) -> MaintenanceResult | None:
    """Bring the table's properties back to the spec's configuration for the tenant's current
    erasure bound; one commit when anything differs, nothing otherwise."""
    started = time.monotonic()
    table = t.open()
    wanted = t.spec.configuration(bound_seconds)
    current = table.metadata().configuration
    changed = {k: v for k, v in wanted.items() if current.get(k) != v}
    if not changed:
        return None
    version = table.version()
    table.alter.set_table_properties(
        changed,
        commit_properties=maintenance_commit(t.tenant_id, PROPERTIES),
        post_commithook_properties=_HOOKS,
    )
    detail = ", ".join(f"{k}: {current.get(k)!r} -> {v!r}" for k, v in sorted(changed.items()))
    return t.result(
        PROPERTIES,
        "updated",
        "table properties",
        version_before=version,
        version_after=t.open().version(),
        duration_seconds=time.monotonic() - started,
        detail=detail,
    )


# A table's version, live files (path -> size) and app transaction.
TableState = tuple[int, dict[str, int], int | None]


def _state(table: DeltaTable) -> TableState:
    return table.version(), live_files(table), table.transaction_version(APP_ID)


def _verify(t: _Table, expected: TableState, after: str) -> None:
    """The table, opened afresh, reads the same version, files and txn as before `after`."""
    fresh = _state(t.open())
    if fresh != expected:
        raise MaintenanceDamage(
            f"{t.table} of tenant {t.tenant_id}: after {after} the table reads version "
            f"{fresh[0]} with txn {fresh[2]} and {len(fresh[1])} files, not version "
            f"{expected[0]}, txn {expected[2]}, {len(expected[1])} files"
        )


def _checkpoint(t: _Table, bound_seconds: int, now: dt.datetime) -> MaintenanceResult:
    """Checkpoint when the last checkpoint is CHECKPOINT_INTERVAL or more versions behind, or
    when commits after it have already outlived the bound (log cleanup needs a checkpoint past
    them before it may delete them), the latest commit included: an idle table's log then ends
    in a checkpoint too."""
    started = time.monotonic()
    table = t.open()
    version = table.version()
    listing = t.listing()
    last = listing.last_checkpoint()
    behind = version - (last if last is not None else -1)
    cutoff = now - dt.timedelta(seconds=bound_seconds)
    expired_after_last = [
        v
        for v in listing.commits()
        if (last if last is not None else -1) < v <= version
        and (mtime := listing.log[commit_name(v)][1]) is not None
        and mtime <= cutoff
    ]
    due = behind >= CHECKPOINT_INTERVAL
    if not due and not expired_after_last:
        return t.result(
            CHECKPOINT,
            "unchanged",
            "log files",
            files_before=len(listing.log),
            files_after=len(listing.log),  # nothing written, nothing expired
            version_before=version,
            version_after=version,
            live_files=len(live_files(table)),
            checkpoint_version=last,
            duration_seconds=time.monotonic() - started,
            detail=f"{behind} versions since the last checkpoint",
        )
    state = _state(table)
    # delta-rs also expires log entries here, as its post-commit checkpoints do.
    table.create_checkpoint()
    _verify(t, state, "checkpoint")
    after = t.listing()
    removed = sorted(set(listing.log) - set(after.log))
    reason = (
        f"{behind} versions since the last checkpoint"
        if due
        else f"{len(expired_after_last)} commits after the last checkpoint outlived the bound"
    )
    if removed:
        reason += f"; expired {len(removed)} log files"
    return t.result(
        CHECKPOINT,
        "checkpointed",
        "log files",
        files_before=len(listing.log),
        files_after=len(after.log),
        files_added=len(set(after.log) - set(listing.log)),
        files_removed=len(removed),
        bytes_removed=sum(listing.log[n][0] for n in removed),
        log_files_removed=len(removed),
        version_before=version,
        version_after=version,
        live_files=len(state[1]),
        checkpoint_version=after.last_checkpoint(),
        duration_seconds=time.monotonic() - started,
        detail=reason,
    )


def _vacuum(t: _Table) -> MaintenanceResult:
    """VACUUM with the table's deleted-file retention (= the erasure bound), listing the whole
    table so orphans of failed commits go too."""
    started = time.monotonic()
    table = t.open()
    version = table.version()
    before = t.listing()
    deleted = table.vacuum(
        retention_hours=None,
        dry_run=False,
        full=True,
        commit_properties=maintenance_commit(t.tenant_id, VACUUM),
        post_commithook_properties=_HOOKS,
    )
    after = t.listing()
    fresh = t.open()
    live = live_files(fresh)
    missing = sorted(set(live) - set(after.data))
    if missing:
        raise MaintenanceDamage(
            f"{t.table} of tenant {t.tenant_id}: VACUUM left the log referencing missing files "
            f"{missing[:5]}"
        )
    return t.result(
        VACUUM,
        "vacuumed" if deleted else "unchanged",
        "data files on storage",
        files_before=len(before.data),
        files_after=len(after.data),
        files_removed=len(deleted),
        bytes_removed=sum(before.data.get(p.lstrip("/"), 0) for p in deleted),
        log_files_removed=len(set(before.log) - set(after.log)),
        version_before=version,
        version_after=fresh.version(),
        live_files=len(live),
        checkpoint_version=after.last_checkpoint(),
        duration_seconds=time.monotonic() - started,
    )


def _cleanup_logs(t: _Table) -> MaintenanceResult:
    """Expire log entries and checkpoints older than `delta.logRetentionDuration` that a newer
    checkpoint covers; the latest version must read back exactly as before."""
    started = time.monotonic()
    table = t.open()
    state = _state(table)
    version, live = state[0], state[1]
    before = t.listing()
    table.cleanup_metadata()
    _verify(t, state, "log cleanup")
    after = t.listing()
    removed = sorted(set(before.log) - set(after.log))
    readable = after.checkpoints()
    if commit_name(0) in after.log:
        readable = [0, *readable]
    return t.result(
        LOG_CLEANUP,
        "cleaned" if removed else "unchanged",
        "log files",  # commit entries and checkpoints in _delta_log
        files_before=len(before.log),
        files_after=len(after.log),
        files_removed=len(removed),
        bytes_removed=sum(before.log[n][0] for n in removed),
        log_files_removed=len(removed),
        version_before=version,
        version_after=version,  # log cleanup commits nothing
        live_files=len(live),
        checkpoint_version=after.last_checkpoint(),
        duration_seconds=time.monotonic() - started,
        detail=f"oldest readable version {min(readable)}" if readable else "",
    )


# --- one tenant --------------------------------------------------------------------------------


def _tables(lake: Lake, tenant_id: str) -> list[_Table]:
    return [
        _Table(lake, tenant_id, table_id, spec, uri)
        for table_id, spec, uri in tenant_tables(lake, tenant_id)
    ]


def _bound_seconds(conn: psycopg.Connection, tenant_id: str) -> int:
    return max(int(erasure_bound(conn, tenant_id).total_seconds()), 0)


def compact(
    conn: psycopg.Connection, lake: Lake, tenant_id: str, *, target_size: int | None = None
) -> list[MaintenanceResult]:
    """Bin-pack OPTIMIZE of every table of the tenant (each bronze day partition separately)."""
    return [
        _optimize(conn, t, operation=COMPACT, target_size=target_size)
        for t in _tables(lake, tenant_id)
    ]


def zorder(
    conn: psycopg.Connection, lake: Lake, tenant_id: str, *, target_size: int | None = None
) -> list[MaintenanceResult]:
    """Z-order OPTIMIZE of every table that declares Z-order columns."""
    return [
        _optimize(conn, t, operation=ZORDER, target_size=target_size)
        for t in _tables(lake, tenant_id)
        if t.spec.zorder_by
    ]


def _expiring(
    conn: psycopg.Connection,
    lake: Lake,
    tenant_id: str,
    *,
    step: Callable[[_Table, int], MaintenanceResult],
) -> list[MaintenanceResult]:
    """Run a step that expires files or log entries on every table, each table's retention
    properties first brought to the tenant's current bound."""
    bound = _bound_seconds(conn, tenant_id)
    results: list[MaintenanceResult] = []
    for t in _tables(lake, tenant_id):
        synced = _sync_properties(t, bound)
        if synced is not None:
            results.append(synced)
        results.append(step(t, bound))
    return results


def checkpoint(
    conn: psycopg.Connection, lake: Lake, tenant_id: str, *, now: dt.datetime | None = None
) -> list[MaintenanceResult]:
    """Checkpoint every table that is CHECKPOINT_INTERVAL versions past its last checkpoint or
    holds expired commits after it."""
    now = now or dt.datetime.now(dt.UTC)
    return _expiring(conn, lake, tenant_id, step=lambda t, bound: _checkpoint(t, bound, now))


def vacuum(conn: psycopg.Connection, lake: Lake, tenant_id: str) -> list[MaintenanceResult]:
    """Full-listing VACUUM of every table with the tenant's bound as retention."""
    return _expiring(conn, lake, tenant_id, step=lambda t, bound: _vacuum(t))


def cleanup_logs(conn: psycopg.Connection, lake: Lake, tenant_id: str) -> list[MaintenanceResult]:
    """Log cleanup of every table with the tenant's bound as log retention."""
    return _expiring(conn, lake, tenant_id, step=lambda t, bound: _cleanup_logs(t))


def run_operation(
    conn: psycopg.Connection,
    lake: Lake,
    tenant_id: str,
    *,
    operation: Operation,
    target_size: int | None = None,
) -> list[MaintenanceResult]:
    """One operation (COMPACT, ZORDER, CHECKPOINT, VACUUM or LOG_CLEANUP) for one tenant."""
    steps: dict[Operation, Callable[[], list[MaintenanceResult]]] = {
        COMPACT: lambda: compact(conn, lake, tenant_id, target_size=target_size),
        ZORDER: lambda: zorder(conn, lake, tenant_id, target_size=target_size),
        CHECKPOINT: lambda: checkpoint(conn, lake, tenant_id),
        VACUUM: lambda: vacuum(conn, lake, tenant_id),
        LOG_CLEANUP: lambda: cleanup_logs(conn, lake, tenant_id),
    }
    if operation not in steps:
        raise ValueError(f"unknown maintenance operation {operation!r}")
    return steps[operation]()


def maintain(
    conn: psycopg.Connection,
    lake: Lake,
    tenant_id: str,
    *,
    task: Task = "all",
    target_size: int | None = None,
) -> list[MaintenanceResult]:
    """Every operation of `task` (a key of TASKS) for one tenant, in order."""
    if task not in TASKS:
        raise ValueError(f"unknown maintenance task {task!r}; one of {', '.join(TASKS)}")
    results: list[MaintenanceResult] = []
    for operation in TASKS[task]:
        results.extend(
            run_operation(conn, lake, tenant_id, operation=operation, target_size=target_size)
        )
    return results


def totals(results: Iterable[MaintenanceResult]) -> dict[str, int | float]:
    """Sums over a run's results (per-table numbers stay in the results)."""
    results = list(results)
    return {
        "tables": len({r.table for r in results}),
        "changed": sum(1 for r in results if r.changed),
        "files_before": sum(r.files_before for r in results),
        "files_after": sum(r.files_after for r in results),
        "files_removed": sum(r.files_removed for r in results),
        "files_added": sum(r.files_added for r in results),
        "bytes_removed": sum(r.bytes_removed for r in results),
        "log_files_removed": sum(r.log_files_removed for r in results),
        "commits": sum(r.version_after - r.version_before for r in results),
        "duration_seconds": round(sum(r.duration_seconds for r in results), 3),
    }
