"""The op catalog (DESIGN §2): for each outbox op, its payload fields, the rules that refuse it,
and what it does to each table. Adding an op is one `OpSpec` in `CATALOG`; a new kind of field is
one parser in the first section.

Every op is handled in two steps. `parse` is stateless and runs for every op. `check` reads the
tables as of the op and raises `RefusedOp`; it runs only while an op's verdict is still open
(a verdict once recorded is reused, see `writer`). `apply` changes the working tables; it is
written to be harmless on a table that already holds the op's effect.

`fold` runs the three over a sequence of ops: the one fold the writer commits and the
reconciler compares (ADR 0050).

Why one file: the catalog is one table of rules. Every op's fields, check and effect sit side
by side because the rules refer to each other (a retract after a promote, a held reassign, an
erase of a retracted claim); split by op, those cross-op rules would be read across files.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import datetime as dt
import json
import re
from collections.abc import Callable, Container, Iterable
from dataclasses import dataclass
from typing import Any

from oml_dagster.lake.errors import RefusedOp
from oml_dagster.lake.model.tables import (
    AREA_STATUSES,
    BODY_REFS,
    CLAIM_STATES,
    DEMOTED,
    EDGE_LABELS,
    ERASED,
    GRAPHS,
    HELD,
    PROMOTED,
    PROVENANCES,
    SILVER_CLAIMS,
    ClaimState,
    Key,
    KeyedWork,
    Row,
    TenantState,
    area_descendants,
)

# --- payload fields ----------------------------------------------------------------------------
# Each parser turns a JSON value into the lake's type or raises `RefusedOp` naming the field
# (DESIGN §2: binaries base64, digests lowercase hex, instants RFC 3339 UTC).

# \Z, not $: $ also matches before a final newline.
_HEX64 = re.compile(r"^[0-9a-f]{64}\Z")
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\Z")
# RFC 3339 date-time (section 5.6): full date, "T", full time, fraction optional, offset required.
# fromisoformat alone also takes ISO 8601 forms RFC 3339 does not (week dates, basic format).
_RFC3339 = re.compile(
    r"^[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?([Zz]|[+-][0-9]{2}:[0-9]{2})\Z"
)
# One ltree label (PostgreSQL 15: letters, digits and underscores).
_LTREE_LABEL = re.compile(r"^[A-Za-z0-9_]{1,256}\Z")
_MISSING = object()


def _show(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def _fail(field: str, expected: str, value: Any) -> RefusedOp:
    return RefusedOp(f"field '{field}': expected {expected}, got {_show(value)}")


def text(field: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise _fail(field, "a non-empty string", value)
    return value


def uuid_text(field: str, value: Any) -> str:
    # Exactly the strings str(uuid.UUID(value)) gives back unchanged: 8-4-4-4-12 lowercase hex.
    if isinstance(value, str) and _UUID.match(value):
        return value
    raise _fail(field, "a UUID in lowercase text", value)


def integer(field: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(field, "an integer", value)
    return value


def non_negative(field: str, value: Any) -> int:
    number = integer(field, value)
    if number < 0:
        raise _fail(field, "an integer >= 0", value)
    return number


def positive(field: str, value: Any) -> int:
    number = integer(field, value)
    if number < 1:
        raise _fail(field, "an integer >= 1", value)
    return number


def boolean(field: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise _fail(field, "true or false", value)
    return value


def instant(field: str, value: Any) -> dt.datetime:
    if isinstance(value, str) and _RFC3339.match(value):
        try:
            parsed = dt.datetime.fromisoformat(value.upper())
        except ValueError:
            parsed = None
        if parsed is not None and parsed.tzinfo is not None:
            return parsed.astimezone(dt.UTC)
    raise _fail(field, "an RFC 3339 instant with a UTC offset", value)


def b64(field: str, value: Any) -> bytes:
    if isinstance(value, str):
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            pass
    raise _fail(field, "base64 bytes", value)


def b64_sized(size: int | None = None) -> Callable[[str, Any], bytes]:
    """Non-empty base64 bytes, exactly `size` of them when given (chain hashes, signatures)."""

    def parse(field: str, value: Any) -> bytes:
        data = b64(field, value)
        if not data or (size is not None and len(data) != size):
            raise _fail(field, f"base64 of {size or 'at least 1'} bytes", value)
        return data

    return parse


def ltree_path(field: str, value: Any) -> str:
    """A workarea path: ltree labels joined by dots."""
    if isinstance(value, str) and all(_LTREE_LABEL.match(label) for label in value.split(".")):
        return value
    raise _fail(field, "an ltree path (labels of letters, digits, _ joined by dots)", value)


def hex_digest(field: str, value: Any) -> str:
    if isinstance(value, str) and _HEX64.match(value):
        return value
    raise _fail(field, "a SHA-256 digest in lowercase hex", value)


def json_text(field: str, value: Any) -> str:
    text(field, value)
    try:
        json.loads(value)
    except ValueError:
        raise _fail(field, "JSON text", value) from None
    return str(value)


def one_of(*allowed: str) -> Callable[[str, Any], str]:
    def parse(field: str, value: Any) -> str:
        if value not in allowed:
            raise _fail(field, "one of " + "|".join(allowed), value)
        return str(value)

    return parse


def list_of(item: Callable[[str, Any], Any]) -> Callable[[str, Any], list[Any]]:
    def parse(field: str, value: Any) -> list[Any]:
        if not isinstance(value, list):
            raise _fail(field, "a list", value)
        return [item(f"{field}[{i}]", v) for i, v in enumerate(value)]

    return parse


def record(*fields: Field) -> Callable[[str, Any], dict[str, Any]]:
    def parse(field: str, value: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise _fail(field, "an object", value)
        return parse_fields(value, fields, prefix=f"{field}.", strict=True)

    return parse


@dataclass(frozen=True)
class Field:
    name: str
    parse: Callable[[str, Any], Any]
    required: bool = True
    nullable: bool = False


def unknown_fields(payload: dict[str, Any], fields: tuple[Field, ...]) -> list[str]:
    declared = {f.name for f in fields}
    return sorted(name for name in payload if name not in declared)


def parse_fields(
    payload: dict[str, Any], fields: tuple[Field, ...], *, prefix: str = "", strict: bool = False
) -> dict[str, Any]:
    """Parse the declared fields of `payload`; absent optional fields are left out. `strict`
    refuses fields the declaration does not name."""
    if strict and (unknown := unknown_fields(payload, fields)):
        raise RefusedOp(f"unknown field(s) {', '.join(repr(prefix + n) for n in unknown)}")
    out: dict[str, Any] = {}
    for f in fields:
        name = prefix + f.name
        value = payload.get(f.name, _MISSING)
        if value is _MISSING:
            if f.required:
                raise RefusedOp(f"field '{name}' is missing")
            continue
        if value is None:
            if not f.nullable:
                raise RefusedOp(f"field '{name}' must not be null")
            out[f.name] = None
            continue
        out[f.name] = f.parse(name, value)
    return out


# --- ops --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Op:
    """One sequenced outbox row, its payload parsed."""

    seq: int
    journal_seq: int
    tenant_id: str
    name: str
    payload: dict[str, Any]
    args: dict[str, Any]
    # Payload fields the catalog does not declare; refused after the op's own rules, so the
    # most specific reason is the one recorded.
    unknown: tuple[str, ...] = ()
    # For a re-enqueued dead letter: the journal_seq of the act it was refused in.
    origin_journal_seq: int | None = None


@dataclass(frozen=True)
class OpSpec:
    name: str
    fields: tuple[Field, ...]
    apply: Callable[[Op, TenantState], None]
    check: Callable[[Op, TenantState], None] = lambda op, state: None
    validate: Callable[[dict[str, Any]], None] = lambda args: None


# --- shared field sets -------------------------------------------------------------------------

_ATTACHMENT = record(
    Field("plaintext_digest", hex_digest),
    Field("ciphertext_digest", hex_digest),
    Field("media_type", text),
    Field("size_bytes", non_negative),
)

# Every silver column that comes from the submission (all but tenant_id, state, body,
# retracted_at, applied_seq, fold_seq).
_SUBMISSION = (
    Field("artifact_id", uuid_text),
    Field("version", positive),
    Field("claim_key", text),
    Field("kind", text),
    Field("workarea_id", uuid_text),
    Field("workarea_path_at_write", ltree_path),
    Field("writer_identity", text),
    Field("principal", text),
    Field("producer", text, required=False, nullable=True),
    Field("provenance", one_of(*PROVENANCES)),
    Field("simulation_id", uuid_text, required=False, nullable=True),
    Field("sim_derived_ids", list_of(uuid_text), required=False, nullable=True),
    Field("plaintext_digest", hex_digest),
    Field("ciphertext_digest", hex_digest),
    Field("body_ref", one_of(*BODY_REFS)),
    Field("attachments", list_of(_ATTACHMENT), required=False, nullable=True),
    Field("created_at", instant),
    Field("promoted_at", instant),
)
_CLAIM_KEY = (Field("artifact_id", uuid_text), Field("version", positive))
_AT = Field("at", instant)


def _claim_key(op: Op) -> tuple[str, int]:
    return (op.args["artifact_id"], op.args["version"])


def _describe(key: tuple[str, int]) -> str:
    return f"artifact {key[0]} version {key[1]}"


def _require_simulation_id(args: dict[str, Any]) -> None:
    if args.get("provenance") == "simulation" and not args.get("simulation_id"):
        raise RefusedOp("field 'simulation_id' is required when provenance is simulation")


# --- shared rules ------------------------------------------------------------------------------


def _held_row(op: Op, state: TenantState) -> Row:
    """The silver row a claim op targets, or a refusal: the lake must hold it, and an op at or
    below the row's fold_seq (a reconciler repair) is too old."""
    key = _claim_key(op)
    row = state.silver.get(key)
    if row is None:
        raise RefusedOp(f"{op.name} of a row the lake does not hold: {_describe(key)}")
    _check_fold_seq(op, row)
    return row


