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

An erase is in the lake when the live silver table shows the version erased: the Delta log is
the authority, never the frontier cache (a lake restored from an old copy holds the body again
and its erases wait again). An erase ages from the first erase act of the version, whatever
became of it: a dead-lettered erase that an operator re-enqueues keeps its original clock.
A table without a checkpoint has its log entries checked too: all but the latest are what a
checkpoint at the latest version would let log cleanup expire.

`erased_artifacts` is the same evidence per erased claim version: its SLO deadline and every file
of every copy class (live version, superseded or orphan Parquet, log entry or checkpoint) that
still holds its ciphertext, found by reading the files themselves (docs/decisions/0015).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any, Literal

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable

from oml_dagster.lake import queries
from oml_dagster.lake.model.tables import GOLD_CURATED, SILVER_CLAIMS, TableId
from oml_dagster.lake.policy import DEFAULT_CADENCE, read_erasure_bound
from oml_dagster.lake.queries import TenantSession, tenant_scope
from oml_dagster.lake.store import deltalog
from oml_dagster.lake.store.layout import Lake
from oml_dagster.lake.store.reads import query, tenant_tables


@dataclass
class TableEvidence:
    """One table's part of the erasure check."""

    table: str
    erased_rows: int
    erased_rows_with_body: int  # must be 0: the erase MERGE nulls the body
    live_files: int
    unreferenced_files: int  # data files on storage the live version does not reference
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
    dead_lettered_erases: list[tuple[int | None, str, str | None]] = field(default_factory=list)
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


def _existing(lake: Lake, uri: str) -> DeltaTable:
    """The table at `uri`, which the tenant's listing found."""
    table = lake.open(uri)
    if table is None:
        raise FileNotFoundError(f"{uri}: no Delta table there")
    return table


def _log_boundary(listing: deltalog.Listing, table: DeltaTable) -> int:
    """Log entries below this version are ones log cleanup can expire (given a checkpoint)."""
    checkpoint = listing.last_checkpoint()
    return checkpoint if checkpoint is not None else table.version()


def _table_evidence(
    lake: Lake,
    table_id: TableId,
    uri: str,
    now: dt.datetime,
    data_deadline: dt.timedelta,
    log_deadline: dt.timedelta,
) -> TableEvidence:
    table = _existing(lake, uri)
    erased = query(
        table, "count(*) AS n, count(body_ciphertext) AS with_body", "state = 'erased'"
    ).to_pylist()[0]
    live = deltalog.live_files(table)
    fs = lake.filesystem(uri)
    listing = deltalog.list_files(fs)
    unreferenced = [p for p in listing.data if p not in live and p.endswith(".parquet")]
    removed = deltalog.tombstones(fs, listing.log)
    # A superseded file ages from its removal; an orphan (or a tombstone the log no longer
    # keeps, which is older than the retention) from its writing.
    overdue = sorted(
        p
        for p in unreferenced
        if (since := removed.get(p) or listing.data_mtime.get(p)) is not None
        and since < now - data_deadline
    )
    # Below the last checkpoint, or, with none, below the latest version (a checkpoint there is
    # what log cleanup would need to expire them; maintenance writes one once they outlive the
    # bound).
    expirable_below = _log_boundary(listing, table)
    overdue_log = sorted(
        entry.name
        for entry in listing.entries()
        if entry.version < expirable_below
        and (mtime := listing.log[entry.name][1]) is not None
        and mtime < now - log_deadline
    )
    return TableEvidence(
        str(table_id),
        erased["n"],
        erased["with_body"],
        len(live),
        len(unreferenced),
        overdue,
        overdue_log,
    )


def erasure_evidence(
    conn: psycopg.Connection,
    lake: Lake,
    tenant_id: str,
    *,
    cadence: dt.timedelta = DEFAULT_CADENCE,  # the maintenance cadence allowed past the bound
    now: dt.datetime | None = None,
    state: ErasureState | None = None,
) -> ErasureEvidence:
    """The erasure check's evidence per table of the tenant (erased rows still holding a body,
    superseded or orphan files past their deadline, log entries past theirs) and the erases
    the lake dead-lettered or has not applied yet. `state`: the tenant's erasure state when the
    caller read it already (`ErasureState.read`)."""
    now = now or dt.datetime.now(dt.UTC)
    state = state or ErasureState.read(conn, lake, tenant_id)
    bound = state.bound
    evidence = ErasureEvidence(tenant_id, now, bound, cadence)
    for table_id, spec, uri in tenant_tables(lake, tenant_id):
        if spec in (SILVER_CLAIMS, GOLD_CURATED):
            evidence.tables.append(
                _table_evidence(lake, table_id, uri, now, bound + cadence, bound + 2 * cadence)
            )
    evidence.dead_lettered_erases = [
        (e.seq, e.artifact_id, e.reason) for e in state.erases if e.open_dead_letter
    ]
    evidence.pending_erases = [
        (e.outbox_id, e.artifact_id, (now - state.first[e.key]).total_seconds())
        for e in state.erases
        if not e.refused and e.key not in state.in_lake
    ]
    return evidence


