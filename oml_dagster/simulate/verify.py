"""Verifying what a producer wrote, from Postgres: the checks a key-less auditor can make.

- The journal chain (`verify_chain`) reads only `oml.outbox` and the public keys in
  `oml.api_keys`: every `journal.event` signed by one of the tenant's keys must verify with that
  key over `signed_bytes`, chain as hash = SHA-256(prev_hash ‖ signed_bytes) from 32 zero bytes,
  and hold journal_seq 1..n once each, its signed envelope agreeing with the payload. Events
  under another tenant's key are counted as foreign (the lake-writer refuses them), not as
  chain members.
- Bodies: each `oml.claim_bodies` ciphertext hashes to the ciphertext_digest of a promotion of
  that version; every promoted lake body is there unless the version was erased.
- Erasure: an erased version has no body and no DEK left (the simulator's key table is read for
  the presence of a key only; `open_bodies` also decrypts bodies to check plaintext digests).
- Validated areas: folding the claim and area ops in journal order, no area is validated while a
  simulation-tainted row in it is promoted or held, nothing is promoted or reassigned into a
  validated area (nor reassigned out of one), and no validated area ends up holding a tainted
  promoted row.

Ops the lake-writer's parser refuses (bad input) are counted and left out of the fold.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import psycopg
from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from oml_dagster.lake.errors import RefusedOp
from oml_dagster.lake.model import catalog

from .producer import GENESIS_HASH, open_body, scalar

MAX_ERRORS = 50
_ENVELOPE_REFS = ("artifact_id", "version", "workarea_id", "simulation_id", "provenance")


@dataclass
class TenantVerification:
    tenant_id: str
    events: int = 0
    foreign_events: int = 0  # journal events under another tenant's key
    refused_rows: int = 0  # rows the op parser refuses (bad input)
    bodies: int = 0
    erased: int = 0
    validated_areas: int = 0
    errors: list[str] = field(default_factory=list)
    suppressed: int = 0

    @property
    def ok(self) -> bool:
        return not self.errors

    def error(self, message: str) -> None:
        if len(self.errors) < MAX_ERRORS:
            self.errors.append(message)
        else:
            self.suppressed += 1

    def summary(self) -> str:
        verdict = "ok" if self.ok else f"{len(self.errors) + self.suppressed} errors"
        return (
            f"tenant {self.tenant_id}: {verdict}; {self.events} chained events, "
            f"{self.foreign_events} foreign, {self.refused_rows} refused rows, "
            f"{self.bodies} bodies, {self.erased} erased, {self.validated_areas} validated areas"
        )


def public_keys(conn: psycopg.Connection) -> dict[str, tuple[str, bytes]]:
    """api_key_id -> (tenant_id, raw Ed25519 public key), from oml.api_keys."""
    rows = conn.execute("SELECT api_key_id, tenant_id::text, public_key FROM oml.api_keys")
    return {key_id: (tenant_id, bytes(pub)) for key_id, tenant_id, pub in rows}


def _outbox(conn: psycopg.Connection, tenant_id: str) -> list[tuple[int, int, str, Any]]:
    return conn.execute(
        "SELECT id, journal_seq, op, payload FROM oml.outbox WHERE tenant_id = %s"
        " ORDER BY journal_seq, id",
        (tenant_id,),
    ).fetchall()


# --- the chain ---------------------------------------------------------------------------------


def _check_chain(
    report: TenantVerification,
    rows: Iterable[tuple[int, int, str, Any]],
    keys: dict[str, tuple[str, bytes]],
) -> None:
    tenant_id = report.tenant_id
    verifiers: dict[str, Ed25519PublicKey] = {}
    expected, prev = 1, GENESIS_HASH
    positions: set[int] = set()
    for row_id, journal_seq, op, payload in rows:
        positions.add(journal_seq)
        if op != "journal.event":
            continue
        where = f"journal.event row {row_id} (journal_seq {journal_seq})"
        key_id = payload.get("api_key_id") if isinstance(payload, dict) else None
        owner = keys.get(key_id) if isinstance(key_id, str) else None
        if owner is None or not isinstance(key_id, str):
            report.error(f"{where}: no public key {key_id!r} in oml.api_keys")
            continue
        if owner[0] != tenant_id:
            report.foreign_events += 1
            continue
        try:
            sig, signed = (
                base64.b64decode(payload["sig"]),
                base64.b64decode(payload["signed_bytes"]),
            )
            prev_hash, chain_hash = (
                base64.b64decode(payload["prev_hash"]),
                base64.b64decode(payload["hash"]),
            )
            envelope = json.loads(signed)
            text = payload["payload"]
        except (KeyError, TypeError, ValueError, binascii.Error) as error:
            report.error(f"{where}: malformed ({error})")
            continue
        verifier = verifiers.get(key_id) or Ed25519PublicKey.from_public_bytes(owner[1])
        verifiers[key_id] = verifier
        try:
            verifier.verify(sig, signed)
        except InvalidSignature:
            report.error(f"{where}: signature does not verify with {key_id}")
        if payload.get("journal_seq") != journal_seq:
            report.error(f"{where}: payload journal_seq {payload.get('journal_seq')}")
        if journal_seq != expected:
            report.error(f"{where}: expected journal_seq {expected}")
        if prev_hash != prev:
            report.error(f"{where}: prev_hash does not match the previous event's hash")
        if chain_hash != hashlib.sha256(prev_hash + signed).digest():
            report.error(f"{where}: hash is not SHA-256(prev_hash || signed_bytes)")
        claims = {
            "tenant_id": tenant_id,
            "journal_seq": journal_seq,
            "prev_hash": prev_hash.hex(),
            "payload_sha256": hashlib.sha256(str(text).encode()).hexdigest(),
            **{
                k: payload.get(k)
                for k in ("event_id", "event_type", "at", "principal", "api_key_id")
            },
            **{k: payload.get(k) for k in _ENVELOPE_REFS},
        }
        differing = sorted(k for k, v in claims.items() if envelope.get(k) != v)
        if differing:
            report.error(f"{where}: signed envelope disagrees on {', '.join(differing)}")
        report.events += 1
        expected, prev = journal_seq + 1, chain_hash
    orphans = sorted(p for p in positions if p >= expected)
    if orphans:
        report.error(f"rows at journal_seq {orphans[:5]} have no journal event before them")


def verify_chain(
    conn: psycopg.Connection, tenant_id: str, keys: dict[str, tuple[str, bytes]] | None = None
) -> TenantVerification:
    """The tenant's journal chain, from oml.outbox and the public keys alone."""
    report = TenantVerification(tenant_id)
    _check_chain(report, _outbox(conn, tenant_id), keys or public_keys(conn))
    return report