def _check_fold_seq(op: Op, row: Row) -> None:
    fold_seq = row.get("fold_seq")
    if fold_seq is not None and op.journal_seq <= fold_seq:
        raise RefusedOp(
            f"{op.name} at journal_seq {op.journal_seq} is not newer than the row's "
            f"fold_seq {fold_seq} ({_describe((row['artifact_id'], row['version']))})"
        )


def _area_status(state: TenantState, workarea_id: str) -> str | None:
    area = state.areas.get((workarea_id,))
    return area["status"] if area else None


def _known_area(op: Op, state: TenantState, workarea_id: str) -> str:
    """The status of `workarea_id`, or a refusal when gold.areas does not hold it."""
    status = _area_status(state, workarea_id)
    if status is None:
        raise RefusedOp(f"{op.name} into workarea {workarea_id}, which gold.areas does not hold")
    return status


def _tainted(row: Row) -> bool:
    return bool(row.get("simulation_id") or row.get("sim_derived_ids"))


def _retracted(row: Row, new_state: ClaimState, at: dt.datetime) -> Row | None:
    """The row after a demote or erase, or None when the row already made that move (or is
    erased, which is terminal)."""
    current = row["state"]
    if current in (ERASED, new_state):
        return None
    if new_state == DEMOTED and current not in (PROMOTED, HELD):
        return None
    changed = dict(row, state=new_state, retracted_at=at)
    if new_state == ERASED:
        changed.update(body_ciphertext=None, attachments=None)
    return changed