# A claim version: (artifact_id, version); the version is None when the erase's is unreadable.
ErasureKey = tuple[str, int | None]


@dataclass(frozen=True)
class _Erase:
    """One claim.erase outbox row of the tenant, and what the writer made of it."""

    outbox_id: int
    seq: int | None
    artifact_id: str
    version: int | None
    at: dt.datetime  # the act's instant, or the row's creation when earlier or unreadable
    refused: bool  # dead-lettered (re-enqueued or not)
    open_dead_letter: bool  # dead-lettered and nobody re-enqueued it
    reason: str | None

    @property
    def key(self) -> tuple[str, int | None]:
        return (self.artifact_id, self.version)


def _erases(session: TenantSession) -> list[_Erase]:
    rows = session.execute(queries.ERASE_ACTS, (session.tenant_id,)).fetchall()
    found = []
    for outbox_id, seq, payload, created, refused, open_letter, reason in rows:
        payload = payload if isinstance(payload, dict) else {}
        artifact_id = payload.get("artifact_id")
        version = payload.get("version")
        at = created
        try:
            stated = dt.datetime.fromisoformat(payload["at"])
            if stated.tzinfo is not None:
                at = min(at, stated.astimezone(dt.UTC))
        except (KeyError, TypeError, ValueError):
            pass
        found.append(
            _Erase(
                outbox_id,
                seq,
                artifact_id if isinstance(artifact_id, str) else "?",
                version if isinstance(version, int) and not isinstance(version, bool) else None,
                at,
                bool(refused),
                bool(open_letter),
                reason,
            )
        )
    return found


def _first_erased_at(erases: list[_Erase]) -> dict[ErasureKey, dt.datetime]:
    """Per claim version, its first erase act: the SLO clock does not restart on a requeue."""
    first: dict[ErasureKey, dt.datetime] = {}
    for e in erases:
        first[e.key] = min(first.get(e.key, e.at), e.at)
    return first


@dataclass(frozen=True)
class ErasureState:
    """What both reports start from: the tenant's erasure bound, its claim.erase acts, each
    claim version's first erase act (the SLO clock), and the versions live silver shows erased.
    The Delta table is the authority for "erased in the lake": the frontier cache would pass a
    lake restored from before the erase."""

    bound: dt.timedelta
    erases: list[_Erase]
    first: dict[ErasureKey, dt.datetime]
    in_lake: set[tuple[str, int]]

    @classmethod
    def read(cls, conn: psycopg.Connection, lake: Lake, tenant_id: str) -> ErasureState:
        """The state, its PostgreSQL part read in one session of the tenant."""
        with tenant_scope(conn, tenant_id) as session:
            erases = _erases(session)
            bound = read_erasure_bound(session)
        return cls(
            bound,
            erases,
            _first_erased_at(erases),
            _erased_in_silver(lake, tenant_id),
        )


def _erased_in_silver(lake: Lake, tenant_id: str) -> set[tuple[str, int]]:
    silver = lake.open(lake.table_uri(tenant_id, SILVER_CLAIMS))
    if silver is None:
        return set()
    rows = query(silver, "artifact_id, version", "state = 'erased'").to_pylist()
    return {(r["artifact_id"], r["version"]) for r in rows}


# --- per erased claim version ------------------------------------------------------------------

# Where a copy of an erased ciphertext sits: a live data file, a data file a commit removed
# (superseded), a file no commit names (orphan), a log entry, or a checkpoint.
CopyClass = Literal["live", "superseded", "orphan", "log", "checkpoint"]
LIVE: CopyClass = "live"
SUPERSEDED: CopyClass = "superseded"
ORPHAN: CopyClass = "orphan"
LOG: CopyClass = "log"
CHECKPOINT: CopyClass = "checkpoint"

