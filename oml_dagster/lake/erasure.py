"""Erasure evidence (spec: "The erasure-SLO interaction"): for one tenant, whether every copy
class that can hold an erased claim body has been removed within its bound.

The SLO for lake ciphertext is drain lag + the tenant's lake erasure bound + one maintenance
cadence. Evidence is read from storage and Postgres, never from keys (the writer has none):
- the live table versions: no erased row carries a body (the erase MERGE nulls it);
- superseded and orphan data files (any data file the live version does not reference, the only
  places an erased body can survive): none older than bound + cadence;
- log entries and checkpoints (no body statistics are written, but the spec counts them as
  ciphertext-bearing): none below the last checkpoint older than bound + two cadences, since log
  cleanup can only drop entries below a checkpoint that is itself past the bound;
- erases not yet in the lake: none dead-lettered and not re-enqueued (a breach in progress), none
  waiting longer than bound + cadence.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field
from urllib.parse import unquote

import psycopg
import pyarrow.parquet as pq

from .maintenance import LOG_DIR, filesystem, last_checkpoint, list_files, live_files
from .storage import Lake, query, tenant_tables
from .tables import APP_ID, GOLD_CURATED, SILVER_CLAIMS
from .writer import erasure_bound

DEFAULT_CADENCE = dt.timedelta(days=1)


@dataclass
class TableEvidence:
    table: str
    erased_rows: int
    erased_rows_with_body: int
    live_files: int
    unreferenced_files: int
    overdue_files: list[str] = field(default_factory=list)
    overdue_log_entries: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.erased_rows_with_body or self.overdue_files or self.overdue_log_entries)


@dataclass
class ErasureEvidence:
    tenant_id: str
    checked_at: dt.datetime
    bound: dt.timedelta
    cadence: dt.timedelta
    tables: list[TableEvidence] = field(default_factory=list)
    # (seq or outbox id, artifact_id, reason) of erases the lake refused and nobody re-enqueued.
    dead_lettered_erases: list[tuple[int, str, str]] = field(default_factory=list)
    # (outbox id, artifact_id, age in seconds) of erases not yet applied to silver.
    pending_erases: list[tuple[int, str, float]] = field(default_factory=list)

    @property
    def data_deadline(self) -> dt.timedelta:
        return self.bound + self.cadence

    @property
    def overdue_pending_erases(self) -> list[tuple[int, str, float]]:
        limit = self.data_deadline.total_seconds()
        return [p for p in self.pending_erases if p[2] > limit]

    @property
    def ok(self) -> bool:
        return (
            all(t.ok for t in self.tables)
            and not self.dead_lettered_erases
            and not self.overdue_pending_erases
        )

    def findings(self) -> list[str]:
        """What breaks the SLO, one line each (empty when it holds)."""
        out = []
        for t in self.tables:
            if t.erased_rows_with_body:
                out.append(f"{t.table}: {t.erased_rows_with_body} erased rows still carry a body")
            if t.overdue_files:
                out.append(
                    f"{t.table}: {len(t.overdue_files)} unreferenced data files older than "
                    f"bound + cadence ({self.data_deadline}), e.g. {t.overdue_files[0]}"
                )
            if t.overdue_log_entries:
                out.append(
                    f"{t.table}: {len(t.overdue_log_entries)} expired log entries below the last "
                    f"checkpoint, e.g. {t.overdue_log_entries[0]}"
                )
        for seq, artifact_id, reason in self.dead_lettered_erases:
            out.append(f"erase of {artifact_id} dead-lettered at seq {seq}: {reason}")
        for outbox_id, artifact_id, age in self.overdue_pending_erases:
            out.append(f"erase of {artifact_id} (outbox row {outbox_id}) waiting {age:.0f}s")
        return out


def _removed_at(lake: Lake, uri: str, log_names) -> dict[str, dt.datetime]:
    """When each data file was removed from the table (its tombstone's deletionTimestamp), from
    the commits and the checkpoint still in the log. A superseded file's VACUUM retention counts
    from then, not from when the file was written."""
    fs = filesystem(lake, uri)
    stamps: dict[str, int] = {}

    def note(path: str | None, millis: int | None) -> None:
        if path and millis is not None:
            key = unquote(path)
            stamps[key] = max(stamps.get(key, 0), int(millis))

    for name in log_names:
        if name.endswith(".json") and name[:20].isdigit():
            with fs.open_input_stream(f"{LOG_DIR}/{name}") as f:
                for line in f.read().decode().splitlines():
                    remove = json.loads(line).get("remove") if line.strip() else None
                    if remove:
                        note(remove.get("path"), remove.get("deletionTimestamp"))
        elif name.endswith(".checkpoint.parquet"):
            with fs.open_input_file(f"{LOG_DIR}/{name}") as f:
                removes = pq.read_table(f, columns=["remove"]).column("remove").to_pylist()
            for remove in removes:
                if remove:
                    note(remove.get("path"), remove.get("deletionTimestamp"))
    return {p: dt.datetime.fromtimestamp(ms / 1000, dt.UTC) for p, ms in stamps.items()}


def _table_evidence(
    lake: Lake,
    name: str,
    uri: str,
    now: dt.datetime,
    data_deadline: dt.timedelta,
    log_deadline: dt.timedelta,
) -> TableEvidence:
    table = lake.open(uri)
    erased = query(
        table, "count(*) AS n, count(body_ciphertext) AS with_body", "state = 'erased'"
    ).to_pylist()[0]
    live = live_files(table)
    listing = list_files(lake, uri)
    unreferenced = [p for p in listing.data if p not in live and p.endswith(".parquet")]
    removed = _removed_at(lake, uri, listing.log)
    # A superseded file ages from its removal; an orphan (or a tombstone the log no longer
    # keeps, which is older than the retention) from its writing.
    overdue = sorted(
        p
        for p in unreferenced
        if (since := removed.get(p) or listing.data_mtime.get(p)) is not None
        and since < now - data_deadline
    )
    checkpoint = last_checkpoint(lake, uri)
    overdue_log = sorted(
        entry
        for entry, (_, mtime) in listing.log.items()
        if entry[:20].isdigit()
        and checkpoint is not None
        and int(entry[:20]) < checkpoint
        and mtime is not None
        and mtime < now - log_deadline
    )
    return TableEvidence(
        name, erased["n"], erased["with_body"], len(live), len(unreferenced), overdue, overdue_log
    )


def erasure_evidence(
    conn: psycopg.Connection,
    lake: Lake,
    tenant_id: str,
    *,
    cadence: dt.timedelta = DEFAULT_CADENCE,
    now: dt.datetime | None = None,
) -> ErasureEvidence:
    now = now or dt.datetime.now(dt.UTC)
    bound = erasure_bound(conn, tenant_id)
    evidence = ErasureEvidence(tenant_id, now, bound, cadence)
    for name, spec, uri in tenant_tables(lake, tenant_id):
        if spec in (SILVER_CLAIMS, GOLD_CURATED):
            evidence.tables.append(
                _table_evidence(lake, name, uri, now, bound + cadence, bound + 2 * cadence)
            )
    evidence.dead_lettered_erases = [
        (seq, payload.get("artifact_id", "?") if isinstance(payload, dict) else "?", reason)
        for seq, payload, reason in conn.execute(
            "SELECT seq, payload, reason FROM oml.lake_dead_letter"
            " WHERE tenant_id = %s AND op = 'claim.erase' AND requeued_at IS NULL ORDER BY seq",
            (tenant_id,),
        )
    ]
    # Applied: at or below silver's txn version, or below what the writer last drained silver
    # through (an erase of a row already erased changes nothing and so commits nothing).
    silver = lake.open(lake.table_uri(tenant_id, SILVER_CLAIMS))
    applied_through = (silver.transaction_version(APP_ID) or 0) if silver is not None else 0
    drained = conn.execute(
        "SELECT batch_end FROM oml.lake_frontier WHERE tenant_id = %s AND table_name = %s",
        (tenant_id, SILVER_CLAIMS.name),
    ).fetchone()
    if silver is not None and drained:
        applied_through = max(applied_through, drained[0])
    evidence.pending_erases = [
        (outbox_id, payload.get("artifact_id", "?"), (now - created).total_seconds())
        for outbox_id, payload, created in conn.execute(
            "SELECT o.id, o.payload, o.created_at FROM oml.outbox o"
            " WHERE o.tenant_id = %s AND o.op = 'claim.erase'"
            " AND (o.seq IS NULL OR o.seq > %s)"
            " AND NOT EXISTS (SELECT 1 FROM oml.lake_dead_letter d WHERE d.seq = o.seq)"
            " ORDER BY o.id",
            (tenant_id, applied_through),
        )
    ]
    return evidence
