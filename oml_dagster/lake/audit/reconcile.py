"""The key-less reconciler (DESIGN §1, §4; spec: "silver.claims … the reconciliation target"):
whether one tenant's lake agrees with itself and with the authority, read-only.

Each check returns a `CheckResult` (what it looked at, and a `Finding` per disagreement naming the
tenant, table, row key and version). The checks, by the table they are about:
- every table: `tenant_id_matches_partition` — every row's tenant_id is the prefix's tenant;
  `frontier_matches_delta_log` — the Postgres cache (`oml.lake_frontier.txn_version`) equals the
  table's Delta txn version (the log is the authority; a lake restored from an old copy shows
  here as a log behind its cache);
- bronze.events: `journal_chain_verifies` — from bronze alone plus the public keys in
  `oml.api_keys` (no DEK, no outbox): journal_seq 1..n once each, hash = SHA-256(prev_hash ‖
  signed_bytes), prev_hash = the previous hash (genesis: 32 zero bytes), the Ed25519 `sig` valid
  for `signed_bytes` under the key `api_key_id` of this tenant, and the signed envelope agreeing
  with the row where it names the same field;
- silver.claims: `erased_rows_carry_no_body`; `bodies_match_digests` — SHA-256(body_ciphertext)
  = ciphertext_digest, and the digest is the one the last journal event about the version
  carried (bronze, up to silver's txn); `agrees_with_outbox` — see below;
  `no_open_dead_letters` — every refused op nobody re-enqueued, an erase among them being an
  erasure-SLO breach in progress;
- gold.lineage, gold.areas: `agrees_with_outbox`;
- gold.curated: `erased_rows_carry_no_body`; `curated_agrees_with_silver` — every curated row is
  its silver row (state, body and every other column but applied_seq and curated_at) and every
  promoted silver row of a validated area is curated; `no_simulation_tainted_rows`.

`agrees_with_outbox` runs the writer's own fold (`catalog.fold`) read-only: the tenant's outbox
ops in seq order, parsed, over fresh working tables (`state.TenantState`), every op decided: the
ops the writer refused (`oml.lake_dead_letter`) skipped, the rest applied, with each table's rows
taken as they stand when the fold passes that table's txn version. The rows must equal the
table's, column for column. Bodies are compared by presence (the ciphertext is checked against
its digest by `bodies_match_digests`): the fold knows a body is there when `oml.claim_bodies`
still holds it, and cannot know when it was shredded since the drain.

Why one file: each check is a short function over the same snapshot of a tenant's lake, and
the file's sections are the list of checks the README, `oml-lake reconcile` and the asset
checks name.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from deltalake import DeltaTable

from oml_dagster.lake import queries
from oml_dagster.lake.errors import RefusedOp
from oml_dagster.lake.model import catalog
from oml_dagster.lake.model.tables import (
    APP_ID,
    BRONZE_EVENTS,
    GOLD_AREAS,
    GOLD_CURATED,
    GOLD_LINEAGE,
    PROMOTED,
    SILVER_CLAIMS,
    Row,
    TableId,
    TableSpec,
    TenantState,
)
from oml_dagster.lake.model.tables import ERASED as ERASED_STATE
from oml_dagster.lake.queries import cross_scope, tenant_scope
from oml_dagster.lake.store.layout import Lake
from oml_dagster.lake.store.reads import read_rows, tenant_tables

GENESIS_HASH = bytes(32)
SAMPLE = 5
# A row's MERGE key (`TableSpec.merge_key`'s values, in order).
RowKey = tuple[Any, ...]

# Check names, as the Dagster layer names its asset checks.
TENANT_ID = "tenant_id_matches_partition"
FRONTIER = "frontier_matches_delta_log"
CHAIN = "journal_chain_verifies"
ERASED = "erased_rows_carry_no_body"
BODIES = "bodies_match_digests"
OUTBOX = "agrees_with_outbox"
DEAD_LETTERS = "no_open_dead_letters"
CURATED = "curated_agrees_with_silver"
TAINT = "no_simulation_tainted_rows"

# (table, check) of every check, in the order they run and print.
CHECKS: tuple[tuple[str, str], ...] = (
    *((spec.name, TENANT_ID) for spec in (BRONZE_EVENTS, SILVER_CLAIMS, GOLD_LINEAGE, GOLD_AREAS)),
    (GOLD_CURATED.name, TENANT_ID),
    *(
        (spec.name, FRONTIER)
        for spec in (BRONZE_EVENTS, SILVER_CLAIMS, GOLD_LINEAGE, GOLD_AREAS, GOLD_CURATED)
    ),
    (BRONZE_EVENTS.name, CHAIN),
    (SILVER_CLAIMS.name, ERASED),
    (SILVER_CLAIMS.name, BODIES),
    (SILVER_CLAIMS.name, OUTBOX),
    (GOLD_LINEAGE.name, OUTBOX),
    (GOLD_AREAS.name, OUTBOX),
    (SILVER_CLAIMS.name, DEAD_LETTERS),
    (GOLD_CURATED.name, ERASED),
    (GOLD_CURATED.name, CURATED),
    (GOLD_CURATED.name, TAINT),
)


@dataclass(frozen=True)
class Finding:
    """One disagreement: the row (tenant, table, key, version) and what disagreed. `table` is
    the table's name under the tenant (`gold.curated/<workarea_id>` for a curated table)."""

    check: str
    tenant_id: str
    table: str
    key: str | None
    version: int | None
    detail: str

    def describe(self) -> str:
        row = f" {self.key}" if self.key is not None else ""
        row += f" v{self.version}" if self.version is not None else ""
        return f"{self.table}{row}: {self.detail}"

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class CheckResult:
    """One check of one tenant: `checked` counts what it looked at (rows, events, tables)."""

    table: str
    name: str
    tenant_id: str
    checked: int = 0
    findings: list[Finding] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.findings

    def add(self, table: str, key: Any, version: int | None, detail: str) -> None:
        self.findings.append(
            Finding(
                self.name,
                self.tenant_id,
                table,
                None if key is None else str(key),
                version,
                detail,
            )
        )

    def samples(self, n: int = SAMPLE) -> list[str]:
        return [f.describe() for f in self.findings[:n]]

    def as_dict(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "check": self.name,
            "passed": self.passed,
            "checked": self.checked,
            "findings": [f.as_dict() for f in self.findings],
        }