def _retract_everywhere(op: Op, state: TenantState, new_state: ClaimState) -> None:
    """A demote or erase: silver and, when the row's area is validated, its curated table, under
    the same op and so the same batch."""
    key = _claim_key(op)
    at = op.args["at"]
    row = state.silver.get(key)
    if row is not None:
        changed = _retracted(row, new_state, at)
        if changed is not None:
            state.silver.put(changed, op.seq)
        workarea_id = row["workarea_id"]
    else:
        workarea_id = None
    for curated in _curated_holding(state, key, workarea_id):
        changed = _retracted(curated.held(key), new_state, at)
        if changed is not None:
            curated.put(changed, op.seq)


def _curated_holding(state: TenantState, key: Key, workarea_id: str | None) -> list[KeyedWork]:
    if workarea_id is not None:
        curated = state.curated_for(workarea_id)
        if curated is not None and curated.get(key) is not None:
            return [curated]
    # The silver row may be ahead of this op (a table committed before a crash); fall back to
    # every curated table read for this batch that holds the key.
    return [c for c in state.curated.values() if c.get(key) is not None]


# --- journal.event -----------------------------------------------------------------------------

_EVENT_FIELDS = (
    Field("journal_seq", positive),
    Field("event_id", uuid_text),
    Field("event_type", text),
    _AT,
    Field("prev_hash", b64_sized(32)),
    Field("hash", b64_sized(32)),
    Field("sig", b64_sized(64)),
    Field("signed_bytes", b64_sized()),
    Field("payload", json_text),
    Field("principal", text),
    Field("api_key_id", text),
    Field("artifact_id", uuid_text, required=False, nullable=True),
    Field("version", positive, required=False, nullable=True),
    Field("workarea_id", uuid_text, required=False, nullable=True),
    Field("simulation_id", uuid_text, required=False, nullable=True),
    Field("provenance", one_of(*PROVENANCES), required=False, nullable=True),
)


def _check_event(op: Op, state: TenantState) -> None:
    owner = state.api_keys.get(op.args["api_key_id"])
    if owner is None:
        raise RefusedOp(f"field 'api_key_id': unknown key {op.args['api_key_id']!r}")
    if owner != state.tenant_id:
        raise RefusedOp(f"wrong tenant: api key {op.args['api_key_id']!r} belongs to {owner}")
    journal_seq = op.args["journal_seq"]
    expected = op.origin_journal_seq or op.journal_seq
    if journal_seq != expected:
        raise RefusedOp(
            f"field 'journal_seq': {journal_seq} is not the outbox row's journal_seq {expected}"
        )
    held = state.events.get(journal_seq)
    if held is not None and held != (op.args["event_id"], op.args["hash"]):
        raise RefusedOp(
            f"journal_seq {journal_seq} is already held by event {held[0]} with another hash"
        )


def _apply_event(op: Op, state: TenantState) -> None:
    journal_seq = op.args["journal_seq"]
    if journal_seq in state.events:
        return  # a replay of an event bronze holds: one row per journal_seq
    state.events[journal_seq] = (op.args["event_id"], op.args["hash"])
    row = {name: op.args.get(name) for name in state.bronze.spec.columns}
    row.update(tenant_id=state.tenant_id, event_date=op.args["at"].date(), outbox_seq=op.seq)
    state.bronze.append(row, op.seq)


# --- claims ------------------------------------------------------------------------------------


