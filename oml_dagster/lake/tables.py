"""The one declaration of every lake table: columns, Arrow types, nullability, partitioning,
MERGE key, body columns, Delta table properties and Parquet writer settings (spec: "Delta
tables").

The writer, maintenance, the checks and the tests all read the tables from here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import pyarrow as pa
from deltalake import ColumnProperties, WriterProperties

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
# size (decision 0026). Writes, MERGE rewrites, compaction and Z-order all read it from the
# table property `delta.targetFileSize`.
REWRITE_TARGET_FILE_SIZE = 8 * 2**20


def _col(name: str, type_: pa.DataType, nullable: bool = False) -> pa.Field:
    return pa.field(name, type_, nullable=nullable)


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
    # `delta.targetFileSize` in bytes (None: delta-rs's default, about 100 MiB).
    target_file_size: int | None = None

    @cached_property
    def columns(self) -> tuple[str, ...]:
        # Cached: the fold reads it once per op.
        return tuple(self.schema.names)

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
    columns. Compression is named explicitly: WriterProperties without it writes uncompressed
    files."""
    return WriterProperties(
        compression="SNAPPY",
        column_properties={
            c: ColumnProperties(statistics_enabled="NONE") for c in spec.body_columns
        }
        or None,
    )


BRONZE_EVENTS = TableSpec(
    name="bronze.events",
    relpath="bronze/events",
    schema=pa.schema(
        [
            _col("tenant_id", pa.string()),
            _col("journal_seq", pa.int64()),
            _col("event_id", pa.string()),
            _col("event_type", pa.string()),
            _col("at", TIMESTAMP),
            _col("event_date", pa.date32()),
            _col("prev_hash", pa.binary()),
            _col("hash", pa.binary()),
            _col("sig", pa.binary()),
            _col("signed_bytes", pa.binary()),
            _col("payload", pa.string()),
            _col("principal", pa.string()),
            _col("api_key_id", pa.string()),
            _col("artifact_id", pa.string(), nullable=True),
            _col("version", pa.int64(), nullable=True),
            _col("workarea_id", pa.string(), nullable=True),
            _col("simulation_id", pa.string(), nullable=True),
            _col("provenance", pa.string(), nullable=True),
            _col("outbox_seq", pa.int64()),
        ]
    ),
    partition_by=("event_date",),
)

_CLAIM_COLUMNS = [
    _col("tenant_id", pa.string()),
    _col("artifact_id", pa.string()),
    _col("version", pa.int64()),
    _col("claim_key", pa.string()),
    _col("kind", pa.string()),
    _col("state", pa.string()),
    _col("workarea_id", pa.string()),
    _col("workarea_path_at_write", pa.string()),
    _col("writer_identity", pa.string()),
    _col("principal", pa.string()),
    _col("producer", pa.string(), nullable=True),
    _col("provenance", pa.string()),
    _col("simulation_id", pa.string(), nullable=True),
    _col("sim_derived_ids", STRING_LIST, nullable=True),
    _col("plaintext_digest", pa.string()),
    _col("ciphertext_digest", pa.string()),
    _col("body_ciphertext", pa.binary(), nullable=True),
    _col("body_ref", pa.string()),
    _col("attachments", ATTACHMENTS, nullable=True),
    _col("created_at", TIMESTAMP),
    _col("promoted_at", TIMESTAMP),
    _col("retracted_at", TIMESTAMP, nullable=True),
    _col("applied_seq", pa.int64()),
    _col("fold_seq", pa.int64(), nullable=True),
]

SILVER_CLAIMS = TableSpec(
    name="silver.claims",
    relpath="silver/claims",
    schema=pa.schema(_CLAIM_COLUMNS),
    merge_key=("artifact_id", "version"),
    body_columns=("body_ciphertext",),
    zorder_by=("workarea_id", "artifact_id"),
    target_file_size=REWRITE_TARGET_FILE_SIZE,
)

GOLD_LINEAGE = TableSpec(
    name="gold.lineage",
    relpath="gold/lineage",
    schema=pa.schema(
        [
            _col("tenant_id", pa.string()),
            _col("edge_id", pa.string()),
            _col("graph", pa.string()),
            _col("edge_label", pa.string()),
            _col("src_id", pa.string()),
            _col("src_version", pa.int64(), nullable=True),
            _col("dst_id", pa.string()),
            _col("dst_version", pa.int64(), nullable=True),
            _col("state", pa.string()),
            _col("proposer", pa.string()),
            _col("ratifier", pa.string()),
            _col("simulation_id", pa.string(), nullable=True),
            _col("proposed_at", TIMESTAMP),
            _col("ratified_at", TIMESTAMP),
            _col("applied_seq", pa.int64()),
        ]
    ),
    merge_key=("edge_id",),
    zorder_by=("src_id",),
)

GOLD_AREAS = TableSpec(
    name="gold.areas",
    relpath="gold/areas",
    schema=pa.schema(
        [
            _col("tenant_id", pa.string()),
            _col("workarea_id", pa.string()),
            _col("parent_id", pa.string(), nullable=True),
            _col("path", pa.string()),
            _col("status", pa.string()),
            _col("crew_name", pa.string(), nullable=True),
            _col("crew_charter_uri", pa.string(), nullable=True),
            _col("crew_external_manager", pa.string(), nullable=True),
            _col("created_at", TIMESTAMP),
            _col("updated_at", TIMESTAMP),
            _col("applied_seq", pa.int64()),
        ]
    ),
    merge_key=("workarea_id",),
)

GOLD_CURATED = TableSpec(
    name="gold.curated",
    relpath="gold/curated",
    schema=pa.schema([*_CLAIM_COLUMNS, _col("curated_at", TIMESTAMP)]),
    merge_key=("artifact_id", "version"),
    body_columns=("body_ciphertext",),
    zorder_by=("workarea_id", "artifact_id"),
    target_file_size=REWRITE_TARGET_FILE_SIZE,
)

# Tables every tenant has (curated tables appear per validated workarea).
CORE_TABLES: tuple[TableSpec, ...] = (BRONZE_EVENTS, SILVER_CLAIMS, GOLD_LINEAGE, GOLD_AREAS)

AREA_STATUSES = ("development", "committed", "validated")
GRAPHS = ("claim", "workarea")
# The labels of each graph (spec: gold.lineage); an edge of one graph never carries another's.
EDGE_LABELS = {
    "claim": ("derives_from", "supersedes"),
    "workarea": ("relates_to", "continues", "derived_from", "mirrors"),
}
PROVENANCES = ("agent", "human", "connector", "simulation")
BODY_REFS = ("lake", "object")