@dataclass
class Reconciliation:
    tenant_id: str
    results: list[CheckResult]

    @property
    def ok(self) -> bool:
        return all(r.passed for r in self.results)

    def result(self, table: str, name: str) -> CheckResult:
        return next(r for r in self.results if (r.table, r.name) == (table, name))

    def failed(self) -> list[CheckResult]:
        return [r for r in self.results if not r.passed]

    def as_dict(self) -> dict[str, Any]:
        return {
            "tenant_id": self.tenant_id,
            "ok": self.ok,
            "checks": [r.as_dict() for r in self.results],
        }


# --- reading the lake once per run -------------------------------------------------------------


@dataclass
class _Table:
    table_id: TableId
    spec: TableSpec
    table: DeltaTable
    rows: list[Row]

    @property
    def txn(self) -> int:
        return self.table.transaction_version(APP_ID) or 0

    @property
    def name(self) -> str:
        """The table's name in findings (JSON and CLI output)."""
        return str(self.table_id)

    @property
    def workarea_id(self) -> str | None:
        return self.table_id.workarea_id


class LakeSnapshot:
    """A tenant's tables, each read once at its latest version."""

    def __init__(self, lake: Lake, tenant_id: str):
        self.tenant_id = tenant_id
        self.tables: list[_Table] = []
        for table_id, spec, uri in tenant_tables(lake, tenant_id):
            table = lake.open(uri)
            if table is not None:
                self.tables.append(_Table(table_id, spec, table, read_rows(table, spec)))

    def of(self, spec: TableSpec) -> list[_Table]:
        return [t for t in self.tables if t.spec is spec]

    def one(self, spec: TableSpec) -> _Table | None:
        found = self.of(spec)
        return found[0] if found else None