# --- bodies, erasure, validated areas ----------------------------------------------------------


def _parsed(report: TenantVerification, rows) -> list[catalog.Op]:
    ops = []
    for _, journal_seq, name, payload in rows:
        if name == "journal.event":
            continue  # the chain check owns events
        try:
            ops.append(
                catalog.parse(
                    name, payload, seq=0, journal_seq=journal_seq, tenant_id=report.tenant_id
                )
            )
        except RefusedOp:
            report.refused_rows += 1
    return ops


def _key(op: catalog.Op) -> tuple[str, int]:
    return (op.args["artifact_id"], op.args["version"])


def _check_bodies(
    conn: psycopg.Connection, report: TenantVerification, ops: list[catalog.Op], open_bodies: bool
) -> None:
    promoted: dict[tuple[str, int], dict[str, Any]] = {}
    erased: set[tuple[str, int]] = set()
    for op in ops:
        if op.name == "claim.promote":
            promoted.setdefault(_key(op), op.args)
        elif op.name == "claim.erase":
            erased.add(_key(op))
    bodies = {
        (a, v): bytes(body)
        for a, v, body in conn.execute(
            "SELECT artifact_id::text, version, body_ciphertext FROM oml.claim_bodies"
            " WHERE tenant_id = %s",
            (report.tenant_id,),
        )
    }
    has_keys = scalar(conn, "SELECT to_regclass('oml_sim.deks')") is not None
    deks: dict[tuple[str, int], bytes | None] = {}
    if has_keys:
        column = "dek" if open_bodies else "NULL"
        deks = {
            (a, v): dek
            for a, v, dek in conn.execute(
                f"SELECT artifact_id::text, version, {column} FROM oml_sim.deks"
                " WHERE tenant_id = %s",
                (report.tenant_id,),
            )
        }
    report.bodies = len(bodies)
    report.erased = len(erased)
    for key, body in sorted(bodies.items()):
        args = promoted.get(key)
        if args is None:
            report.error(f"claim_bodies {key}: no promotion of this version in the outbox")
            continue
        if hashlib.sha256(body).hexdigest() != args["ciphertext_digest"]:
            report.error(f"claim_bodies {key}: ciphertext digest differs from the promotion's")
        dek = deks.get(key) if open_bodies else None
        if dek is not None:
            try:
                plaintext = open_body(body, bytes(dek), *key)
            except InvalidTag:
                report.error(f"claim_bodies {key}: does not decrypt under its DEK")
                continue
            if hashlib.sha256(plaintext).hexdigest() != args["plaintext_digest"]:
                report.error(f"claim_bodies {key}: plaintext digest differs from the promotion's")
    for key, args in sorted(promoted.items()):
        if args["body_ref"] == "lake" and key not in bodies and key not in erased:
            report.error(f"promoted version {key} has no body in claim_bodies")
    for key in sorted(erased):
        if key in bodies:
            report.error(f"erased version {key} still has a body in claim_bodies")
        if key in deks:
            report.error(f"erased version {key} still has a DEK")
    if not has_keys and erased:
        report.error("schema oml_sim is missing: cannot check that erased versions lost their DEK")