def _validate_promote(args: dict[str, Any]) -> None:
    if args["self_signed"]:
        raise RefusedOp("self_signed development rows never enter silver (ADR-0001)")
    _require_simulation_id(args)


def _check_promote(op: Op, state: TenantState) -> None:
    row = state.silver.get(_claim_key(op))
    if row is not None:
        _check_fold_seq(op, row)
        if row["state"] == DEMOTED:
            raise RefusedOp(
                f"claim.promote of a demoted row ({_describe(_claim_key(op))}): "
                "promote a new version instead"
            )
        for digest in ("plaintext_digest", "ciphertext_digest"):
            if row["state"] != ERASED and op.args[digest] != row[digest]:
                raise RefusedOp(
                    f"claim.promote of {_describe(_claim_key(op))} with another {digest} than "
                    "the row the lake holds: promote a new version instead"
                )
    else:
        _known_area(op, state, op.args["workarea_id"])
    # A promotion that would change something (a new row, or a held row back to promoted)
    # lands a promoted row in its area: refused when that area is validated.
    if row is None or row["state"] == HELD:
        workarea_id = op.args["workarea_id"] if row is None else row["workarea_id"]
        if _area_status(state, workarea_id) == "validated":
            raise RefusedOp(
                f"claim.promote into validated workarea {workarea_id} is refused by freeze"
            )


def _body(op: Op, state: TenantState, body_ref: str) -> bytes | None:
    return state.bodies.get(_claim_key(op)) if body_ref == "lake" else None


def _apply_promote(op: Op, state: TenantState) -> None:
    key = _claim_key(op)
    row = state.silver.get(key)
    if row is None:
        new = {name: op.args.get(name) for name in SILVER_CLAIMS.columns}
        new.update(
            tenant_id=state.tenant_id,
            state=PROMOTED,
            body_ciphertext=_body(op, state, op.args["body_ref"]),
            retracted_at=None,
            fold_seq=None,
        )
        state.silver.put(new, op.seq)
    elif row["state"] == HELD:
        state.silver.put(
            dict(
                row,
                state=PROMOTED,
                body_ciphertext=_body(op, state, row["body_ref"]),
                retracted_at=None,
            ),
            op.seq,
        )


def _check_retract(op: Op, state: TenantState) -> None:
    _held_row(op, state)


def _apply_demote(op: Op, state: TenantState) -> None:
    _retract_everywhere(op, state, DEMOTED)


def _apply_erase(op: Op, state: TenantState) -> None:
    _retract_everywhere(op, state, ERASED)


def _check_reassign(op: Op, state: TenantState) -> None:
    row = _held_row(op, state)
    if row["state"] == ERASED:
        return
    destination = op.args["workarea_id"]
    _known_area(op, state, destination)
    if (
        op.args["held"]
        and row["state"] == PROMOTED
        and _area_status(state, row["workarea_id"]) == "validated"
    ):
        raise RefusedOp(
            f"claim.reassign into held inside validated workarea {row['workarea_id']} is "
            "refused by freeze (a validated area admits only demote and erase)"
        )
    if destination != row["workarea_id"]:
        if _area_status(state, destination) == "validated":
            raise RefusedOp(
                f"claim.reassign into validated workarea {destination} is refused by freeze"
            )
        if _area_status(state, row["workarea_id"]) == "validated":
            raise RefusedOp(
                f"claim.reassign out of validated workarea {row['workarea_id']} "
                "is refused by freeze"
            )


def _apply_reassign(op: Op, state: TenantState) -> None:
    row = state.silver.get(_claim_key(op))
    if row is None or row["state"] == ERASED:
        return
    new_state = HELD if op.args["held"] and row["state"] == PROMOTED else row["state"]
    if new_state == row["state"] and op.args["workarea_id"] == row["workarea_id"]:
        return
    state.silver.put(dict(row, workarea_id=op.args["workarea_id"], state=new_state), op.seq)


# The repaired row: every silver column except tenant_id, applied_seq and fold_seq.
_REPAIR_ROW = record(
    *_SUBMISSION,
    Field("state", one_of(*CLAIM_STATES)),
    Field("body_ciphertext", b64, required=False, nullable=True),
    Field("retracted_at", instant, required=False, nullable=True),
)


def _validate_repair(args: dict[str, Any]) -> None:
    row = args["row"]
    if (row["artifact_id"], row["version"]) != (args["artifact_id"], args["version"]):
        raise RefusedOp("field 'row': artifact_id and version differ from the op's")
    if row["body_ref"] == "object" and row.get("body_ciphertext") is not None:
        raise RefusedOp("field 'row.body_ciphertext': a row with body_ref object has no lake body")
    _require_simulation_id(row)


# Inside a validated area a repair may keep the row's state or retract it, as the status ladder
# admits only demote and erase there; anything else would split silver from curated.
_FROZEN_MOVES = {
    PROMOTED: (PROMOTED, DEMOTED, ERASED),
    HELD: (HELD, DEMOTED, ERASED),
    DEMOTED: (DEMOTED, ERASED),
}


