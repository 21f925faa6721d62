"""The one declaration of every lake table: columns, Arrow types, nullability, partitioning,
MERGE key, body columns, Delta table properties and Parquet writer settings (spec: "Delta
tables"). The columns are the spec's own column tables, row for row, in `columns.tsv`.

The writer, maintenance, the checks and the tests all read the tables from here. Below the
declarations: the working copies of a tenant's tables during one batch fold (`KeyedWork`,
`AppendWork`, `TenantState`), which the op catalog edits and the writer commits.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from functools import cached_property
from importlib import resources
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import BloomFilterProperties, ColumnProperties, WriterProperties

TIMESTAMP = pa.timestamp("us", tz="UTC")
ATTACHMENT = pa.struct(
    [
        pa.field("plaintext_digest", pa.string(), nullable=False),
        pa.field("ciphertext_digest", pa.string(), nullable=False),
        pa.field("media_type", pa.string(), nullable=False),
        pa.field("size_bytes", pa.int64(), nullable=False),
    ]
)
ATTACHMENTS = pa.list_(pa.field("element", ATTACHMENT, nullable=False))
STRING_LIST = pa.list_(pa.field("element", pa.string(), nullable=False))

APP_ID = "oml-lakewriter"
CHECKPOINT_INTERVAL = 100
# Target data file size of the tables retracts MERGE (silver, curated): a copy-on-write retract
# rewrites every file holding a touched row, so its cost follows the file size, not the table
# size (decision 0026: 2 MiB, measured against 8 MiB). Writes, MERGE rewrites,
# compaction and Z-order all read it from the table property `delta.targetFileSize`; the
# writer's packing on the way passes it.
REWRITE_TARGET_FILE_SIZE = 2 * 2**20
# Parquet bloom filters on the columns the writer looks rows up by (`TableSpec.lookup_columns`,
# decision 0044). NDV bounds the rows of one REWRITE_TARGET_FILE_SIZE file (about 5,000 claims
# with 256-byte bodies) with room to spare; the writer shrinks each filter to the values its file
# holds, about 8 KiB for such a file.
LOOKUP_BLOOM_FPP = 0.01
LOOKUP_BLOOM_NDV = 16_384


# The spec's Delta types and the Arrow type each is written as (spec: "Type conventions"). List
# elements and struct fields are non-null; ARRAY<STRUCT> is the attachments column's type.
_ARROW_OF: dict[tuple[str, str], pa.DataType] = {
    ("STRING", "utf8"): pa.string(),
    ("LONG", "int64"): pa.int64(),
    ("BINARY", "binary"): pa.binary(),
    ("TIMESTAMP", "timestamp[µs, UTC]"): TIMESTAMP,
    ("DATE", "date32"): pa.date32(),
    ("ARRAY<STRING>", "list<utf8>"): STRING_LIST,
    ("ARRAY<STRUCT>", "list<struct>"): ATTACHMENTS,
}


def read_columns(text: str) -> dict[str, list[tuple[pa.Field, str]]]:
    """Per spec table heading, its columns in order with their meaning, from `columns.tsv` (the
    spec's rows: column, Delta type, Arrow type, null yes/no, meaning)."""
    tables: dict[str, list[tuple[pa.Field, str]]] = {}
    heading = ""
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        if "\t" not in line:
            heading = line
            tables[heading] = []
            continue
        cells = line.split("\t")
        name, delta, arrow, null = (cells + ["", "", ""])[:4]
        type_ = _ARROW_OF.get((delta, arrow))
        if type_ is None or null not in ("yes", "no") or not heading:
            raise ValueError(f"columns.tsv line {number}: cannot read column {name!r}: {line!r}")
        field_ = pa.field(name, type_, nullable=null == "yes")
        tables[heading].append((field_, "\t".join(cells[4:])))
    return tables


_COLUMNS = read_columns(
    resources.files(__package__).joinpath("columns.tsv").read_text(encoding="utf-8")
)


def _columns(*headings: str) -> dict[str, Any]:
    """A table's `schema` and column `meanings`, from the spec tables under `headings` in order."""
    rows = [row for heading in headings for row in _COLUMNS[heading]]
    return {"schema": pa.schema([f for f, _ in rows]), "meanings": {f.name: m for f, m in rows}}


@dataclass(frozen=True)
class TableSpec:
    """One lake table. `relpath` is under the tenant prefix; curated tables add `/<workarea_id>`."""

    name: str
    relpath: str
    schema: pa.Schema
    merge_key: tuple[str, ...] = ()
    partition_by: tuple[str, ...] = ()
    # Columns holding ciphertext: no Parquet statistics, no Delta log statistics.
    body_columns: tuple[str, ...] = ()
    zorder_by: tuple[str, ...] = field(default=())
    # Columns a retract finds its rows by when the clustering does not narrow them: each data
    # file carries a Parquet bloom filter on them, so the query engine passes over the files
    # whose statistics admit a value they do not hold.
    lookup_columns: tuple[str, ...] = ()
    # `delta.targetFileSize` in bytes (None: delta-rs's default, about 100 MiB).
    target_file_size: int | None = None
    # Each column's meaning as the spec states it ("" where it states none).
    meanings: dict[str, str] = field(default_factory=dict, compare=False)

    @cached_property
    def columns(self) -> tuple[str, ...]:
        # Cached: the fold reads it once per op.
        return tuple(self.schema.names)

    def key_of(self, row: Row) -> Key:
        """`row`'s merge key: its values of the `merge_key` columns, in order."""
        return tuple(row[c] for c in self.merge_key)

    def configuration(self, erasure_bound_seconds: int) -> dict[str, str]:
        """Delta table properties; retention equals the tenant's lake erasure bound."""
        interval = f"interval {int(erasure_bound_seconds)} seconds"
        config = {
            "delta.checkpointInterval": str(CHECKPOINT_INTERVAL),
            "delta.deletedFileRetentionDuration": interval,
            "delta.logRetentionDuration": interval,
        }
        if self.body_columns:
            stats = [c for c in self.columns if c not in self.body_columns]
            config["delta.dataSkippingStatsColumns"] = ",".join(stats)
        if self.target_file_size is not None:
            config["delta.targetFileSize"] = str(self.target_file_size)
        return config


def writer_properties(spec: TableSpec) -> WriterProperties:
    """Parquet settings for every write, MERGE and rewrite of the table: no statistics for body
    columns, a bloom filter on lookup columns. Compression is named explicitly:
    WriterProperties without it writes uncompressed files."""
    columns = {c: ColumnProperties(statistics_enabled="NONE") for c in spec.body_columns}
    bloom = BloomFilterProperties(True, fpp=LOOKUP_BLOOM_FPP, ndv=LOOKUP_BLOOM_NDV)
    columns |= {c: ColumnProperties(bloom_filter_properties=bloom) for c in spec.lookup_columns}
    return WriterProperties(compression="SNAPPY", column_properties=columns or None)


BRONZE_EVENTS = TableSpec(
    name="bronze.events",
    relpath="bronze/events",
    **_columns("bronze.events"),
    partition_by=("event_date",),
)

SILVER_CLAIMS = TableSpec(
    name="silver.claims",
    relpath="silver/claims",
    **_columns("silver.claims"),
    merge_key=("artifact_id", "version"),
    body_columns=("body_ciphertext",),
    zorder_by=("workarea_id", "artifact_id"),
    lookup_columns=("artifact_id",),
    target_file_size=REWRITE_TARGET_FILE_SIZE,
)

GOLD_LINEAGE = TableSpec(
    name="gold.lineage",
    relpath="gold/lineage",
    **_columns("gold.lineage"),
    merge_key=("edge_id",),
    zorder_by=("src_id",),
)

GOLD_AREAS = TableSpec(
    name="gold.areas",
    relpath="gold/areas",
    **_columns("gold.areas"),
    merge_key=("workarea_id",),
)

# A curated table is silver's schema plus `curated_at`, kept and maintained like silver (spec:
# "every maintenance job written for silver runs unmodified against curated tables").
GOLD_CURATED = replace(
    SILVER_CLAIMS,
    name="gold.curated",
    relpath="gold/curated",
    **_columns("silver.claims", "gold.curated_<table>"),
)

# Tables every tenant has (curated tables appear per validated workarea).
CORE_TABLES: tuple[TableSpec, ...] = (BRONZE_EVENTS, SILVER_CLAIMS, GOLD_LINEAGE, GOLD_AREAS)


@dataclass(frozen=True)
class TableId:
    """One table of a tenant: its spec's name, and for a curated table its workarea. `str()` is
    the name the frontier cache (`oml.lake_frontier.table_name`), the reconciler's findings and
    the run metadata use: the spec's name (`silver.claims`), or `gold.curated/<workarea_id>`."""

    spec_name: str
    workarea_id: str | None = None

    @classmethod
    def curated(cls, workarea_id: str) -> TableId:
        return cls(GOLD_CURATED.name, workarea_id)

    @classmethod
    def parse(cls, name: str) -> TableId:
        """The table a name read at a boundary names (a CLI argument, a frontier cache row, an
        export manifest); inside the core a table travels as a `TableId`."""
        spec_name, _, workarea_id = name.partition("/")
        return cls(spec_name, workarea_id or None)

    @property
    def spec(self) -> TableSpec:
        for spec in (*CORE_TABLES, GOLD_CURATED):
            if spec.name == self.spec_name:
                return spec
        raise ValueError(f"no table kind {self.spec_name!r}")

    def __str__(self) -> str:
        return f"{self.spec_name}/{self.workarea_id}" if self.workarea_id else self.spec_name


# The `state` of a claim version in silver (and of an edge in gold.lineage).
ClaimState = Literal["promoted", "demoted", "erased", "held"]
PROMOTED: ClaimState = "promoted"
DEMOTED: ClaimState = "demoted"
ERASED: ClaimState = "erased"
HELD: ClaimState = "held"
CLAIM_STATES: tuple[ClaimState, ...] = (PROMOTED, DEMOTED, ERASED, HELD)
AREA_STATUSES = ("development", "committed", "validated")


def area_descendants(areas: Iterable[Row], workarea_id: str) -> list[str]:
    """The subtree below `workarea_id` in gold.areas rows, parents before children. Each node is
    visited once, so a cycle already in the rows (written before cycles were refused) cannot hang
    the walk."""
    children: dict[str, list[str]] = {}
    for area in areas:
        if area["parent_id"] is not None:
            children.setdefault(area["parent_id"], []).append(area["workarea_id"])
    found, seen, stack = [], {workarea_id}, list(children.get(workarea_id, ()))
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        found.append(node)
        stack.extend(children.get(node, ()))
    return found


GRAPHS = ("claim", "workarea")
# The labels of each graph (spec: gold.lineage); an edge of one graph never carries another's.
EDGE_LABELS = {
    "claim": ("derives_from", "supersedes"),
    "workarea": ("relates_to", "continues", "derived_from", "mirrors"),
}
PROVENANCES = ("agent", "human", "connector", "simulation")
BODY_REFS = ("lake", "object")


# --- working copies during a batch fold ---------------------------------------------------------
# A working copy starts from the table's latest Delta version (its `txn` says how far that version
# is drained) and takes an op's effect only when the op's seq is above `txn`: a table that already
# holds an op's effect (it committed that batch before a crash) must not take it twice.

Row = dict[str, Any]
Key = tuple[Any, ...]


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
        return self.spec.key_of(row)

    def get(self, key: Key) -> Row | None:
        return self.rows.get(key)

    def held(self, key: Key) -> Row:
        """The row of `key`, which the caller knows is held (KeyError otherwise)."""
        return self.rows[key]

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

    def clustered(self, rows: Iterable[Row]) -> list[tuple[Any, ...]] | None:
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
    curated: dict[str, KeyedWork]  # by workarea_id: the validated areas' curated tables
    # (artifact_id, version) -> ciphertext, read from oml.claim_bodies at drain time.
    bodies: dict[Key, bytes]
    # api_key_id -> owning tenant_id.
    api_keys: dict[str, str]
    # journal_seq -> (event_id, hash) of every event bronze holds or this batch appends, for
    # the events the batch names: bronze keeps one row per journal_seq.
    events: dict[int, tuple[str, bytes]] = field(default_factory=dict)

    @classmethod
    def blank(
        cls, tenant_id: str, bodies: dict[Key, bytes], api_keys: dict[str, str], bronze_txn: int = 0
    ) -> TenantState:
        """The state of a tenant whose tables are empty (txn 0), as a fold of the outbox from its
        start sees it; bronze's work starts at `bronze_txn`."""
        return cls(
            tenant_id,
            AppendWork(txn=bronze_txn),
            KeyedWork(SILVER_CLAIMS, txn=0),
            KeyedWork(GOLD_LINEAGE, txn=0),
            KeyedWork(GOLD_AREAS, txn=0),
            {},
            bodies,
            api_keys,
        )

    def curated_for(self, workarea_id: str) -> KeyedWork | None:
        return self.curated.get(workarea_id)

    def new_curated(self, workarea_id: str) -> KeyedWork:
        work = KeyedWork(GOLD_CURATED, txn=0)
        self.curated[workarea_id] = work
        return work