def _claim_key(row: Row) -> tuple[str, int]:
    return (row["artifact_id"], row["version"])


# --- tenant_id and frontier --------------------------------------------------------------------


def check_tenant_ids(snapshot: LakeSnapshot, spec: TableSpec) -> CheckResult:
    result = CheckResult(spec.name, TENANT_ID, snapshot.tenant_id)
    for t in snapshot.of(spec):
        for row in t.rows:
            result.checked += 1
            if row["tenant_id"] != snapshot.tenant_id:
                key, version = _row_key(spec, row)
                result.add(
                    t.name,
                    key,
                    version,
                    f"row of tenant {row['tenant_id']} under the prefix of {snapshot.tenant_id}",
                )
    return result


def _row_key(spec: TableSpec, row: Row) -> tuple[Any, int | None]:
    if spec is BRONZE_EVENTS:
        return f"journal_seq {row['journal_seq']}", None
    if spec.merge_key == ("artifact_id", "version"):
        return row["artifact_id"], row["version"]
    return row[spec.merge_key[0]], None


def check_frontier(conn: psycopg.Connection, snapshot: LakeSnapshot) -> dict[str, CheckResult]:
    """Per spec name: the frontier cache against each table's Delta txn version."""
    tenant_id = snapshot.tenant_id
    results = {
        spec.name: CheckResult(spec.name, FRONTIER, tenant_id)
        for spec in (BRONZE_EVENTS, SILVER_CLAIMS, GOLD_LINEAGE, GOLD_AREAS, GOLD_CURATED)
    }
    with tenant_scope(conn, tenant_id):
        rows = conn.execute(queries.FRONTIER_BATCH_ENDS, (tenant_id,)).fetchall()
    cache = {TableId.parse(name): (batch_end, txn) for name, batch_end, txn in rows}
    in_lake = {t.table_id: t for t in snapshot.tables}
    for table_id, t in in_lake.items():
        result = results[t.spec.name]
        result.checked += 1
        delta = t.txn
        if table_id not in cache:
            result.add(t.name, None, None, f"Delta txn {delta} but no frontier cache row")
        elif cache[table_id][1] != delta:
            cached = cache[table_id][1]
            why = (
                "the Delta log is behind its cache (a lost or restored table: backfill the tenant)"
                if delta < cached
                else "the cache is behind the Delta log"
            )
            result.add(
                t.name, None, None, f"frontier cache txn {cached} but Delta txn {delta}: {why}"
            )
    for table_id, (_, cached) in cache.items():
        if table_id in in_lake or cached == 0:
            continue
        found = results.get(table_id.spec_name)
        if found is None:
            continue
        result = found
        result.checked += 1
        result.add(
            str(table_id),
            None,
            None,
            f"frontier cache txn {cached} but no Delta table (a lost lake: backfill the tenant)",
        )
    return results


# --- bronze chain ------------------------------------------------------------------------------


def public_keys(
    conn: psycopg.Connection, tenant_id: str | None = None
) -> dict[str, tuple[str, bytes]]:
    """api_key_id -> (owning tenant, raw Ed25519 public key), from oml.api_keys: the keys of
    `tenant_id` (in its scope), or of every tenant (the cross-tenant scope)."""
    with tenant_scope(conn, tenant_id) if tenant_id else cross_scope(conn):
        rows = conn.execute(queries.PUBLIC_KEYS).fetchall()
    return {key_id: (owner, bytes(pub)) for key_id, owner, pub in rows}


