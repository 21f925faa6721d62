"""The acts of the op catalog (DESIGN §2), each committed as the OML service would: its outbox
op, its journal event, and its domain rows (claim bodies, crypto-shred).

Each op has one builder (`*_act`) returning an uncommitted `Act`, the one place its payload is
shaped; the functions named after the acts commit one right away, and the workload generator
batches the builders' acts (both through `commit_acts`)."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, Concatenate, ParamSpec

import psycopg

from .producer import Act, Body, Event, TenantKeys, commit_acts, instant, seal

P = ParamSpec("P")


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _as_payload(record: Any) -> dict[str, Any]:
    """Every field of a claim or edge, under its column name, instants as the journal writes
    them: the op payload the producer signs."""
    out = {}
    for f in fields(record):
        value = getattr(record, f.name)
        out[f.name] = instant(value) if isinstance(value, dt.datetime) else value
    return out


@dataclass
class Claim:
    """A claim version as submitted: every silver column that comes from the submission."""

    artifact_id: str
    version: int
    workarea_id: str
    workarea_path_at_write: str
    claim_key: str = field(default_factory=lambda: str(uuid.uuid4()))
    kind: str = "memory"
    writer_identity: str = "agent:writer"
    principal: str = "agent:writer"
    producer: str | None = None
    provenance: str = "agent"
    simulation_id: str | None = None
    sim_derived_ids: list[str] | None = None
    body_ref: str = "lake"
    attachments: list[dict[str, Any]] | None = None
    created_at: dt.datetime = field(default_factory=_now)
    promoted_at: dt.datetime = field(default_factory=_now)
    plaintext_digest: str = ""
    ciphertext_digest: str = ""

    def payload(self, self_signed: bool = False) -> dict[str, Any]:
        return {**_as_payload(self), "self_signed": self_signed}

    def event(self, event_type: str, payload: dict) -> Event:
        return Event(
            event_type,
            payload,
            artifact_id=self.artifact_id,
            version=self.version,
            workarea_id=self.workarea_id,
            simulation_id=self.simulation_id,
            provenance=self.provenance,
        )


@dataclass
class Edge:
    edge_id: str
    src_id: str
    dst_id: str
    graph: str = "claim"
    edge_label: str = "derives_from"
    src_version: int | None = 1
    dst_version: int | None = 1
    proposer: str = "key:proposer"
    ratifier: str = "key:ratifier"
    simulation_id: str | None = None
    proposed_at: dt.datetime = field(default_factory=_now)
    ratified_at: dt.datetime = field(default_factory=_now)

    def payload(self) -> dict[str, Any]:
        return _as_payload(self)


def _digest_payload(payload: dict) -> dict:
    # The journal holds digests and references only: never a body.
    return {k: v for k, v in payload.items() if k != "body_ciphertext"}


def _commit(
    conn: psycopg.Connection,
    keys: TenantKeys,
    act: Act,
    *,
    at: dt.datetime | None = None,
    **hooks: Any,
) -> int:
    """Commit one act, its journal event at `at`; a `before_lock` hook runs once the
    transaction holds its xid (for tests of the stable-prefix cut)."""
    act.at = at
    (journal_seq,) = commit_acts(conn, keys, [act], early_xid="before_lock" in hooks, **hooks)
    return journal_seq


# --- builders: one per op ----------------------------------------------------------------------


def promote_act(
    claim: Claim, body: Body | None = None, *, self_signed: bool = False, store_body: bool = True
) -> Act:
    """A promotion; with body_ref lake its sealed body goes to oml.claim_bodies."""
    if body is not None:
        claim.plaintext_digest = body.plaintext_digest
        claim.ciphertext_digest = body.ciphertext_digest
    stored = [body] if (body is not None and claim.body_ref == "lake" and store_body) else []
    payload = claim.payload(self_signed)
    return Act(
        claim.event("claim.promoted", _digest_payload(payload)),
        [("claim.promote", payload)],
        store_bodies=stored,
    )


def repromote_act(claim: Claim) -> Act:
    """A new promotion of a version the lake holds (held -> promoted): its body is already
    in oml.claim_bodies, so nothing is stored again."""
    payload = claim.payload()
    return Act(claim.event("claim.promoted", payload), [("claim.promote", payload)])


def _retract_act(op: str, event_type: str, claim: Claim, at, shred=()) -> Act:
    payload = {
        "artifact_id": claim.artifact_id,
        "version": claim.version,
        "at": instant(at or _now()),
    }
    return Act(claim.event(event_type, payload), [(op, payload)], shred=list(shred))


def demote_act(claim: Claim, at: dt.datetime | None = None) -> Act:
    return _retract_act("claim.demote", "claim.demoted", claim, at)


def erase_act(claim: Claim, at: dt.datetime | None = None) -> Act:
    """Crypto-shred: the DEK and the claim_bodies row are destroyed in the same act."""
    shred = [(claim.artifact_id, claim.version)]
    return _retract_act("claim.erase", "claim.erased", claim, at, shred=shred)


def reassign_act(claim: Claim, workarea_id: str, held: bool, at: dt.datetime | None = None) -> Act:
    """A move to `workarea_id` (the journal event names the area it leaves); the caller
    updates `claim.workarea_id` once the act is committed or queued."""
    payload = {
        "artifact_id": claim.artifact_id,
        "version": claim.version,
        "workarea_id": workarea_id,
        "held": held,
        "at": instant(at or _now()),
    }
    return Act(claim.event("lifecycle.reassign", payload), [("claim.reassign", payload)])


def repair_act(claim: Claim, fold_seq: int, state: str) -> Act:
    row = claim.payload()
    del row["self_signed"]
    row.update(state=state, retracted_at=None)
    payload = {
        "artifact_id": claim.artifact_id,
        "version": claim.version,
        "fold_seq": fold_seq,
        "row": row,
    }
    return Act(claim.event("reconciler.repair", payload), [("claim.repair", payload)])


def simulation_end_act(
    simulation_id: str, demote_tainted: bool, at: dt.datetime | None = None
) -> Act:
    payload = {
        "simulation_id": simulation_id,
        "at": instant(at or _now()),
        "demote_tainted": demote_tainted,
    }
    event = Event("simulation.ended", payload, simulation_id=simulation_id, provenance="simulation")
    return Act(event, [("simulation.end", payload)])


def ratify_act(edge: Edge) -> Act:
    payload = edge.payload()
    return Act(
        Event("edge.ratified", payload, simulation_id=edge.simulation_id),
        [("edge.ratify", payload)],
    )


def demote_edge_act(edge_id: str, at: dt.datetime | None = None) -> Act:
    payload = {"edge_id": edge_id, "at": instant(at or _now())}
    return Act(Event("edge.demoted", payload), [("edge.demote", payload)])


def upsert_area_act(workarea_id: str, at: dt.datetime | None = None, **columns: Any) -> Act:
    payload = {"workarea_id": workarea_id, "at": instant(at or _now())}
    for name, value in columns.items():
        payload[name] = instant(value) if isinstance(value, dt.datetime) else value
    return Act(
        Event("workarea.updated", payload, workarea_id=workarea_id), [("area.upsert", payload)]
    )


def reparent_area_act(
    workarea_id: str, parent_id: str, path: str, at: dt.datetime | None = None
) -> Act:
    payload = {
        "workarea_id": workarea_id,
        "parent_id": parent_id,
        "path": path,
        "at": instant(at or _now()),
    }
    return Act(
        Event("workarea.reparented", payload, workarea_id=workarea_id),
        [("area.reparent", payload)],
    )


def validate_area_act(workarea_id: str, at: dt.datetime | None = None) -> Act:
    payload = {"workarea_id": workarea_id, "at": instant(at or _now())}
    return Act(
        Event("workarea.validated", payload, workarea_id=workarea_id),
        [("area.validate", payload)],
    )


# --- acts committed one at a time ----------------------------------------------------------------


def _committed(
    build: Callable[P, Act],
) -> Callable[Concatenate[psycopg.Connection, TenantKeys, P], int]:
    """`build`'s act committed right away under the tenant's `keys`; returns its journal_seq."""

    def commit(
        conn: psycopg.Connection, keys: TenantKeys, *args: P.args, **kwargs: P.kwargs
    ) -> int:
        return _commit(conn, keys, build(*args, **kwargs))

    commit.__name__ = build.__name__.removesuffix("_act")
    commit.__doc__ = build.__doc__
    return commit


def promote(
    conn: psycopg.Connection,
    keys: TenantKeys,
    claim: Claim,
    plaintext: bytes | None = None,
    *,
    self_signed: bool = False,
    store_body: bool = True,
    body: Body | None = None,
    **act: Any,
) -> Body | None:
    """Promote a claim version; with body_ref lake its sealed body goes to oml.claim_bodies."""
    if body is None and plaintext is not None:
        body = seal(claim.artifact_id, claim.version, plaintext)
    _commit(
        conn, keys, promote_act(claim, body, self_signed=self_signed, store_body=store_body), **act
    )
    return body


def reassign(
    conn: psycopg.Connection,
    keys: TenantKeys,
    claim: Claim,
    workarea_id: str,
    held: bool,
    at: dt.datetime | None = None,
) -> int:
    """A move to `workarea_id`; `claim.workarea_id` follows it once committed."""
    journal_seq = _commit(conn, keys, reassign_act(claim, workarea_id, held, at))
    claim.workarea_id = workarea_id
    return journal_seq


repromote = _committed(repromote_act)
demote = _committed(demote_act)
erase = _committed(erase_act)
repair = _committed(repair_act)
simulation_end = _committed(simulation_end_act)
ratify = _committed(ratify_act)
demote_edge = _committed(demote_edge_act)
upsert_area = _committed(upsert_area_act)
reparent_area = _committed(reparent_area_act)
validate_area = _committed(validate_area_act)


def depart(conn: psycopg.Connection, keys: TenantKeys, at: dt.datetime | None = None) -> int:
    """The tenant leaves (DESIGN "A tenant's departure"): its last journalled act, a
    `tenant.departed` event (no lake op besides its bronze row), and `tenant_policy.departed_at`
    set in the same transaction."""
    when = at or _now()
    event = Event("tenant.departed", {"at": instant(when)})

    def mark(connection: psycopg.Connection) -> None:
        connection.execute(
            "UPDATE oml.tenant_policy SET departed_at = %s WHERE tenant_id = %s",
            (when, keys.tenant_id),
        )

    return _commit(conn, keys, Act(event, []), at=when, before_commit=mark)