def _check_repair(op: Op, state: TenantState) -> None:
    key = _claim_key(op)
    row = state.silver.get(key)
    repaired = op.args["row"]
    if (
        row is not None
        and row.get("fold_seq") is not None
        and op.args["fold_seq"] < row["fold_seq"]
    ):
        raise RefusedOp(
            f"claim.repair fold_seq {op.args['fold_seq']} is lower than the row's fold_seq "
            f"{row['fold_seq']} ({_describe(key)})"
        )
    if row is not None and row["state"] == ERASED:
        return  # erased is terminal: the repair changes nothing
    if row is None and repaired["state"] == HELD:
        raise RefusedOp(f"claim.repair would admit a held body ({_describe(key)})")
    destination = repaired["workarea_id"]
    status = _known_area(op, state, destination)
    source = row["workarea_id"] if row is not None else None
    if source not in (None, destination) and _area_status(state, source) == "validated":
        raise RefusedOp(f"claim.repair out of validated workarea {source} is refused by freeze")
    if status != "validated":
        return
    if row is None or source != destination:
        raise RefusedOp(f"claim.repair into validated workarea {destination} is refused by freeze")
    if _tainted(repaired):
        raise RefusedOp(
            f"claim.repair of {_describe(key)} would put a simulation-tainted row in validated "
            f"workarea {destination}"
        )
    if repaired["state"] not in _FROZEN_MOVES[row["state"]]:
        raise RefusedOp(
            f"claim.repair of {_describe(key)} from {row['state']} to {repaired['state']} "
            f"inside validated workarea {destination} is refused by freeze"
        )


def _apply_repair(op: Op, state: TenantState) -> None:
    key = _claim_key(op)
    current = state.silver.get(key)
    if current is not None and current["state"] == ERASED:
        return
    repaired = {name: op.args["row"].get(name) for name in SILVER_CLAIMS.columns}
    repaired.update(tenant_id=state.tenant_id, fold_seq=op.args["fold_seq"])
    if repaired["state"] == ERASED:
        repaired.update(body_ciphertext=None, attachments=None)
    elif "body_ciphertext" not in op.args["row"]:
        repaired["body_ciphertext"] = _body(op, state, repaired["body_ref"])
    state.silver.put(repaired, op.seq)
    # A row of a validated area lives in its curated table too: the same op changes both.
    for curated in _curated_holding(state, key, repaired["workarea_id"]):
        held = curated.held(key)
        if held["state"] != ERASED:
            curated.put(dict(repaired, curated_at=held["curated_at"]), op.seq)


def _apply_simulation_end(op: Op, state: TenantState) -> None:
    simulation_id = op.args["simulation_id"]
    at = op.args["at"]
    for row in list(state.silver.values()):
        tainted = op.args["demote_tainted"] and simulation_id in (row["sim_derived_ids"] or ())
        if row["simulation_id"] != simulation_id and not tainted:
            continue
        if row["state"] not in (PROMOTED, HELD):
            continue
        if row["fold_seq"] is not None and op.journal_seq <= row["fold_seq"]:
            continue  # a reconciler repair newer than this act owns the row
        state.silver.put(dict(row, state=DEMOTED, retracted_at=at), op.seq)
    for edge in list(state.lineage.values()):
        if edge["simulation_id"] == simulation_id and edge["state"] == "ratified":
            state.lineage.put(dict(edge, state=DEMOTED), op.seq)


# --- lineage -----------------------------------------------------------------------------------

_EDGE_FIELDS = (
    Field("edge_id", uuid_text),
    Field("graph", one_of(*GRAPHS)),
    Field("edge_label", text),
    Field("src_id", uuid_text),
    Field("src_version", positive, required=False, nullable=True),
    Field("dst_id", uuid_text),
    Field("dst_version", positive, required=False, nullable=True),
    Field("proposer", text),
    Field("ratifier", text),
    Field("simulation_id", uuid_text, required=False, nullable=True),
    Field("proposed_at", instant),
    Field("ratified_at", instant),
)


def _validate_edge(args: dict[str, Any]) -> None:
    if args["ratifier"] == args["proposer"]:
        raise RefusedOp(f"ratifier equals the proposer ({args['proposer']!r}); R2 forbids it")
    labels = EDGE_LABELS[args["graph"]]
    if args["edge_label"] not in labels:
        raise RefusedOp(
            f"field 'edge_label': {args['edge_label']!r} is not a {args['graph']} edge label "
            f"({'|'.join(labels)})"
        )
    for end in ("src_version", "dst_version"):
        has_version = args.get(end) is not None
        if args["graph"] == "claim" and not has_version:
            raise RefusedOp(f"field '{end}' is required for a claim edge")
        if args["graph"] == "workarea" and has_version:
            raise RefusedOp(f"field '{end}' must be null for a workarea edge")


def _edge_row(op: Op, state: TenantState) -> Row:
    row = {name: op.args.get(name) for name in state.lineage.spec.columns}
    row.update(tenant_id=state.tenant_id, state="ratified")
    return row


