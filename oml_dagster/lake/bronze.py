"""bronze.events as columns: the journal events of a fetched batch (`fetch.py`) are checked with
Arrow compute, column by column, and those that pass become bronze rows without a Python object
per row.

The checks are the op catalog's `journal.event` rules, made conservative: an event they clear is
one the catalog accepts with the same values (`test_fetch.py` holds them to that); an event they
do not clear is simply folded by the catalog, which stays the one place a refusal is worded.
What needs the order of the batch also goes to the catalog: an event whose journal_seq bronze
already holds, or that occurs twice (a replay, or a conflicting event: one row per journal_seq).
"""

from __future__ import annotations

import binascii
from collections import Counter
from dataclasses import dataclass

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from .tables import BRONZE_EVENTS, PROVENANCES

_UUID = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
_POSITIVE = r"^[1-9][0-9]{0,17}$"
_B64_32 = r"^[A-Za-z0-9+/]{43}=$"
_B64_64 = r"^[A-Za-z0-9+/]{86}==$"
_B64 = r"^([A-Za-z0-9+/]{4})*([A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=|[A-Za-z0-9+/]{4})$"
# The producers' canonical instant (RFC 3339, UTC, up to microseconds); other lawful forms go to
# the catalog.
_INSTANT = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?(Z|\+00:00)$"
_SECONDS = "%Y-%m-%dT%H:%M:%S"
_TIMESTAMP = pa.timestamp("us", tz="UTC")


def _false_if_null(mask) -> pa.ChunkedArray:
    return pc.fill_null(mask, False)


def _all(*masks) -> pa.ChunkedArray:
    out = masks[0]
    for mask in masks[1:]:
        out = pc.and_kleene(out, mask)
    return _false_if_null(out)


class _Fields:
    """The fetched text and JSON type of each payload field, with the checks built on them."""

    def __init__(self, fetched: pa.Table):
        self.f = fetched

    def text(self, name: str):
        return self.f[f"f_{name}"]

    def typed(self, name: str, json_type: str):
        return _false_if_null(pc.equal(self.f[f"t_{name}"], json_type))

    def matches(self, name: str, pattern: str, json_type: str = "string"):
        return _all(self.typed(name, json_type), pc.match_substring_regex(self.text(name), pattern))

    def non_empty(self, name: str):
        return _all(self.typed(name, "string"), pc.greater(pc.utf8_length(self.text(name)), 0))

    def optional(self, name: str, check):
        kind = self.f[f"t_{name}"]
        return _false_if_null(
            pc.or_kleene(pc.or_kleene(pc.is_null(kind), pc.equal(kind, "null")), check)
        )


def _instant(
    at: pa.ChunkedArray, shaped: pa.ChunkedArray
) -> tuple[pa.ChunkedArray, pa.ChunkedArray]:
    """(valid, µs UTC timestamps) of canonical instants: the calendar must hold the date (Arrow's
    strptime rolls 2023-02-29 over to March, so the parse must print back the same)."""
    text = pc.if_else(shaped, at, None)
    seconds = pc.utf8_slice_codeunits(text, 0, 19)
    parsed = pc.strptime(seconds, format=_SECONDS, unit="us", error_is_null=True)
    valid = _all(
        shaped,
        # in seconds: for finer units Arrow's %S prints a fraction too
        pc.equal(pc.strftime(pc.cast(parsed, pa.timestamp("s")), format=_SECONDS), seconds),
        pc.not_equal(pc.utf8_slice_codeunits(text, 0, 4), "0000"),
    )
    fraction = pc.struct_field(pc.extract_regex(text, r"^.{19}(?:\.(?P<f>[0-9]{1,6}))?"), "f")
    micros = pc.cast(pc.utf8_rpad(pc.fill_null(fraction, ""), width=6, padding="0"), pa.int64())
    stamp = pc.add(pc.cast(pc.cast(parsed, pa.timestamp("us")), pa.int64()), micros)
    return valid, pc.cast(pc.cast(stamp, pa.timestamp("us")), _TIMESTAMP)


