"""bronze.events as columns: the journal events of a fetched batch (`fetch.py`) are checked with
Arrow compute, column by column, and those that pass become bronze rows without a Python object
per row: base64 decoded for the whole batch at once, payload JSON text cleared by a pattern,
settling and dedup as masks (decision 0022).

The checks are the op catalog's `journal.event` rules, made conservative: an event they clear is
one the catalog accepts with the same values (`test_fetch.py` holds them to that); an event they
do not clear is simply folded by the catalog, which stays the one place a refusal is worded.
What needs the order of the batch also goes to the catalog: an event whose journal_seq bronze
already holds, or that occurs twice (a replay, or a conflicting event: one row per journal_seq).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pybase64

from oml_dagster.lake.model.tables import BRONZE_EVENTS, PROVENANCES
from oml_dagster.lake.queries import EVENT_FIELDS

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


def _false_if_null(mask: pa.ChunkedArray) -> pa.ChunkedArray:
    return pc.fill_null(mask, False)


def _all(*masks: pa.ChunkedArray) -> pa.ChunkedArray:
    out = masks[0]
    for mask in masks[1:]:
        out = pc.and_kleene(out, mask)
    return _false_if_null(out)


class _Fields:
    """The fetched text (and, where a check needs it, JSON type) of each payload field, with the
    checks built on them."""

    def __init__(self, fetched: pa.Table):
        self.f = fetched

    def text(self, name: str) -> pa.ChunkedArray:
        return self.f[f"f_{name}"]

    def typed(self, name: str, json_type: str) -> pa.ChunkedArray:
        return _false_if_null(pc.equal(self.f[f"t_{name}"], json_type))

    def matches(self, name: str, pattern: str, json_type: str | None = None) -> pa.ChunkedArray:
        """The field's text matches `pattern`; `json_type` is needed only where the text of a
        value of another type could match (queries.TYPED_FIELDS)."""
        match = pc.match_substring_regex(self.text(name), pattern)
        return _all(self.typed(name, json_type), match) if json_type else _false_if_null(match)

    def non_empty(self, name: str) -> pa.ChunkedArray:
        return _all(self.typed(name, "string"), pc.greater(pc.utf8_length(self.text(name)), 0))

    def optional(self, name: str, check: pa.ChunkedArray) -> pa.ChunkedArray:
        """Absent or JSON null (no text either way), or passing `check`."""
        return _false_if_null(pc.or_kleene(pc.is_null(self.text(name)), check))


def _instant(
    at: pa.ChunkedArray, shaped: pa.ChunkedArray
) -> tuple[pa.ChunkedArray, pa.ChunkedArray]:
    """(valid, µs UTC timestamps) of canonical instants. Arrow's ISO 8601 cast checks the
    calendar (no 2023-02-29, hour 24 or second 60) but fails the whole array on one bad value,
    so a batch holding one is parsed field by field instead (`_instant_by_parts`). Year 0000,
    which Python refuses, is never valid."""
    text = pc.if_else(shaped, at, None)
    try:
        stamp = pc.cast(text, _TIMESTAMP)
    except pa.ArrowInvalid:
        return _instant_by_parts(at, shaped)
    return _all(shaped, pc.not_equal(pc.utf8_slice_codeunits(text, 0, 4), "0000")), stamp


def _instant_by_parts(
    at: pa.ChunkedArray, shaped: pa.ChunkedArray
) -> tuple[pa.ChunkedArray, pa.ChunkedArray]:
    """`_instant` for a batch holding an impossible date or time: the calendar must hold the
    date (Arrow's strptime rolls 2023-02-29 over to March, so the parse must print back the
    same)."""
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
    provenance = _false_if_null(pc.is_in(f.text("provenance"), pa.array(PROVENANCES)))
    ok = _all(
        _false_if_null(fetched["event_object"]),
        _false_if_null(fetched["declared_only"]),
        _false_if_null(fetched["own_key"]),
        journal_seq,
        _false_if_null(pc.equal(seq_value, expected)),
        f.matches("event_id", _UUID),
        f.non_empty("event_type"),
        valid_at,
        f.matches("prev_hash", _B64_32),
        f.matches("hash", _B64_32),
        f.matches("sig", _B64_64),
        f.matches("signed_bytes", _B64, "string"),
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
    """The batch's events that land in bronze as columns, and the cleared events the catalog
    must fold after all."""

    rows: pa.Table  # in bronze's schema
    # Over the fetched rows: events the checks cleared that are neither in `rows` nor settled
    # (bronze holds them, or their recorded verdict is a refusal), because the batch's order
    # decides them: a replay, a journal_seq occurring twice, payload text that may not be JSON.
    folded: pa.ChunkedArray


def decode_base64(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    """The bytes of base64 text, for values the checks matched with `_B64` (or one of its
    narrower patterns): whole quads, padding only in the last one, no nulls. The batch's values
    are decoded in one SIMD `pybase64` call over their joined text, their padding read as "A"
    (which decodes to zero bits in the same places); then the one or two bytes each value's
    padding stood for are dropped from the decoded buffer. Equals `binascii.a2b_base64` per
    value (`test_bronze.py`); text that breaks the precondition raises instead of decoding to
    something else."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    values = values.cast(pa.large_string())
    if values.null_count:
        raise ValueError("base64 values must not be null")
    n = len(values)
    _, offsets_buffer, data_buffer = values.buffers()
    offsets = np.frombuffer(offsets_buffer, np.int64)[values.offset : values.offset + n + 1]
    start, stop = (int(offsets[0]), int(offsets[-1])) if n else (0, 0)
    ends = offsets[1:] - start
    if np.any(ends % 4):
        raise ValueError("base64 values must be whole quads")
    one = pc.ends_with(values, "=").to_numpy(zero_copy_only=False)
    two = pc.ends_with(values, "==").to_numpy(zero_copy_only=False)
    text = np.frombuffer(data_buffer, np.uint8)[start:stop].copy() if stop > start else None
    if text is None:
        decoded = np.empty(0, np.uint8)
    else:
        text[ends[one] - 1] = ord("A")
        text[ends[two] - 2] = ord("A")
        decoded = np.frombuffer(pybase64.b64decode(text.data, validate=True), np.uint8)
    decoded_ends = ends // 4 * 3
    if one.any():
        keep = np.ones(len(decoded), bool)
        keep[decoded_ends[one] - 1] = False
        keep[decoded_ends[two] - 2] = False
        decoded = decoded[keep]
    out_offsets = np.zeros(n + 1, np.int64)
    out_offsets[1:] = decoded_ends - np.cumsum(one.astype(np.int64) + two)
    return pa.Array.from_buffers(
        pa.large_binary(), n, [None, pa.py_buffer(out_offsets), pa.py_buffer(decoded)]
    )


