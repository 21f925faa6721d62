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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from psycopg.types.json import Jsonb

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


def commit_act(
    conn: psycopg.Connection,
    keys: TenantKeys,
    event: Event,
    ops: list[tuple[str, dict[str, Any]]],
    *,
    at: dt.datetime | None = None,
    store_bodies: list[Body] = (),
    shred: list[tuple[str, int]] = (),
    event_id: str | None = None,
    before_lock: Callable[[psycopg.Connection], None] | None = None,
    before_commit: Callable[[psycopg.Connection], None] | None = None,
) -> int:
    """Commit one act; returns its journal_seq. `before_lock` runs after the transaction has
    taken its xid and before it waits for the chain head lock; `before_commit` runs while the
    lock is held (both for tests of the stable-prefix cut)."""
    with conn.transaction():
        if before_lock is not None:
            conn.execute("SELECT txid_current()")
            before_lock(conn)
        head = conn.execute(
            "SELECT journal_seq, hash FROM oml_sim.chain_head WHERE tenant_id = %s FOR UPDATE",
            (keys.tenant_id,),
        ).fetchone()
        journal_seq, prev_hash = head[0] + 1, bytes(head[1])
        at = at or dt.datetime.now(dt.UTC)
        payload_text = canonical(event.payload).decode()
        event_id = event_id or str(uuid.uuid4())
        envelope = {
            "tenant_id": keys.tenant_id,
            "journal_seq": journal_seq,
            "event_id": event_id,
            "event_type": event.event_type,
            "at": instant(at),
            "principal": keys.principal,
            "api_key_id": keys.api_key_id,
            "prev_hash": prev_hash.hex(),
            "payload_sha256": sha256_hex(payload_text.encode()),
            "artifact_id": event.artifact_id,
            "version": event.version,
            "workarea_id": event.workarea_id,
            "simulation_id": event.simulation_id,
            "provenance": event.provenance,
        }
        signed_bytes = canonical(envelope)
        sig = keys.private_key.sign(signed_bytes)
        chain_hash = hashlib.sha256(prev_hash + signed_bytes).digest()
        journal_payload = {
            "journal_seq": journal_seq,
            "event_id": event_id,
            "event_type": event.event_type,
            "at": instant(at),
            "prev_hash": b64(prev_hash),
            "hash": b64(chain_hash),
            "sig": b64(sig),
            "signed_bytes": b64(signed_bytes),
            "payload": payload_text,
            "principal": keys.principal,
            "api_key_id": keys.api_key_id,
            "artifact_id": event.artifact_id,
            "version": event.version,
            "workarea_id": event.workarea_id,
            "simulation_id": event.simulation_id,
            "provenance": event.provenance,
        }
        for body in store_bodies:
            conn.execute(
                "INSERT INTO oml.claim_bodies (tenant_id, artifact_id, version, body_ciphertext)"
                " VALUES (%s, %s, %s, %s)",
                (keys.tenant_id, body.artifact_id, body.version, body.ciphertext),
            )
            conn.execute(
                "INSERT INTO oml_sim.deks (tenant_id, artifact_id, version, dek) VALUES (%s, %s, %s, %s)",
                (keys.tenant_id, body.artifact_id, body.version, body.dek),
            )
        for artifact_id, version in shred:
            for table in ("oml_sim.deks", "oml.claim_bodies"):
                conn.execute(
                    f"DELETE FROM {table} WHERE tenant_id = %s AND artifact_id = %s AND version = %s",
                    (keys.tenant_id, artifact_id, version),
                )
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO oml.outbox (tenant_id, journal_seq, op, payload) VALUES (%s, %s, %s, %s)",
                [(keys.tenant_id, journal_seq, op, Jsonb(p)) for op, p in ops]
                + [(keys.tenant_id, journal_seq, "journal.event", Jsonb(journal_payload))],
            )
        conn.execute(
            "UPDATE oml_sim.chain_head SET journal_seq = %s, hash = %s WHERE tenant_id = %s",
            (journal_seq, chain_hash, keys.tenant_id),
        )
        if before_commit is not None:
            before_commit(conn)
    return journal_seq