def _envelope_disagrees(row: Row, tenant_id: str) -> list[str]:
    """The fields the signed envelope names differently from the bronze row (an envelope that
    is not a JSON object names none)."""
    try:
        envelope = json.loads(row["signed_bytes"])
    except (ValueError, UnicodeDecodeError):
        return []
    if not isinstance(envelope, dict):
        return []
    expected: dict[str, Any] = {
        "tenant_id": tenant_id,
        "journal_seq": row["journal_seq"],
        "event_id": row["event_id"],
        "event_type": row["event_type"],
        "principal": row["principal"],
        "api_key_id": row["api_key_id"],
        "prev_hash": row["prev_hash"].hex(),
        "payload_sha256": hashlib.sha256(row["payload"].encode()).hexdigest(),
        "artifact_id": row["artifact_id"],
        "version": row["version"],
        "workarea_id": row["workarea_id"],
        "simulation_id": row["simulation_id"],
        "provenance": row["provenance"],
    }
    differing = [k for k, v in expected.items() if k in envelope and envelope[k] != v]
    if "at" in envelope:
        try:
            signed_at = dt.datetime.fromisoformat(envelope["at"])
        except (TypeError, ValueError):
            signed_at = None
        if signed_at != row["at"]:
            differing.append("at")
    return sorted(differing)


def check_chain(snapshot: LakeSnapshot, keys: dict[str, tuple[str, bytes]]) -> CheckResult:
    tenant_id = snapshot.tenant_id
    result = CheckResult(BRONZE_EVENTS.name, CHAIN, tenant_id)
    bronze = snapshot.one(BRONZE_EVENTS)
    if bronze is None:
        return result
    name = bronze.name
    rows = sorted(bronze.rows, key=lambda r: (r["journal_seq"], r["outbox_seq"]))
    verifiers: dict[str, Ed25519PublicKey] = {}
    expected = 1
    prev_hash: bytes | None = GENESIS_HASH
    for row in rows:
        result.checked += 1
        seq = row["journal_seq"]
        where = f"journal_seq {seq}"
        if seq < expected:
            result.add(name, where, None, f"a second event at journal_seq {seq}")
            continue
        if seq > expected:
            missing = f"{expected}" if seq == expected + 1 else f"{expected}..{seq - 1}"
            result.add(name, where, None, f"journal_seq {missing} missing before it")
            prev_hash = None  # unknown across a gap
        signed = row["signed_bytes"]
        if hashlib.sha256(row["prev_hash"] + signed).digest() != row["hash"]:
            result.add(name, where, None, "hash is not SHA-256(prev_hash || signed_bytes)")
        if prev_hash is not None and row["prev_hash"] != prev_hash:
            result.add(
                name,
                where,
                None,
                "prev_hash is not the previous event's hash"
                if seq > 1
                else "prev_hash of the first event is not the genesis hash",
            )
        owner = keys.get(row["api_key_id"])
        if owner is None:
            result.add(name, where, None, f"no public key {row['api_key_id']!r} in oml.api_keys")
        elif owner[0] != tenant_id:
            result.add(name, where, None, f"key {row['api_key_id']!r} belongs to {owner[0]}")
        else:
            verifier = verifiers.get(row["api_key_id"])
            if verifier is None:
                verifier = Ed25519PublicKey.from_public_bytes(owner[1])
                verifiers[row["api_key_id"]] = verifier
            try:
                verifier.verify(row["sig"], signed)
            except InvalidSignature:
                result.add(
                    name,
                    where,
                    None,
                    f"sig does not verify over signed_bytes with key {row['api_key_id']!r}",
                )
        differing = _envelope_disagrees(row, tenant_id)
        if differing:
            result.add(name, where, None, f"signed envelope disagrees on {', '.join(differing)}")
        expected, prev_hash = seq + 1, row["hash"]
    return result


# --- silver bodies -----------------------------------------------------------------------------