def _json_pattern(depth: int) -> str:
    """Anchored RE2 pattern of JSON text nested at most `depth` deep (RFC 8259 grammar; what it
    matches `json.loads` parses). Deeper or unusual text is parsed one by one instead."""
    ws = r"[ \t\n\r]*"
    string = r'"(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*"'
    number = r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?"
    value = f"(?:{string}|{number}|true|false|null)"
    for _ in range(depth):
        member = f"{string}{ws}:{ws}{value}"
        obj = rf"\{{{ws}(?:{member}{ws}(?:,{ws}{member}{ws})*)?\}}"
        arr = rf"\[{ws}(?:{value}{ws}(?:,{ws}{value}{ws})*)?\]"
        value = f"(?:{string}|{number}|true|false|null|{obj}|{arr})"
    return f"^{ws}{value}{ws}$"


JSON_TEXT = _json_pattern(2)


def _is_json(text: str) -> bool:
    try:
        orjson.loads(text)
    except orjson.JSONDecodeError:
        return False
    return True


def json_texts(texts: pa.ChunkedArray, among: pa.ChunkedArray) -> pa.ChunkedArray:
    """Mask of the texts that are JSON, for the rows of `among`: RE2 clears the usual ones at
    once; the few it does not (deeper nesting, unusual forms) are parsed one by one."""
    shaped = _false_if_null(pc.match_substring_regex(texts, JSON_TEXT))
    rest = _all(among, pc.invert(shaped))
    if not pc.any(rest).as_py():
        return shaped
    parsed = pa.array([_is_json(text) for text in pc.filter(texts, rest).to_pylist()], pa.bool_())
    return pc.replace_with_mask(shaped.combine_chunks(), rest.combine_chunks(), parsed)


def _int64s(values: Iterable[int]) -> pa.Array:
    return pa.array(sorted(values), pa.int64())


def cleared_events(
    fetched: pa.Table,
    checked: tuple[pa.ChunkedArray, pa.ChunkedArray],
    *,
    bronze_txn: int,
    refused: set[int],
    held_journal_seqs: set[int],
    catalog_journal_seqs: list[int],
) -> ClearedEvents:
    """Bronze rows of the batch's events that `checked` (from `checked_events`) clears, chosen
    with Arrow compute over the whole batch. `bronze_txn`: rows at or below it are in bronze
    already; `refused`: seqs whose recorded verdict is a refusal; `held_journal_seqs`:
    journal_seqs bronze holds; `catalog_journal_seqs`: those of the events the catalog folds."""
    ok, at = checked
    seq = fetched["seq"]
    journal_seq = pc.cast(pc.if_else(ok, fetched["f_journal_seq"], None), pa.int64())
    settled = pc.or_(pc.less_equal(seq, bronze_txn), pc.is_in(seq, _int64s(refused)))
    pending = _all(ok, pc.invert(settled))
    # One row per journal_seq: an event whose journal_seq occurs twice among the pending ones
    # and the catalog's is left to the catalog, which folds them in order.
    seen = pa.concat_arrays(
        [pc.filter(journal_seq, pending).combine_chunks(), _int64s(catalog_journal_seqs)]
    )
    counts = pc.value_counts(seen)
    repeated = pc.filter(counts.field("values"), pc.greater(counts.field("counts"), 1))
    unique = _all(
        pending,
        pc.invert(pc.is_in(journal_seq, repeated)),
        pc.invert(pc.is_in(journal_seq, _int64s(held_journal_seqs))),
    )
    keep = _all(unique, json_texts(fetched["f_payload"], unique))
    needed = ["tenant_id", "seq", *(f"f_{name}" for name in EVENT_FIELDS)]
    rows = fetched.select(needed).append_column("at", at).filter(keep)
    columns = {
        "tenant_id": rows["tenant_id"],
        "journal_seq": pc.cast(rows["f_journal_seq"], pa.int64()),
        "event_id": rows["f_event_id"],
        "event_type": rows["f_event_type"],
        "at": rows["at"],
        "event_date": pc.cast(rows["at"], pa.date32()),
        **{
            name: decode_base64(rows[f"f_{name}"])
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
    return ClearedEvents(table.cast(BRONZE_EVENTS.schema), _all(pending, pc.invert(keep)))