def checked_events(fetched: pa.Table) -> tuple[pa.ChunkedArray, pa.ChunkedArray]:
    """(mask of the rows whose event the checks clear, their instants)."""
    f = _Fields(fetched)
    shaped_at = f.matches("at", _INSTANT)
    valid_at, at = _instant(f.text("at"), shaped_at)
    journal_seq = f.matches("journal_seq", _POSITIVE, "number")
    expected = pc.coalesce(fetched["origin_journal_seq"], fetched["journal_seq"])
    seq_value = pc.cast(pc.if_else(journal_seq, f.text("journal_seq"), None), pa.int64())
    provenance = _all(
        f.typed("provenance", "string"), pc.is_in(f.text("provenance"), pa.array(PROVENANCES))
    )
    ok = _all(
        _false_if_null(fetched["event_object"]),
        _false_if_null(fetched["declared_only"]),
        _false_if_null(pc.equal(fetched["key_tenant"], fetched["tenant_id"])),
        journal_seq,
        _false_if_null(pc.equal(seq_value, expected)),
        f.matches("event_id", _UUID),
        f.non_empty("event_type"),
        valid_at,
        f.matches("prev_hash", _B64_32),
        f.matches("hash", _B64_32),
        f.matches("sig", _B64_64),
        f.matches("signed_bytes", _B64),
        f.non_empty("payload"),
        f.non_empty("principal"),
        f.non_empty("api_key_id"),
        f.optional("artifact_id", f.matches("artifact_id", _UUID)),
        f.optional("version", f.matches("version", _POSITIVE, "number")),
        f.optional("workarea_id", f.matches("workarea_id", _UUID)),
        f.optional("simulation_id", f.matches("simulation_id", _UUID)),
        f.optional("provenance", provenance),
    )
    return ok, at


@dataclass
class ClearedEvents:
    """The batch's events that land in bronze as columns, and every seq the catalog folds."""

    rows: pa.Table  # in bronze's schema
    cleared: set[int]  # seqs of the rows above
    done: set[int]  # seqs of cleared events bronze or a recorded refusal already settled


def _decode(column: pa.ChunkedArray) -> pa.Array:
    return pa.array([binascii.a2b_base64(s) for s in column.to_pylist()], pa.binary())


def _is_json(text: str) -> bool:
    try:
        orjson.loads(text)
    except orjson.JSONDecodeError:
        return False
    return True


def cleared_events(
    fetched: pa.Table,
    checked: tuple[pa.ChunkedArray, pa.ChunkedArray],
    *,
    bronze_txn: int,
    refused: set[int],
    held_journal_seqs: set[int],
    catalog_journal_seqs: list[int],
) -> ClearedEvents:
    """Bronze rows of the batch's events that `checked` (from `checked_events`) clears.
    `bronze_txn`: rows at or below it are in
    bronze already; `refused`: seqs whose recorded verdict is a refusal; `held_journal_seqs`:
    journal_seqs bronze holds; `catalog_journal_seqs`: those of the events the catalog folds."""
    ok, at = checked
    fetched = fetched.append_column("at", at)
    candidates = fetched.filter(ok)
    seqs = candidates["seq"].to_pylist()
    done = {s for s in seqs if s <= bronze_txn or s in refused}
    journal_seqs = pc.cast(candidates["f_journal_seq"], pa.int64()).to_pylist()
    counts = Counter(js for s, js in zip(seqs, journal_seqs, strict=True) if s not in done)
    counts.update(catalog_journal_seqs)
    keep = [
        s not in done and counts[js] == 1 and js not in held_journal_seqs and _is_json(text)
        for s, js, text in zip(seqs, journal_seqs, candidates["f_payload"].to_pylist(), strict=True)
    ]
    rows = candidates.filter(pa.array(keep, pa.bool_()))
    columns = {
        "tenant_id": rows["tenant_id"],
        "journal_seq": pc.cast(rows["f_journal_seq"], pa.int64()),
        "event_id": rows["f_event_id"],
        "event_type": rows["f_event_type"],
        "at": rows["at"],
        "event_date": pc.cast(rows["at"], pa.date32()),
        **{
            name: _decode(rows[f"f_{name}"])
            for name in ("prev_hash", "hash", "sig", "signed_bytes")
        },
        "payload": rows["f_payload"],
        "principal": rows["f_principal"],
        "api_key_id": rows["f_api_key_id"],
        "artifact_id": rows["f_artifact_id"],
        "version": pc.cast(rows["f_version"], pa.int64()),
        "workarea_id": rows["f_workarea_id"],
        "simulation_id": rows["f_simulation_id"],
        "provenance": rows["f_provenance"],
        "outbox_seq": rows["seq"],
    }
    table = pa.table({name: columns[name] for name in BRONZE_EVENTS.columns})
    return ClearedEvents(table.cast(BRONZE_EVENTS.schema), set(rows["seq"].to_pylist()), done)