def check_erased(snapshot: LakeSnapshot, spec: TableSpec) -> CheckResult:
    result = CheckResult(spec.name, ERASED, snapshot.tenant_id)
    for t in snapshot.of(spec):
        for row in t.rows:
            if row["state"] != ERASED_STATE:
                continue
            result.checked += 1
            kept = [c for c in ("body_ciphertext", "attachments") if row[c] is not None]
            if kept:
                result.add(
                    t.name,
                    row["artifact_id"],
                    row["version"],
                    f"erased row still carries {' and '.join(kept)}",
                )
    return result


def _carried_digests(
    snapshot: LakeSnapshot, through: int
) -> dict[tuple[str, int], tuple[int, str]]:
    """(artifact_id, version) -> (journal_seq, ciphertext_digest) of the last bronze event up to
    outbox seq `through` whose payload carries a ciphertext digest for that version."""
    bronze = snapshot.one(BRONZE_EVENTS)
    carried: dict[tuple[str, int], tuple[int, str]] = {}
    if bronze is None:
        return carried
    for row in bronze.rows:
        if row["outbox_seq"] > through or row["artifact_id"] is None:
            continue
        try:
            payload = json.loads(row["payload"])
        except ValueError:
            continue
        if not isinstance(payload, dict):
            continue
        digest = payload.get("ciphertext_digest")
        if digest is None and isinstance(payload.get("row"), dict):
            digest = payload["row"].get("ciphertext_digest")
        if not isinstance(digest, str):
            continue
        key = (row["artifact_id"], row["version"])
        if key not in carried or carried[key][0] < row["journal_seq"]:
            carried[key] = (row["journal_seq"], digest)
    return carried


def check_bodies(snapshot: LakeSnapshot) -> CheckResult:
    result = CheckResult(SILVER_CLAIMS.name, BODIES, snapshot.tenant_id)
    silver = snapshot.one(SILVER_CLAIMS)
    if silver is None:
        return result
    carried = _carried_digests(snapshot, silver.txn)
    for row in silver.rows:
        result.checked += 1
        key = _claim_key(row)
        body = row["body_ciphertext"]
        if body is not None:
            actual = hashlib.sha256(body).hexdigest()
            if actual != row["ciphertext_digest"]:
                result.add(
                    silver.name,
                    key[0],
                    key[1],
                    f"SHA-256(body_ciphertext) is {actual}, ciphertext_digest says "
                    f"{row['ciphertext_digest']}",
                )
        event = carried.get(key)
        if event is None:
            result.add(silver.name, key[0], key[1], "no journal event in bronze carried its digest")
        elif event[1] != row["ciphertext_digest"]:
            result.add(
                silver.name,
                key[0],
                key[1],
                f"ciphertext_digest {row['ciphertext_digest']} but the journal event at "
                f"journal_seq {event[0]} carried {event[1]}",
            )
    return result


# --- dead letters ------------------------------------------------------------------------------


def check_dead_letters(conn: psycopg.Connection, tenant_id: str) -> CheckResult:
    result = CheckResult(SILVER_CLAIMS.name, DEAD_LETTERS, tenant_id)
    with tenant_scope(conn, tenant_id):
        rows = conn.execute(queries.OPEN_DEAD_LETTERS, (tenant_id,)).fetchall()
    for seq, op, payload, reason, refused_at in rows:
        result.checked += 1
        payload = payload if isinstance(payload, dict) else {}
        version = payload.get("version") if isinstance(payload.get("version"), int) else None
        what = f"dead letter seq {seq} ({op}, refused {refused_at:%Y-%m-%dT%H:%M:%SZ}): {reason}"
        if op == "claim.erase":
            what = "erase dead-lettered, an erasure-SLO breach in progress: " + what
        result.add("oml.lake_dead_letter", payload.get("artifact_id"), version, what)
    return result


# --- the outbox fold ---------------------------------------------------------------------------