@dataclass
class _Row:
    state: str
    workarea_id: str
    simulation_id: str | None
    derived: tuple[str, ...]
    fold_seq: int | None = None

    @property
    def tainted(self) -> bool:
        return bool(self.simulation_id or self.derived)


class _AreaFold:
    """Claim and area ops folded in journal order, as the lake applies them: each op's handler
    in `_AREA_OPS` moves the rows and statuses and reports what breaks a validated area."""

    def __init__(self, report: TenantVerification):
        self.report = report
        self.rows: dict[tuple[str, int], _Row] = {}
        self.status: dict[str, str] = {}

    def validated(self, workarea_id: str) -> bool:
        return self.status.get(workarea_id) == "validated"

    def error(self, op: catalog.Op, message: str) -> None:
        self.report.error(f"journal_seq {op.journal_seq} {op.name}: {message}")

    def promote(self, op: catalog.Op, row: _Row | None) -> None:
        args = op.args
        target = args["workarea_id"] if row is None else row.workarea_id
        if self.validated(target) and (row is None or row.state == "held"):
            self.error(op, f"promotes {_key(op)} into validated workarea {target}")
            if row is None:
                return
        if row is None:
            self.rows[_key(op)] = _Row(
                "promoted",
                target,
                args.get("simulation_id"),
                tuple(args.get("sim_derived_ids") or ()),
            )
        elif row.state == "held":
            row.state = "promoted"

    def demote(self, op: catalog.Op, row: _Row | None) -> None:
        if row is not None and row.state in ("promoted", "held"):
            row.state = "demoted"

    def erase(self, op: catalog.Op, row: _Row | None) -> None:
        if row is not None:
            row.state = "erased"

    def reassign(self, op: catalog.Op, row: _Row | None) -> None:
        if row is None or row.state == "erased":
            return
        target = op.args["workarea_id"]
        if target != row.workarea_id and (
            self.validated(target) or self.validated(row.workarea_id)
        ):
            self.error(
                op,
                f"moves {_key(op)} from {row.workarea_id} to {target} across a validated workarea",
            )
            return
        row.workarea_id = target
        if op.args["held"] and row.state == "promoted":
            row.state = "held"

    def repair(self, op: catalog.Op, row: _Row | None) -> None:
        args = op.args
        if row is not None and row.fold_seq is not None and args["fold_seq"] < row.fold_seq:
            return
        if row is not None and row.state == "erased":
            return
        repaired = args["row"]
        self.rows[_key(op)] = _Row(
            repaired["state"],
            repaired["workarea_id"],
            repaired.get("simulation_id"),
            tuple(repaired.get("sim_derived_ids") or ()),
            args["fold_seq"],
        )

    def simulation_end(self, op: catalog.Op, row: _Row | None) -> None:
        sim = op.args["simulation_id"]
        for each in self.rows.values():
            hit = each.simulation_id == sim or (op.args["demote_tainted"] and sim in each.derived)
            protected = each.fold_seq is not None and op.journal_seq <= each.fold_seq
            if hit and each.state in ("promoted", "held") and not protected:
                each.state = "demoted"

    def upsert_area(self, op: catalog.Op, row: _Row | None) -> None:
        workarea_id = op.args["workarea_id"]
        if workarea_id not in self.status:
            self.status[workarea_id] = op.args.get("status", "development")
        elif "status" in op.args and not self.validated(workarea_id):
            self.status[workarea_id] = op.args["status"]

    def validate(self, op: catalog.Op, row: _Row | None) -> None:
        workarea_id = op.args["workarea_id"]
        if workarea_id not in self.status or self.validated(workarea_id):
            return
        tainted = sorted(
            k
            for k, r in self.rows.items()
            if r.workarea_id == workarea_id and r.tainted and r.state in ("promoted", "held")
        )
        if tainted:
            self.error(
                op,
                f"validates {workarea_id} holding {len(tainted)} simulation-tainted promoted "
                f"or held rows, e.g. {tainted[0]}",
            )
        self.status[workarea_id] = "validated"
        self.report.validated_areas += 1

    def finish(self) -> None:
        for key, row in sorted(self.rows.items()):
            if self.validated(row.workarea_id) and row.tainted and row.state == "promoted":
                self.report.error(
                    f"validated workarea {row.workarea_id} holds tainted promoted row {key}"
                )