# applied: live silver shows it erased; dead-lettered: an open dead letter holds its erase;
# refused: every erase of it was refused and none is open; pending: not yet applied.
ErasureStatus = Literal["applied", "dead-lettered", "refused", "pending"]
APPLIED: ErasureStatus = "applied"
DEAD_LETTERED: ErasureStatus = "dead-lettered"
REFUSED: ErasureStatus = "refused"
PENDING: ErasureStatus = "pending"


@dataclass(frozen=True)
class Copy:
    """One file that still holds an erased ciphertext, its path relative to the tenant prefix.
    `expires_at`: when maintenance removes it at the latest (None for a live file: it stops
    holding the body when the erase applies)."""

    copy_class: CopyClass
    table: str
    path: str
    expires_at: dt.datetime | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "class": self.copy_class,  # live, superseded, orphan, log or checkpoint
            "table": self.table,
            "path": self.path,
            "expires_at": _iso(self.expires_at),
        }


@dataclass
class ErasedArtifact:
    """One erased claim version: when it was erased (its first erase act), its SLO deadline, and
    every copy of its ciphertext still in the lake."""

    artifact_id: str
    version: int | None
    erased_at: dt.datetime
    status: ErasureStatus
    applied_at: dt.datetime | None
    deadline: dt.datetime
    copies: list[Copy] = field(default_factory=list)

    def overdue(self, now: dt.datetime) -> bool:
        """Past its deadline with a copy of its ciphertext still in the lake."""
        return now > self.deadline and bool(self.copies)

    def at_risk(self, now: dt.datetime, margin: dt.timedelta) -> bool:
        """Dead-lettered (a breach in progress), or a copy left within `margin` of its deadline:
        only the next maintenance run stands between it and a breach."""
        if self.status == DEAD_LETTERED:
            return True
        return bool(self.copies) and now + margin >= self.deadline

    def as_dict(self) -> dict[str, Any]:
        return {
            "artifact_id": self.artifact_id,
            "version": self.version,
            "status": self.status,
            "erased_at": _iso(self.erased_at),
            "applied_at": _iso(self.applied_at),  # None until the erase is in the lake
            "deadline": _iso(self.deadline),
            "copies": [c.as_dict() for c in self.copies],
        }


@dataclass
class ArtifactEvidence:
    tenant_id: str
    checked_at: dt.datetime
    bound: dt.timedelta
    cadence: dt.timedelta
    artifacts: list[ErasedArtifact] = field(default_factory=list)

    @property
    def overdue(self) -> list[ErasedArtifact]:
        return [a for a in self.artifacts if a.overdue(self.checked_at)]

    def at_risk(self, margin: dt.timedelta | None = None) -> list[ErasedArtifact]:
        margin = self.cadence if margin is None else margin
        return [a for a in self.artifacts if a.at_risk(self.checked_at, margin)]

    def as_dict(self) -> dict[str, Any]:
        return {
            "tenant_id": self.tenant_id,
            "checked_at": _iso(self.checked_at),
            "bound_seconds": self.bound.total_seconds(),
            "cadence_seconds": self.cadence.total_seconds(),
            "artifacts": [a.as_dict() for a in self.artifacts],
        }


def _iso(value: dt.datetime | None) -> str | None:
    return value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z") if value else None


def _applied_at(lake: Lake, tenant_id: str) -> list[tuple[int, dt.datetime]]:
    """(batch_end, commit time) of silver's writer commits the log still holds, oldest first."""
    silver = lake.open(lake.table_uri(tenant_id, SILVER_CLAIMS))
    if silver is None:
        return []
    commits = []
    for commit in silver.history():
        end, stamp = commit.get("oml.batch_end"), commit.get("timestamp")
        if end is not None and stamp is not None:
            commits.append((int(end), dt.datetime.fromtimestamp(int(stamp) / 1000, dt.UTC)))
    return sorted(commits)


def _bodies_in_file(fs: Any, path: str, wanted: set[ErasureKey]) -> dict[ErasureKey, bytes]:
    """The erased versions whose body a Parquet data file holds, read from its rows."""
    try:
        with fs.open_input_file(path) as f:
            data = pq.read_table(f, columns=["artifact_id", "version", "body_ciphertext"])
    except (pa.ArrowException, OSError, KeyError):  # not a Parquet file of this table
        return {}
    found: dict[ErasureKey, bytes] = {}
    for row in data.to_pylist():
        key = (row["artifact_id"], row["version"])
        if key in wanted and row["body_ciphertext"] is not None:
            found[key] = bytes(row["body_ciphertext"])
    return found