class _BodyPresence(dict[tuple[Any, ...], bytes]):
    """What the read-only fold knows of a body: PRESENT while oml.claim_bodies holds it,
    UNKNOWN once shredded (the writer may have read it before the shred or not). Both are
    markers, told apart from a body by identity."""

    PRESENT = b"<body present>"
    UNKNOWN = b"<body shredded since>"

    def __init__(self, present: set[tuple[str, int]]):
        super().__init__()
        self.present = present

    def get(self, key: tuple[Any, ...], default: object = None) -> bytes:
        return self.PRESENT if key in self.present else self.UNKNOWN

    def __getitem__(self, key: tuple[Any, ...]) -> bytes:
        return self.get(key)

    def __contains__(self, key: object) -> bool:
        return True


def _stored_bodies(conn: psycopg.Connection, tenant_id: str) -> set[tuple[str, int]]:
    with tenant_scope(conn, tenant_id):
        rows = conn.execute(queries.STORED_BODIES, (tenant_id,)).fetchall()
    return {(a, v) for a, v in rows}


@dataclass
class Fold:
    """The read-only fold's result: rows by key per table, and the ops the writer applied that
    today's catalog refuses to parse (seq, op, reason): rules tightened since they drained."""

    tables: dict[str, dict[RowKey, Row]]
    unparsable: list[tuple[int, str, str]]


def fold_outbox(conn: psycopg.Connection, tenant_id: str, through: dict[str, int]) -> Fold:
    """What the writer's fold makes of the tenant's ops for each table named in `through`
    (table name -> txn version), as rows by key: the ops with seq up to that version, in seq
    order, less the ones recorded as refused."""
    state = TenantState.blank(
        tenant_id,
        bodies=_BodyPresence(_stored_bodies(conn, tenant_id)),
        api_keys={k: owner for k, (owner, _) in public_keys(conn, tenant_id).items()},
        bronze_txn=2**62,  # bronze is checked from itself, not folded
    )
    works = {
        SILVER_CLAIMS.name: state.silver,
        GOLD_LINEAGE.name: state.lineage,
        GOLD_AREAS.name: state.areas,
    }
    pending = sorted((txn, name) for name, txn in through.items() if name in works)
    last = max((txn for txn, _ in pending), default=0)
    with tenant_scope(conn, tenant_id):
        refused = {seq for (seq,) in conn.execute(queries.REFUSED_THROUGH, (tenant_id, last))}
    folded: dict[str, dict[RowKey, Row]] = {}
    unparsed: dict[int, str] = {}  # seq -> op name, of the applied rows that do not parse now

    def take_through(seq: int, _op: object = None) -> None:
        while pending and pending[0][0] < seq:
            _, name = pending.pop(0)
            folded[name] = dict(works[name].rows)

    def parsed(
        stream: Iterable[tuple[Any, ...]],
    ) -> Iterator[tuple[int, catalog.Op | RefusedOp]]:
        for seq, journal_seq, name, payload in stream:
            op = catalog.parsed(
                name, payload, seq=seq, journal_seq=journal_seq, tenant_id=tenant_id
            )
            if isinstance(op, RefusedOp) and seq not in refused:
                unparsed[seq] = name
            yield seq, op

    with tenant_scope(conn, tenant_id):
        stream = conn.cursor().stream(queries.OUTBOX_THROUGH, (tenant_id, last))
        # Every op through `last` is decided (no table records a txn past the decided
        # frontier): the fold skips the recorded refusals and applies the rest unchecked.
        verdicts = catalog.fold(
            parsed(stream), state, decided=last, recorded=refused, on_op=take_through
        )
    take_through(2**63)
    # The writer records every refusal before it commits: these it applied.
    unparsable = [(seq, unparsed[seq], reason) for seq, reason in verdicts.unparsable.items()]
    return Fold(folded, unparsable)


def _body_agrees(lake_body: bytes | None, folded: Any) -> str | None:
    if folded is _BodyPresence.UNKNOWN:
        return None
    if folded is _BodyPresence.PRESENT:
        return None if lake_body is not None else "no body, but oml.claim_bodies holds one"
    if folded is None:
        return None if lake_body is None else "a body the outbox does not fold to"
    return None if lake_body == folded else "a body other than the repair's"