# The ops the area fold reads; every other op leaves rows and statuses alone.
_AREA_OPS: dict[str, Callable[[_AreaFold, catalog.Op, _Row | None], None]] = {
    "claim.promote": _AreaFold.promote,
    "claim.demote": _AreaFold.demote,
    "claim.erase": _AreaFold.erase,
    "claim.reassign": _AreaFold.reassign,
    "claim.repair": _AreaFold.repair,
    "simulation.end": _AreaFold.simulation_end,
    "area.upsert": _AreaFold.upsert_area,
    "area.validate": _AreaFold.validate,
}


def _check_areas(report: TenantVerification, ops: list[catalog.Op]) -> None:
    """Fold claim and area ops in journal order, as the lake applies them. A claim op at or
    below its row's fold_seq (a reconciler repair) is too old and changes nothing."""
    fold = _AreaFold(report)
    for op in ops:
        handle = _AREA_OPS.get(op.name)
        if handle is None:
            continue
        row = fold.rows.get(_key(op)) if op.name.startswith("claim.") else None
        stale = row is not None and row.fold_seq is not None and op.journal_seq <= row.fold_seq
        if stale and op.name != "claim.repair":
            continue
        handle(fold, op, row)
    fold.finish()


def verify_tenant(
    conn: psycopg.Connection,
    tenant_id: str,
    *,
    keys: dict[str, tuple[str, bytes]] | None = None,
    open_bodies: bool = False,
) -> TenantVerification:
    """Every check of this module for one tenant."""
    report = TenantVerification(tenant_id)
    rows = _outbox(conn, tenant_id)
    _check_chain(report, rows, keys or public_keys(conn))
    ops = _parsed(report, rows)
    _check_bodies(conn, report, ops, open_bodies)
    _check_areas(report, ops)
    return report


def verify(
    conn: psycopg.Connection, tenant_ids: list[str] | None = None, *, open_bodies: bool = False
) -> list[TenantVerification]:
    """Verify the named tenants, or every tenant with an api key."""
    keys = public_keys(conn)
    if tenant_ids is None:
        tenant_ids = sorted({tenant for tenant, _ in keys.values()})
    return [verify_tenant(conn, t, keys=keys, open_bodies=open_bodies) for t in tenant_ids]