def _check_ratify(op: Op, state: TenantState) -> None:
    existing = state.lineage.get((op.args["edge_id"],))
    if existing is None:
        for end in ("src", "dst"):
            node = op.args[f"{end}_id"]
            if op.args["graph"] == "claim":
                version = op.args[f"{end}_version"]
                if state.silver.get((node, version)) is None:
                    raise RefusedOp(
                        f"edge.ratify of edge {op.args['edge_id']}: endpoint {end} "
                        f"{_describe((node, version))} is not held by the lake"
                    )
            elif state.areas.get((node,)) is None:
                raise RefusedOp(
                    f"edge.ratify of edge {op.args['edge_id']}: endpoint {end} workarea {node} "
                    "is not held by gold.areas"
                )
        return
    same = {k: v for k, v in existing.items() if k != "applied_seq"}
    if same != {k: v for k, v in _edge_row(op, state).items() if k != "applied_seq"}:
        raise RefusedOp(f"edge.ratify of edge {op.args['edge_id']} that the lake holds otherwise")


def _apply_ratify(op: Op, state: TenantState) -> None:
    if state.lineage.get((op.args["edge_id"],)) is None:
        state.lineage.put(_edge_row(op, state), op.seq)


def _check_edge_demote(op: Op, state: TenantState) -> None:
    if state.lineage.get((op.args["edge_id"],)) is None:
        raise RefusedOp(f"edge.demote of an edge the lake does not hold: {op.args['edge_id']}")


def _apply_edge_demote(op: Op, state: TenantState) -> None:
    edge = state.lineage.get((op.args["edge_id"],))
    if edge is not None and edge["state"] == "ratified":
        state.lineage.put(dict(edge, state=DEMOTED), op.seq)


# --- areas -------------------------------------------------------------------------------------

_AREA_OPTIONAL = (
    Field("parent_id", uuid_text, required=False, nullable=True),
    Field("path", ltree_path, required=False),
    Field("status", one_of(*AREA_STATUSES), required=False),
    Field("crew_name", text, required=False, nullable=True),
    Field("crew_charter_uri", text, required=False, nullable=True),
    Field("crew_external_manager", text, required=False, nullable=True),
    Field("created_at", instant, required=False),
)


def _validate_upsert(args: dict[str, Any]) -> None:
    if args.get("status") == "validated":
        raise RefusedOp("field 'status': validated is set by area.validate, not area.upsert")


_LADDER = {status: rank for rank, status in enumerate(AREA_STATUSES)}


def _check_path(node_id: str, parent_id: str | None, path: str, state: TenantState) -> None:
    """`path` must be the parent's current path plus one label (one label for the root)."""
    if parent_id is None:
        if "." in path:
            raise RefusedOp(f"field 'path': the root {node_id} has a one-label path, not {path!r}")
        return
    parent_path = state.areas.held((parent_id,))["path"]
    head, _, label = path.rpartition(".")
    if head != parent_path or not label:
        raise RefusedOp(
            f"field 'path': {path!r} of workarea {node_id} does not extend its parent's path "
            f"{parent_path!r} by one label"
        )


def _check_upsert(op: Op, state: TenantState) -> None:
    node_id = op.args["workarea_id"]
    area = state.areas.get((node_id,))  # None for a new workarea
    if area is None:
        missing = [name for name in ("path", "status") if name not in op.args]
        if missing:
            raise RefusedOp(f"area.upsert of new workarea {node_id} lacks {', '.join(missing)}")
        parent_id = op.args.get("parent_id")
        if parent_id is None:
            roots = [a["workarea_id"] for a in state.areas.values() if a["parent_id"] is None]
            if roots:
                raise RefusedOp(
                    f"area.upsert of workarea {node_id} without a parent: the tenant's root is "
                    f"{roots[0]} already"
                )
        elif parent_id == node_id:
            raise RefusedOp(f"area.upsert of workarea {node_id} as its own parent")
        elif state.areas.get((parent_id,)) is None:
            raise RefusedOp(
                f"area.upsert of workarea {node_id} under an unknown parent {parent_id}"
            )
        _check_path(node_id, parent_id, op.args["path"], state)
        return
    for column in ("parent_id", "path"):
        if column in op.args and op.args[column] != area[column]:
            raise RefusedOp(
                f"area.upsert changes {column} of workarea {node_id}: area.reparent moves a "
                "workarea and its subtree"
            )
    status = str(op.args.get("status", area["status"]))
    if area["status"] == "validated" and status != "validated":
        raise RefusedOp(f"workarea {node_id} is validated: its status is frozen")
    if _LADDER[status] < _LADDER[area["status"]]:
        raise RefusedOp(
            f"field 'status': workarea {node_id} cannot move down the ladder from "
            f"{area['status']} to {status}"
        )