def check_outbox(conn: psycopg.Connection, snapshot: LakeSnapshot) -> dict[str, CheckResult]:
    tenant_id = snapshot.tenant_id
    specs = (SILVER_CLAIMS, GOLD_LINEAGE, GOLD_AREAS)
    results = {spec.name: CheckResult(spec.name, OUTBOX, tenant_id) for spec in specs}
    tables = {spec.name: snapshot.one(spec) for spec in specs}
    through = {name: t.txn for name, t in tables.items() if t is not None}
    fold = fold_outbox(conn, tenant_id, through)
    silver = results[SILVER_CLAIMS.name]
    for seq, name, reason in fold.unparsable:
        silver.add(
            "oml.outbox",
            f"seq {seq}",
            None,
            f"{name} applied by the writer (no dead letter), refused by the catalog now: {reason}",
        )
    for spec in specs:
        t = tables[spec.name]
        if t is None:
            continue
        result = results[spec.name]
        expected = fold.tables.get(spec.name, {})
        actual: dict[RowKey, Row] = {}
        for row in t.rows:
            key = tuple(row[c] for c in spec.merge_key)
            if key in actual:
                result.checked += 1
                result.add(
                    t.name,
                    key[0],
                    key[1] if len(key) > 1 else None,
                    f"a second row for its key (tenant_id {row['tenant_id']}, state "
                    f"{row.get('state', row.get('status'))})",
                )
                continue
            actual[key] = row
        for key in sorted(set(expected) | set(actual), key=repr):
            result.checked += 1
            version = key[1] if len(key) > 1 else None
            mine, theirs = actual.get(key), expected.get(key)
            if theirs is None:
                result.add(
                    t.name,
                    key[0],
                    version,
                    f"a row the outbox through txn {t.txn} does not fold to",
                )
                continue
            if mine is None:
                result.add(
                    t.name, key[0], version, f"missing: the outbox through txn {t.txn} folds to it"
                )
                continue
            differing = [
                c
                for c in spec.columns
                if c not in spec.body_columns and mine.get(c) != theirs.get(c)
            ]
            if differing:
                shown = "; ".join(
                    f"{c} {_show(mine.get(c))} but the outbox folds to {_show(theirs.get(c))}"
                    for c in differing[:3]
                )
                result.add(t.name, key[0], version, shown)
            for c in spec.body_columns:
                wrong = _body_agrees(mine.get(c), theirs.get(c))
                if wrong:
                    result.add(t.name, key[0], version, f"{c}: {wrong}")
    return results


def _show(value: Any) -> str:
    if isinstance(value, dt.datetime):
        return value.isoformat()
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# --- curated -----------------------------------------------------------------------------------

_NOT_COMPARED = ("applied_seq", "curated_at")


def check_curated(snapshot: LakeSnapshot) -> CheckResult:
    result = CheckResult(GOLD_CURATED.name, CURATED, snapshot.tenant_id)
    silver = snapshot.one(SILVER_CLAIMS)
    silver_rows: dict[RowKey, list[Row]] = {}
    for row in silver.rows if silver is not None else []:
        silver_rows.setdefault(_claim_key(row), []).append(row)
    for t in snapshot.of(GOLD_CURATED):
        curated_keys = set()
        for row in t.rows:
            result.checked += 1
            key = _claim_key(row)
            curated_keys.add(key)
            theirs = silver_rows.get(key, [])
            if len(theirs) != 1:
                result.add(t.name, key[0], key[1], f"{len(theirs)} silver rows for this version")
                continue
            differing = [
                c
                for c in SILVER_CLAIMS.columns
                if c not in _NOT_COMPARED and row[c] != theirs[0][c]
            ]
            if differing:
                shown = "; ".join(
                    f"{c} {_show(row[c])} vs silver {_show(theirs[0][c])}"
                    if c != "body_ciphertext"
                    else "body_ciphertext differs from silver's"
                    for c in differing[:3]
                )
                result.add(t.name, key[0], key[1], shown)
        # Promotion into, and reassignment into, a validated area are refused, so every
        # promoted silver row of the area was promoted at its validation.
        for key, rows in silver_rows.items():
            row = rows[0]
            if (
                row["workarea_id"] == t.workarea_id
                and row["state"] == PROMOTED
                and key not in curated_keys
            ):
                result.add(
                    t.name, key[0], key[1], "promoted in silver in this validated area, not curated"
                )
    return result


