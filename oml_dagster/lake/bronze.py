"""bronze.events as columns: the events of a batch that the fetch's SQL checks cleared become
bronze rows without a Python object per row.

What SQL cannot decide stays with the catalog's per-op path: a payload text that is not JSON,
and any event whose journal_seq bronze already holds or that occurs twice in the batch (a replay
or a conflicting event: one bronze row per journal_seq, decided in seq order by the catalog).
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from .tables import BRONZE_EVENTS

_FROM_FETCH = {
    "tenant_id": "tenant_id",
    "journal_seq": "event_journal_seq",
    "event_id": "event_id",
    "event_type": "event_type",
    "at": "at",
    "prev_hash": "prev_hash",
    "hash": "hash",
    "sig": "sig",
    "signed_bytes": "signed_bytes",
    "payload": "payload",
    "principal": "principal",
    "api_key_id": "api_key_id",
    "artifact_id": "artifact_id",
    "version": "version",
    "workarea_id": "workarea_id",
    "simulation_id": "simulation_id",
    "provenance": "provenance",
    "outbox_seq": "seq",
}


@dataclass
class ClearedEvents:
    """The batch's cleared events split into bronze rows and the seqs the catalog must see."""

    rows: pa.Table  # in bronze's schema
    to_catalog: list[int]  # seqs of cleared rows the per-op path decides after all


def _is_json(text: str) -> bool:
    try:
        orjson.loads(text)
    except orjson.JSONDecodeError:
        return False
    return True


def cleared_events(
    fetched: pa.Table,
    *,
    bronze_txn: int,
    skip: set[int],
    held_journal_seqs: set[int],
    catalog_journal_seqs: list[int],
) -> ClearedEvents:
    """Bronze rows from the fetched rows with `event_ok`. `bronze_txn`: rows at or below it are
    in bronze already; `skip`: seqs whose recorded verdict is a refusal; `held_journal_seqs`:
    journal_seqs bronze holds; `catalog_journal_seqs`: those of events the catalog folds."""
    cleared = fetched.filter(fetched["event_ok"])
    cleared = cleared.filter(pc.greater(cleared["seq"], bronze_txn))
    if skip:
        cleared = cleared.filter(pc.invert(pc.is_in(cleared["seq"], pa.array(sorted(skip)))))
    seqs = cleared["seq"].to_pylist()
    journal_seqs = cleared["event_journal_seq"].to_pylist()
    counts: dict[int, int] = {}
    for js in [*journal_seqs, *catalog_journal_seqs]:
        counts[js] = counts.get(js, 0) + 1
    payloads = cleared["payload"].to_pylist()
    to_catalog = [
        seq
        for seq, js, text in zip(seqs, journal_seqs, payloads, strict=True)
        if counts[js] > 1 or js in held_journal_seqs or not _is_json(text)
    ]
    if to_catalog:
        cleared = cleared.filter(pc.invert(pc.is_in(cleared["seq"], pa.array(to_catalog))))
    columns = {name: cleared[source] for name, source in _FROM_FETCH.items()}
    columns["event_date"] = pc.cast(cleared["at"], pa.date32())
    rows = pa.table({name: columns[name] for name in BRONZE_EVENTS.columns})
    return ClearedEvents(rows.cast(BRONZE_EVENTS.schema), to_catalog)
