"""One act as the OML service commits it: domain rows, a signed hash-chained journal event and
the outbox rows, in one Postgres transaction that holds the tenant's chain head lock from the
append until commit.

The simulator's own keys (Ed25519 signing keys, per-artifact DEKs) live in schema `oml_sim`,
which the lake-writer never reads: it is key-less by construction.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import os
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, LiteralString

import psycopg
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

GENESIS_HASH = bytes(32)

SIM_SCHEMA = """
CREATE SCHEMA IF NOT EXISTS oml_sim;
CREATE TABLE IF NOT EXISTS oml_sim.chain_head (
    tenant_id   uuid PRIMARY KEY,
    journal_seq bigint NOT NULL,
    hash        bytea  NOT NULL
);
CREATE TABLE IF NOT EXISTS oml_sim.signing_keys (
    api_key_id  text PRIMARY KEY,
    tenant_id   uuid  NOT NULL,
    private_key bytea NOT NULL
);
CREATE TABLE IF NOT EXISTS oml_sim.deks (
    tenant_id   uuid   NOT NULL,
    artifact_id uuid   NOT NULL,
    version     bigint NOT NULL,
    dek         bytea  NOT NULL,
    PRIMARY KEY (tenant_id, artifact_id, version)
);
"""


def canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def instant(at: dt.datetime) -> str:
    return at.astimezone(dt.UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def scalar(conn: psycopg.Connection, query: LiteralString, params: tuple[Any, ...] = ()) -> Any:
    """The one value a query of one row and one column returns (a count, a function's)."""
    row = conn.execute(query, params).fetchone()
    if row is None:
        raise LookupError(f"no row from {query!r}")
    return row[0]


def ensure_schema(conn: psycopg.Connection) -> None:
    with conn.transaction():
        conn.execute(SIM_SCHEMA)


@dataclass(frozen=True)
class TenantKeys:
    tenant_id: str
    api_key_id: str
    private_key: Ed25519PrivateKey
    principal: str

    @property
    def public_key(self) -> bytes:
        return self.private_key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def create_tenant(
    conn: psycopg.Connection,
    tenant_id: str | None = None,
    *,
    erasure_bound: dt.timedelta | None = None,
    key_seed: bytes | None = None,
    principal: str = "agent:writer",
) -> TenantKeys:
    """A tenant with one api key, its policy and a genesis chain head."""
    tenant_id = tenant_id or str(uuid.uuid4())
    seed = key_seed or os.urandom(32)
    private = Ed25519PrivateKey.from_private_bytes(hashlib.sha256(seed).digest())
    keys = TenantKeys(tenant_id, f"key-{tenant_id[:8]}-{seed.hex()[:8]}", private, principal)
    with conn.transaction():
        conn.execute(
            "INSERT INTO oml.api_keys (api_key_id, tenant_id, public_key) VALUES (%s, %s, %s)",
            (keys.api_key_id, tenant_id, keys.public_key),
        )
        conn.execute(
            "INSERT INTO oml_sim.signing_keys (api_key_id, tenant_id, private_key) VALUES (%s, %s, %s)",
            (keys.api_key_id, tenant_id, hashlib.sha256(seed).digest()),
        )
        conn.execute(
            "INSERT INTO oml.tenant_policy (tenant_id, lake_erasure_bound)"
            " VALUES (%s, COALESCE(%s, interval '7 days'))",
            (tenant_id, erasure_bound),
        )
        conn.execute(
            "INSERT INTO oml_sim.chain_head (tenant_id, journal_seq, hash) VALUES (%s, 0, %s)",
            (tenant_id, GENESIS_HASH),
        )
    return keys


def load_tenant(
    conn: psycopg.Connection, tenant_id: str, principal: str = "agent:writer"
) -> TenantKeys:
    """The keys of a tenant `create_tenant` made earlier (its first api key), to act for it
    again."""
    row = conn.execute(
        "SELECT api_key_id, private_key FROM oml_sim.signing_keys WHERE tenant_id = %s"
        " ORDER BY api_key_id LIMIT 1",
        (tenant_id,),
    ).fetchone()
    if row is None:
        raise LookupError(f"tenant {tenant_id} has no signing key in oml_sim.signing_keys")
    private = Ed25519PrivateKey.from_private_bytes(bytes(row[1]))
    return TenantKeys(tenant_id, row[0], private, principal)


@dataclass
class Body:
    """A claim body sealed under a fresh per-artifact DEK."""

    artifact_id: str
    version: int
    ciphertext: bytes
    dek: bytes
    plaintext_digest: str

    @property
    def ciphertext_digest(self) -> str:
        return sha256_hex(self.ciphertext)


def seal(
    artifact_id: str,
    version: int,
    plaintext: bytes,
    dek: bytes | None = None,
    nonce: bytes | None = None,
) -> Body:
    dek = dek or AESGCM.generate_key(bit_length=256)
    nonce = nonce or os.urandom(12)
    ciphertext = nonce + AESGCM(dek).encrypt(nonce, plaintext, f"{artifact_id}:{version}".encode())
    return Body(artifact_id, version, ciphertext, dek, sha256_hex(plaintext))


def open_body(body_ciphertext: bytes, dek: bytes, artifact_id: str, version: int) -> bytes:
    nonce, sealed = body_ciphertext[:12], body_ciphertext[12:]
    return AESGCM(dek).decrypt(nonce, sealed, f"{artifact_id}:{version}".encode())


@dataclass
class Event:
    """The journal event of an act; `refs` fill bronze's extracted columns."""

    event_type: str
    payload: dict[str, Any]
    artifact_id: str | None = None
    version: int | None = None
    workarea_id: str | None = None
    simulation_id: str | None = None
    provenance: str | None = None


class ChainOrderError(RuntimeError):
    """An act reached the chain head at another position than the one it was generated for:
    acts of one tenant were committed out of their logical order."""


def journal_entry(
    signer: TenantKeys,
    tenant_id: str,
    journal_seq: int,
    prev_hash: bytes,
    event: Event,
    at: dt.datetime,
    event_id: str,
    payload_text: str | None = None,
) -> tuple[dict[str, Any], bytes]:
    """The `journal.event` payload of an act at `journal_seq` after `prev_hash`, signed by
    `signer`, and its chain hash. `signed_bytes` carries digests and references only."""
    if payload_text is None:
        payload_text = canonical(event.payload).decode()
    envelope = {
        "tenant_id": tenant_id,
        "journal_seq": journal_seq,
        "event_id": event_id,
        "event_type": event.event_type,
        "at": instant(at),
        "principal": signer.principal,
        "api_key_id": signer.api_key_id,
        "prev_hash": prev_hash.hex(),
        "payload_sha256": sha256_hex(payload_text.encode()),
        "artifact_id": event.artifact_id,
        "version": event.version,
        "workarea_id": event.workarea_id,
        "simulation_id": event.simulation_id,
        "provenance": event.provenance,
    }
    signed_bytes = canonical(envelope)
    sig = signer.private_key.sign(signed_bytes)
    chain_hash = hashlib.sha256(prev_hash + signed_bytes).digest()
    payload = {
        "journal_seq": journal_seq,
        "event_id": event_id,
        "event_type": event.event_type,
        "at": instant(at),
        "prev_hash": b64(prev_hash),
        "hash": b64(chain_hash),
        "sig": b64(sig),
        "signed_bytes": b64(signed_bytes),
        "payload": payload_text,
        "principal": signer.principal,
        "api_key_id": signer.api_key_id,
        "artifact_id": event.artifact_id,
        "version": event.version,
        "workarea_id": event.workarea_id,
        "simulation_id": event.simulation_id,
        "provenance": event.provenance,
    }
    return payload, chain_hash


@dataclass
class Forgery:
    """A second journal event for an act, signed with another tenant's key: bad input the
    lake-writer must refuse (wrong tenant). `marks` are extra payload fields (outside the
    signed envelope) that label it."""

    signer: TenantKeys
    event_id: str
    marks: dict[str, Any] = field(default_factory=dict)


@dataclass
class Act:
    """One act ready to commit: its journal event, its outbox ops and its domain rows.

    `journal_seq`, when set, is the chain position the act was generated for; committing it
    anywhere else raises `ChainOrderError`. `keep_deks` are DEKs of bodies stored outside
    `claim_bodies` (body_ref object): kept in the simulator's key table only. `at` is the
    journal event's instant (the commit's wall clock when None)."""

    event: Event
    ops: list[tuple[str, dict[str, Any]]]
    store_bodies: list[Body] = field(default_factory=list)
    keep_deks: list[Body] = field(default_factory=list)
    shred: list[tuple[str, int]] = field(default_factory=list)
    event_id: str | None = None
    journal_seq: int | None = None
    forgeries: list[Forgery] = field(default_factory=list)
    at: dt.datetime | None = None

    @property
    def rows(self) -> int:
        """Outbox rows the act writes."""
        return len(self.ops) + 1 + len(self.forgeries)


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def commit_acts(
    conn: psycopg.Connection,
    keys: TenantKeys,
    acts: Sequence[Act],
    *,
    early_xid: bool = False,
    before_lock: Callable[[psycopg.Connection], None] | None = None,
    after_lock: Callable[[psycopg.Connection], None] | None = None,
    before_commit: Callable[[psycopg.Connection], None] | None = None,
) -> list[int]:
    """Commit consecutive acts of one tenant (one or more) in one transaction holding the chain
    head lock; returns their journal_seqs. The contract allows it: the acts' rows become visible together
    and the chain stays in journal order. Rows go in with COPY.

    With `early_xid` the transaction takes its xid before `before_lock` runs, i.e. before it
    waits for the chain head lock; `after_lock` runs once the lock is held; `before_commit`
    runs with every row written and the lock still held."""
    tenant_id = keys.tenant_id
    seqs: list[int] = []
    with conn.transaction():
        if early_xid:
            conn.execute("SELECT txid_current()")
        if before_lock is not None:
            before_lock(conn)
        head = conn.execute(
            "SELECT journal_seq, hash FROM oml_sim.chain_head WHERE tenant_id = %s FOR UPDATE",
            (tenant_id,),
        ).fetchone()
        if head is None:
            raise LookupError(f"tenant {tenant_id} has no chain head: create the tenant first")
        if after_lock is not None:
            after_lock(conn)
        journal_seq, prev_hash = head[0], bytes(head[1])
        outbox: list[tuple] = []
        bodies: list[tuple] = []
        deks: list[tuple] = []
        shreds: list[tuple[str, int]] = []
        for act in acts:
            journal_seq += 1
            if act.journal_seq is not None and act.journal_seq != journal_seq:
                raise ChainOrderError(
                    f"tenant {tenant_id}: act generated for journal_seq {act.journal_seq} "
                    f"reached the chain head at {journal_seq}"
                )
            at = act.at or dt.datetime.now(dt.UTC)
            payload_text = canonical(act.event.payload).decode()
            entry, chain_hash = journal_entry(
                keys,
                tenant_id,
                journal_seq,
                prev_hash,
                act.event,
                at,
                act.event_id or str(uuid.uuid4()),
                payload_text,
            )
            for op, payload in act.ops:
                # Most acts journal exactly their op's payload: serialize it once.
                text = payload_text if payload == act.event.payload else _json(payload)
                outbox.append((tenant_id, journal_seq, op, text))
            for forgery in act.forgeries:
                forged, _ = journal_entry(
                    forgery.signer,
                    tenant_id,
                    journal_seq,
                    prev_hash,
                    act.event,
                    at,
                    forgery.event_id,
                    payload_text,
                )
                outbox.append(
                    (tenant_id, journal_seq, "journal.event", _json({**forged, **forgery.marks}))
                )
            outbox.append((tenant_id, journal_seq, "journal.event", _json(entry)))
            for body in act.store_bodies:
                bodies.append((tenant_id, body.artifact_id, body.version, body.ciphertext))
                deks.append((tenant_id, body.artifact_id, body.version, body.dek))
            for body in act.keep_deks:
                deks.append((tenant_id, body.artifact_id, body.version, body.dek))
            shreds.extend(act.shred)
            seqs.append(journal_seq)
            prev_hash = chain_hash
        with conn.cursor() as cur:
            _copy(cur, "oml.outbox (tenant_id, journal_seq, op, payload)", outbox)
            _copy(
                cur, "oml.claim_bodies (tenant_id, artifact_id, version, body_ciphertext)", bodies
            )
            _copy(cur, "oml_sim.deks (tenant_id, artifact_id, version, dek)", deks)
            if shreds:
                # Crypto-shred after the inserts: a body stored and erased in one batch is gone.
                artifacts, versions = zip(*shreds, strict=True)
                for table in ("oml_sim.deks", "oml.claim_bodies"):
                    cur.execute(
                        f"DELETE FROM {table} t USING unnest(%s::uuid[], %s::bigint[])"
                        " AS k(artifact_id, version) WHERE t.tenant_id = %s"
                        " AND t.artifact_id = k.artifact_id AND t.version = k.version",
                        (list(artifacts), list(versions), tenant_id),
                    )
        if seqs:
            conn.execute(
                "UPDATE oml_sim.chain_head SET journal_seq = %s, hash = %s WHERE tenant_id = %s",
                (journal_seq, prev_hash, tenant_id),
            )
        if before_commit is not None:
            before_commit(conn)
    return seqs


def _copy(cur: psycopg.Cursor, target: str, rows: list[tuple]) -> None:
    if not rows:
        return
    with cur.copy(f"COPY {target} FROM STDIN") as copy:
        for row in rows:
            copy.write_row(row)
