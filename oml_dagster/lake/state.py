"""Working copies of a tenant's tables during one batch fold.

A working copy starts from the table's latest Delta version (its `txn` says how far that version
is drained) and takes an op's effect only when the op's seq is above `txn`: a table that already
holds an op's effect (it committed that batch before a crash) must not take it twice.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from .tables import BRONZE_EVENTS, GOLD_CURATED, TableSpec

Row = dict[str, Any]
Key = tuple


@dataclass
class KeyedWork:
    """A MERGE table's rows by key: the rows read from Delta plus this batch's changes."""

    spec: TableSpec
    txn: int
    rows: dict[Key, Row] = field(default_factory=dict)
    changed: set[Key] = field(default_factory=set)
    # Keys the prefetch looked for in the table version the fold started from and did not find:
    # rows with only such keys can be appended instead of MERGEd.
    absent: set[Key] = field(default_factory=set)
    # The rows as read from Delta (before this batch changed them), by key.
    found: dict[Key, Row] = field(default_factory=dict)

    def key_of(self, row: Row) -> Key:
        return tuple(row[c] for c in self.spec.merge_key)

    def get(self, key: Key) -> Row | None:
        return self.rows.get(key)

    def values(self) -> Iterator[Row]:
        return iter(self.rows.values())

    def active(self, seq: int) -> bool:
        return seq > self.txn

    def put(self, row: Row, seq: int) -> None:
        """Record `row` as changed by the op at `seq` (ignored when the table already has it)."""
        if not self.active(seq):
            return
        row = dict(row)
        row["applied_seq"] = seq
        key = self.key_of(row)
        self.rows[key] = row
        self.changed.add(key)

    def load(self, rows: Iterable[Row]) -> None:
        for row in rows:
            key = self.key_of(row)
            if key not in self.rows:
                self.rows[key] = row
                self.found[key] = row

    def looked_for(self, keys: Iterable[Key]) -> None:
        """Record that the table was searched for `keys` (after `load` of what it holds)."""
        self.absent.update(k for k in keys if k not in self.rows)

    def only_new(self, rows: Iterable[Row]) -> bool:
        """Whether every row's key is one the table version the fold read did not hold."""
        return all(self.key_of(r) in self.absent for r in rows)

    def clustered(self, rows: Iterable[Row]) -> list[tuple] | None:
        """The clustering (`zorder_by`) values, as the table holds them, of the rows among `rows`
        the table holds; None when the table has no clustering or a row's key was neither found
        nor looked for (where its row lies is unknown)."""
        columns = self.spec.zorder_by
        if not columns:
            return None
        boxes = []
        for row in rows:
            key = self.key_of(row)
            if key in self.absent:
                continue
            held = self.found.get(key)
            if held is None:
                return None
            boxes.append(tuple(held[c] for c in columns))
        return boxes

    def output(self, above: int) -> list[Row]:
        """Final rows changed by ops with seq above `above` (the table's txn at commit time)."""
        return [self.rows[k] for k in sorted(self.changed) if self.rows[k]["applied_seq"] > above]


@dataclass
class AppendWork:
    """bronze.events: rows appended by this batch, each tagged with its outbox seq. Most arrive
    as columns (`columns`, events the fetch cleared); the per-op fold appends the rest."""

    txn: int
    spec: TableSpec = BRONZE_EVENTS
    rows: list[Row] = field(default_factory=list)
    columns: pa.Table | None = None

    def active(self, seq: int) -> bool:
        return seq > self.txn

    def append(self, row: Row, seq: int) -> None:
        if self.active(seq):
            self.rows.append(row)

    def output(self, above: int) -> pa.Table:
        parts = [
            pa.Table.from_pylist(
                [r for r in self.rows if r["outbox_seq"] > above], self.spec.schema
            )
        ]
        if self.columns is not None:
            parts.append(self.columns.filter(pc.greater(self.columns["outbox_seq"], above)))
        return pa.concat_tables(parts)


@dataclass
class TenantState:
    """Everything one batch fold reads and writes for one tenant."""

    tenant_id: str
    bronze: AppendWork
    silver: KeyedWork
    lineage: KeyedWork
    areas: KeyedWork
    curated: dict[str, KeyedWork]
    # (artifact_id, version) -> ciphertext, read from oml.claim_bodies at drain time.
    bodies: dict[Key, bytes]
    # api_key_id -> owning tenant_id.
    api_keys: dict[str, str]
    # journal_seq -> (event_id, hash) of every event bronze holds or this batch appends, for
    # the events the batch names: bronze keeps one row per journal_seq.
    events: dict[int, tuple[str, bytes]] = field(default_factory=dict)

    def curated_for(self, workarea_id: str) -> KeyedWork | None:
        return self.curated.get(workarea_id)

    def new_curated(self, workarea_id: str) -> KeyedWork:
        work = KeyedWork(GOLD_CURATED, txn=0)
        self.curated[workarea_id] = work
        return work