def _erased_versions(
    state: ErasureState,
    commits: list[tuple[int, dt.datetime]],
    now: dt.datetime,
    cadence: dt.timedelta,
) -> dict[ErasureKey, ErasedArtifact]:
    """Each erased claim version with its status and deadline (no copies yet)."""
    bound, erases, first, in_lake = state.bound, state.erases, state.first, state.in_lake
    keys = {k for k in first if k[1] is not None} | in_lake

    by_key: dict[ErasureKey, ErasedArtifact] = {}
    for key in sorted(keys, key=repr):
        of_key = [e for e in erases if e.key == key]
        erased_at = first.get(key)
        applied_at = None
        if key in in_lake:
            status = APPLIED
            seqs = [e.seq for e in of_key if e.seq is not None and not e.refused]
            if seqs:
                applied_at = next((t for end, t in commits if end >= min(seqs)), None)
            if erased_at is None:  # erased by a repair, not an erase op: no erase act to age
                erased_at = applied_at or now
            # Drain lag counts as it was; unknown (its commit left the log) counts as none.
            applied_at = max(applied_at or erased_at, erased_at)
            deadline = applied_at + bound + cadence
        else:
            if any(e.open_dead_letter for e in of_key):
                status = DEAD_LETTERED
            elif of_key and all(e.refused for e in of_key):
                status = REFUSED
            else:
                status = PENDING
            erased_at = first[key]  # not in the lake: the key is an erase act's
            deadline = erased_at + bound + cadence
        by_key[key] = ErasedArtifact(key[0], key[1], erased_at, status, applied_at, deadline)
    return by_key


def erased_artifacts(
    conn: psycopg.Connection,
    lake: Lake,
    tenant_id: str,
    *,
    cadence: dt.timedelta = DEFAULT_CADENCE,
    now: dt.datetime | None = None,
    state: ErasureState | None = None,
) -> ArtifactEvidence:
    """Every erased claim version of the tenant (erased in silver, or with an erase in the
    outbox), its deadline, and every file of silver and the curated tables that still holds its
    ciphertext: data files by their rows, log entries and checkpoints by their bytes. `state`: as
    `erasure_evidence` takes it."""
    now = now or dt.datetime.now(dt.UTC)
    state = state or ErasureState.read(conn, lake, tenant_id)
    bound = state.bound
    evidence = ArtifactEvidence(tenant_id, now, bound, cadence)
    by_key = _erased_versions(state, _applied_at(lake, tenant_id), now, cadence)
    evidence.artifacts = list(by_key.values())
    if not by_key:
        return evidence

    wanted = set(by_key)
    for table_id, spec, uri in tenant_tables(lake, tenant_id):
        if spec not in (SILVER_CLAIMS, GOLD_CURATED):
            continue
        name = str(table_id)  # what the evidence (JSON) names
        table = _existing(lake, uri)
        fs = lake.filesystem(uri)
        prefix = uri[len(lake.tenant_uri(tenant_id)) + 1 :] + "/"
        live = deltalog.live_files(table)
        listing = deltalog.list_files(fs)
        removed = deltalog.tombstones(fs, listing.log)
        ciphertexts: dict[ErasureKey, bytes] = {}
        for path in sorted(p for p in listing.data if p.endswith(".parquet")):
            for key, body in _bodies_in_file(fs, path, wanted).items():
                ciphertexts[key] = body
                where = prefix + path
                if path in live:
                    copy = Copy(LIVE, name, where, None)
                elif path in removed:
                    copy = Copy(SUPERSEDED, name, where, removed[path] + bound + cadence)
                else:
                    since = listing.data_mtime.get(path) or now
                    copy = Copy(ORPHAN, name, where, since + bound + cadence)
                by_key[key].copies.append(copy)
        if not ciphertexts:
            continue
        # No body statistics are written, so these should never match; the spec counts log
        # entries and checkpoints as ciphertext-bearing anyway, and a byte scan says so if one is.
        for entry, (_, mtime) in sorted(listing.log.items()):
            content = deltalog.entry_bytes(fs, entry)
            for key, body in ciphertexts.items():
                if body in content:
                    parsed = deltalog.parse_log_name(entry)
                    kind = CHECKPOINT if parsed and parsed.kind == deltalog.CHECKPOINT else LOG
                    expires = (mtime or now) + bound + 2 * cadence
                    by_key[key].copies.append(
                        Copy(kind, name, prefix + deltalog.entry_path(entry), expires)
                    )
    return evidence