def check_taint(snapshot: LakeSnapshot) -> CheckResult:
    result = CheckResult(GOLD_CURATED.name, TAINT, snapshot.tenant_id)
    for t in snapshot.of(GOLD_CURATED):
        for row in t.rows:
            result.checked += 1
            if row["simulation_id"] or row["sim_derived_ids"] or row["provenance"] == "simulation":
                result.add(
                    t.name,
                    row["artifact_id"],
                    row["version"],
                    f"simulation-tainted row (simulation_id {row['simulation_id']}, "
                    f"sim_derived_ids {row['sim_derived_ids']}) in a curated table",
                )
    return result


# --- every check -------------------------------------------------------------------------------


def reconcile(
    conn: psycopg.Connection,
    lake: Lake,
    tenant_id: str,
    only: Iterable[tuple[str, str]] | None = None,
) -> Reconciliation:
    """Every check of `CHECKS` (or those in `only`) for one tenant."""
    wanted = set(CHECKS if only is None else only)
    unknown = wanted - set(CHECKS)
    if unknown:
        raise ValueError(f"unknown checks: {sorted(unknown)}")
    snapshot = LakeSnapshot(lake, tenant_id)
    found: dict[tuple[str, str], CheckResult] = {}

    def want(*names: str) -> bool:
        return any(c[1] in names for c in wanted)

    for spec in (BRONZE_EVENTS, SILVER_CLAIMS, GOLD_LINEAGE, GOLD_AREAS, GOLD_CURATED):
        if (spec.name, TENANT_ID) in wanted:
            found[(spec.name, TENANT_ID)] = check_tenant_ids(snapshot, spec)
    if want(FRONTIER):
        for name, r in check_frontier(conn, snapshot).items():
            found[(name, FRONTIER)] = r
    if want(CHAIN):
        found[(BRONZE_EVENTS.name, CHAIN)] = check_chain(snapshot, public_keys(conn, tenant_id))
    for spec in (SILVER_CLAIMS, GOLD_CURATED):
        if (spec.name, ERASED) in wanted:
            found[(spec.name, ERASED)] = check_erased(snapshot, spec)
    if want(BODIES):
        found[(SILVER_CLAIMS.name, BODIES)] = check_bodies(snapshot)
    if want(OUTBOX):
        for name, r in check_outbox(conn, snapshot).items():
            found[(name, OUTBOX)] = r
    if want(DEAD_LETTERS):
        found[(SILVER_CLAIMS.name, DEAD_LETTERS)] = check_dead_letters(conn, tenant_id)
    if want(CURATED):
        found[(GOLD_CURATED.name, CURATED)] = check_curated(snapshot)
    if want(TAINT):
        found[(GOLD_CURATED.name, TAINT)] = check_taint(snapshot)
    return Reconciliation(tenant_id, [found[c] for c in CHECKS if c in wanted])


def record(conn: psycopg.Connection, result: Reconciliation) -> None:
    """Record each check of `result` with its findings count as its tenant's last result (what
    the metrics exporter serves as failed checks); the tenant's other checks keep theirs."""
    names = [f"{r.table}/{r.name}" for r in result.results]
    counts = [len(r.findings) for r in result.results]
    with tenant_scope(conn, result.tenant_id):
        conn.execute(queries.CHECK_RESULTS_RECORD, (result.tenant_id, names, counts))