def _apply_upsert(op: Op, state: TenantState) -> None:
    given = {k: v for k, v in op.args.items() if k not in ("workarea_id", "at")}
    area = state.areas.get((op.args["workarea_id"],))
    if area is None:
        area = {name: None for name in state.areas.spec.columns}
        area.update(
            tenant_id=state.tenant_id, workarea_id=op.args["workarea_id"], created_at=op.args["at"]
        )
    changed = dict(area, **given)
    if changed != area:
        state.areas.put(dict(changed, updated_at=op.args["at"]), op.seq)


def _check_reparent(op: Op, state: TenantState) -> None:
    node, parent = op.args["workarea_id"], op.args["parent_id"]
    area = state.areas.get((node,))
    if area is None:
        raise RefusedOp(f"area.reparent of an unknown workarea {node}")
    if area["parent_id"] is None:
        raise RefusedOp(f"area.reparent of the root {node}: the root has no parent")
    if state.areas.get((parent,)) is None:
        raise RefusedOp(f"area.reparent under an unknown parent {parent}")
    if parent == node or parent in area_descendants(state.areas.values(), node):
        raise RefusedOp(f"area.reparent of {node} under its own subtree ({parent}) makes a cycle")
    _check_path(node, parent, op.args["path"], state)


def _apply_reparent(op: Op, state: TenantState) -> None:
    node_id, at = op.args["workarea_id"], op.args["at"]
    node = state.areas.get((node_id,))
    if node is None:
        return
    paths = {node_id: op.args["path"]}
    state.areas.put(
        dict(node, parent_id=op.args["parent_id"], path=paths[node_id], updated_at=at), op.seq
    )
    # Descendants come parent-first from the walk; each keeps its own last label.
    for child_id in area_descendants(state.areas.values(), node_id):
        child = state.areas.held((child_id,))
        path = paths[child["parent_id"]] + "." + child["path"].rsplit(".", 1)[-1]
        paths[child_id] = path
        if path != child["path"]:
            state.areas.put(dict(child, path=path, updated_at=at), op.seq)


def _check_validate(op: Op, state: TenantState) -> None:
    workarea_id = op.args["workarea_id"]
    status = _area_status(state, workarea_id)
    if status is None:
        raise RefusedOp(f"area.validate of an unknown workarea {workarea_id}")
    if status == "validated":
        return
    if status != "committed":
        raise RefusedOp(
            f"area.validate of workarea {workarea_id} in status {status}: only a committed "
            "area is validated"
        )
    tainted = sorted(
        row["artifact_id"]
        for row in state.silver.values()
        if row["workarea_id"] == workarea_id and row["state"] in (PROMOTED, HELD) and _tainted(row)
    )
    if tainted:
        raise RefusedOp(
            f"area.validate of {workarea_id}: simulation-tainted rows cannot enter a validated "
            f"area (artifacts {', '.join(tainted[:5])}{'...' if len(tainted) > 5 else ''})"
        )


def _apply_validate(op: Op, state: TenantState) -> None:
    workarea_id = op.args["workarea_id"]
    area = state.areas.get((workarea_id,))
    if area is None or area["status"] == "validated":  # nothing to freeze, or frozen already
        return
    state.areas.put(dict(area, status="validated", updated_at=op.args["at"]), op.seq)
    if state.curated_for(workarea_id) is not None:
        return  # created already: a table that exists is never created again
    curated = state.new_curated(workarea_id)
    for row in state.silver.values():
        if row["workarea_id"] == workarea_id and row["state"] == PROMOTED:
            # The validation's own instant: a rebuild from the outbox gives the same rows.
            curated.put(dict(row, curated_at=op.args["at"]), op.seq)


# --- the catalog -------------------------------------------------------------------------------

CATALOG: dict[str, OpSpec] = {
    spec.name: spec
    for spec in (
        OpSpec("journal.event", _EVENT_FIELDS, _apply_event, _check_event),
        OpSpec(
            "claim.promote",
            (*_SUBMISSION, Field("self_signed", boolean)),
            _apply_promote,
            _check_promote,
            _validate_promote,
        ),
        OpSpec("claim.demote", (*_CLAIM_KEY, _AT), _apply_demote, _check_retract),
        OpSpec("claim.erase", (*_CLAIM_KEY, _AT), _apply_erase, _check_retract),
        OpSpec(
            "claim.reassign",
            (*_CLAIM_KEY, Field("workarea_id", uuid_text), Field("held", boolean), _AT),
            _apply_reassign,
            _check_reassign,
        ),
        OpSpec(
            "claim.repair",
            (*_CLAIM_KEY, Field("fold_seq", positive), Field("row", _REPAIR_ROW)),
            _apply_repair,
            _check_repair,
            _validate_repair,
        ),
        OpSpec(
            "simulation.end",
            (Field("simulation_id", uuid_text), _AT, Field("demote_tainted", boolean)),
            _apply_simulation_end,
        ),
        OpSpec("edge.ratify", _EDGE_FIELDS, _apply_ratify, _check_ratify, _validate_edge),
        OpSpec(
            "edge.demote",
            (Field("edge_id", uuid_text), _AT),
            _apply_edge_demote,
            _check_edge_demote,
        ),
        OpSpec(
            "area.upsert",
            (Field("workarea_id", uuid_text), _AT, *_AREA_OPTIONAL),
            _apply_upsert,
            _check_upsert,
            _validate_upsert,
        ),
        OpSpec(
            "area.reparent",
            (
                Field("workarea_id", uuid_text),
                Field("parent_id", uuid_text),
                Field("path", ltree_path),
                _AT,
            ),
            _apply_reparent,
            _check_reparent,
        ),
        OpSpec(
            "area.validate",
            (Field("workarea_id", uuid_text), _AT),
            _apply_validate,
            _check_validate,
        ),
    )
}


def parse(
    name: str,
    payload: Any,
    *,
    seq: int,
    journal_seq: int,
    tenant_id: str,
    origin_journal_seq: int | None = None,
) -> Op:
    """Parse one outbox row into an `Op`, or raise `RefusedOp` naming what is wrong."""
    spec = CATALOG.get(name)
    if spec is None:
        raise RefusedOp(f"unknown op {name!r}")
    if not isinstance(payload, dict):
        raise RefusedOp(f"{name}: payload is not a JSON object")
    if "tenant_id" in payload and payload["tenant_id"] != tenant_id:
        raise RefusedOp(
            f"wrong tenant: payload tenant_id {payload['tenant_id']!r} is not {tenant_id}"
        )
    try:
        args = parse_fields(payload, spec.fields)
        spec.validate(args)
    except RefusedOp as refused:
        raise RefusedOp(f"{name}: {refused.reason}") from None
    unknown = tuple(n for n in unknown_fields(payload, spec.fields) if n != "tenant_id")
    return Op(seq, journal_seq, tenant_id, name, payload, args, unknown, origin_journal_seq)


def parsed(
    name: str,
    payload: Any,
    *,
    seq: int,
    journal_seq: int,
    tenant_id: str,
    origin_journal_seq: int | None = None,
) -> Op | RefusedOp:
    """`parse`, with a refusal returned as a value for `fold` to decide on."""
    try:
        return parse(
            name,
            payload,
            seq=seq,
            journal_seq=journal_seq,
            tenant_id=tenant_id,
            origin_journal_seq=origin_journal_seq,
        )
    except RefusedOp as refused:
        # A fresh exception, never raised: the caught one carries a traceback, and a caller that
        # keeps its ops (the writer's batch) once kept every op alive through such a traceback
        # until the cyclic collector ran.
        return RefusedOp(refused.reason)


def check(op: Op, state: TenantState) -> None:
    try:
        CATALOG[op.name].check(op, state)
        if op.unknown:
            # Refused rather than dropped: the producer and the catalog disagree on the op.
            raise RefusedOp(f"unknown field(s) {', '.join(repr(n) for n in op.unknown)}")
    except RefusedOp as refused:
        reason = (
            refused.reason if refused.reason.startswith(op.name) else f"{op.name}: {refused.reason}"
        )
        raise RefusedOp(reason) from None


def apply(op: Op, state: TenantState) -> None:
    CATALOG[op.name].apply(op, state)


# --- the fold ----------------------------------------------------------------------------------


@dataclass
class Verdicts:
    """What `fold` decided beyond the recorded verdicts, seq -> reason. `refused`: the ops after
    `decided` it refused. `unparsable`: ops at or below `decided` not recorded as refused (so
    applied when they were decided) that `parse` refuses now, the rules having tightened since;
    the fold skips them."""

    refused: dict[int, str] = dataclasses.field(default_factory=dict)
    unparsable: dict[int, str] = dataclasses.field(default_factory=dict)


def fold(
    ops: Iterable[tuple[int, Op | RefusedOp]],
    state: TenantState,
    *,
    decided: int,
    recorded: Container[int],
    on_op: Callable[[int, Op | RefusedOp], None] | None = None,
) -> Verdicts:
    """Apply `ops` (seq, parsed op or its parse refusal), in seq order, to `state`. An op at or
    below `decided` keeps its verdict: skipped when its seq is in `recorded` (the refusals) or it
    no longer parses, applied unchecked otherwise. A later op is checked against the tables as of
    the op, then applied or refused. `on_op(seq, op)` is called before each op.

    The writer folds a batch with its decided frontier and commits the tables; the reconciler
    folds the tenant's whole outbox, every op of it decided, and compares."""
    verdicts = Verdicts()
    for seq, op in ops:
        if on_op is not None:
            on_op(seq, op)
        if seq <= decided:
            if seq in recorded:
                continue
            if isinstance(op, RefusedOp):
                verdicts.unparsable[seq] = op.reason
                continue
            apply(op, state)
            continue
        if isinstance(op, RefusedOp):
            verdicts.refused[seq] = op.reason
            continue
        try:
            check(op, state)
        except RefusedOp as refusal:
            verdicts.refused[seq] = refusal.reason
            continue
        apply(op, state)
    return verdicts
