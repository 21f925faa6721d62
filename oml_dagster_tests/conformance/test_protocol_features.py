"""Table protocol and types: no deletion vectors, timestamps, date partitions."""

from __future__ import annotations

import datetime as dt_
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
from deltalake import DeltaTable, TableFeatures, write_deltalake

from ._support import broken, commit_actions, id_chunk, log_listing


def _dv_in_log(table_uri: str) -> list[str]:
    """Commit versions with an add/remove action carrying a deletion vector."""
    hits = []
    for name in log_listing(table_uri):
        if not name.endswith(".json"):
            continue
        version = int(name.split(".")[0])
        for action in commit_actions(table_uri, version):
            for kind in ("add", "remove"):
                if action.get(kind, {}).get("deletionVector"):
                    hits.append(f"{version}:{kind}")
    return hits


def test_delete_and_update_rewrite_files_without_deletion_vectors(table_uri):
    """Assumption: DELETE and UPDATE are copy-on-write: the affected file is removed and a
    rewritten file added, no add/remove action carries a ``deletionVector``, and the protocol has
    no ``deletionVectors`` feature (default protocol 1/2).

    Sources: https://github.com/delta-io/delta-rs/issues/4512 ("all write-side data modification
    operations—merge, update, and delete—use a copy-on-write (CoW) strategy");
    https://github.com/delta-io/delta-rs/issues/1094 (deletion vector support).
    """
    a = "no-deletion-vectors"
    write_deltalake(table_uri, id_chunk(0, rows=10), mode="error")
    dt = DeltaTable(table_uri)
    before = set(dt.file_uris())
    metrics = dt.delete("id = 3")
    after_delete = set(dt.file_uris())
    assert metrics["num_removed_files"] == 1 and metrics["num_added_files"] == 1, broken(
        a, f"delete metrics {metrics}"
    )
    assert not (before & after_delete), broken(a, "delete did not rewrite the file")
    dt.update({"c": "'x'"}, predicate="id = 4")
    assert not (after_delete & set(dt.file_uris())), broken(a, "update did not rewrite the file")
    assert _dv_in_log(table_uri) == [], broken(
        a, f"deletion vectors written: {_dv_in_log(table_uri)}"
    )
    proto = dt.protocol()
    features = set(proto.reader_features or []) | set(proto.writer_features or [])
    assert "deletionVectors" not in features, broken(a, f"protocol {proto}")
    assert (proto.min_reader_version, proto.min_writer_version) == (1, 2), broken(a, str(proto))
    ids = sorted(r["id"] for r in dt.to_pyarrow_table().to_pylist())
    assert ids == [i for i in range(10) if i != 3], broken(a, f"rows after delete: {ids}")


def test_no_deletion_vectors_even_when_the_feature_is_enabled(table_uri):
    """Assumption: even on a table whose protocol enables ``deletionVectors``, delta-rs deletes
    by rewriting the file and writes no deletion vector.

    Sources: https://github.com/delta-io/delta-rs/issues/4512;
    https://github.com/delta-io/delta-rs/pull/4101 ("even if we cannot produce deletion vectors
    at the moment").
    """
    a = "no-deletion-vectors-with-feature"
    write_deltalake(table_uri, id_chunk(0, rows=10), mode="error")
    dt = DeltaTable(table_uri)
    dt.alter.add_feature(TableFeatures.DeletionVectors, allow_protocol_versions_increase=True)
    assert "deletionVectors" in (dt.protocol().writer_features or [])
    before = set(dt.file_uris())
    metrics = dt.delete("id = 5")
    assert metrics["num_removed_files"] == 1 and not (before & set(dt.file_uris())), broken(
        a, f"delete metrics {metrics}"
    )
    assert _dv_in_log(table_uri) == [], broken(
        a, f"deletion vectors written: {_dv_in_log(table_uri)}"
    )


def test_nanosecond_utc_timestamp_stored_as_microseconds_utc(table_uri):
    """Assumption: ``timestamp('ns', tz='UTC')`` input is stored as the Delta ``timestamp`` type
    and read back as ``timestamp[us, tz=UTC]``, truncated (not rounded) to microseconds, without
    a protocol upgrade.

    Sources: https://github.com/delta-io/delta-rs/pull/2236 (timestamp vs timestampNtz handling);
    https://delta-io.github.io/delta-rs/upgrade-guides/guide-1.0.0/.
    """
    a = "ns-utc-to-us-utc"
    ns = 1_700_000_000_123_456_789
    data = pa.table({"ts": pa.array([ns], pa.timestamp("ns", tz="UTC"))})
    write_deltalake(table_uri, data, mode="error")
    dt = DeltaTable(table_uri)
    field = dt.schema().fields[0]
    assert str(field.type) == 'PrimitiveType("timestamp")', broken(a, f"delta type {field.type}")
    out = dt.to_pyarrow_table()
    assert out.schema.field("ts").type == pa.timestamp("us", tz="UTC"), broken(
        a, f"read type {out.schema.field('ts').type}"
    )
    assert out.column("ts").cast(pa.int64()).to_pylist() == [ns // 1000], broken(
        a, f"value {out.column('ts').to_pylist()} (expected truncation to {ns // 1000} us)"
    )
    proto = dt.protocol()
    assert (proto.min_reader_version, proto.min_writer_version) == (1, 2), broken(a, str(proto))


def test_naive_timestamp_becomes_timestamp_ntz_and_bumps_protocol(table_uri):
    """Assumption: a timestamp without time zone is stored as ``timestamp_ntz`` and upgrades the
    table protocol to reader 3 / writer 7 with the ``timestampNtz`` feature (the lake-writer must
    never send naive timestamps).

    Source: https://github.com/delta-io/delta-rs/pull/2236 (timestampNtz support; "datetimes with
    no timezone ... to Primitive::timestampNtz").
    """
    a = "naive-timestamp-ntz-bumps-protocol"
    write_deltalake(table_uri, pa.table({"ts": pa.array([1], pa.timestamp("us"))}), mode="error")
    dt = DeltaTable(table_uri)
    assert str(dt.schema().fields[0].type) == 'PrimitiveType("timestamp_ntz")', broken(
        a, f"delta type {dt.schema().fields[0].type}"
    )
    proto = dt.protocol()
    assert (proto.min_reader_version, proto.min_writer_version) == (3, 7), broken(a, str(proto))
    assert "timestampNtz" in (proto.writer_features or []), broken(a, str(proto))
    assert "timestampNtz" in (proto.reader_features or []), broken(a, str(proto))


def test_date32_partition_column(table_uri):
    """Assumption: a ``date32`` column works as a partition column: Hive-style directories
    ``day=YYYY-MM-DD``, the partition value reads back as ``date32`` and filters on it.

    Source: https://delta-io.github.io/delta-rs/usage/working-with-partitions/.
    """
    a = "date32-partition"
    days = [dt_.date(2026, 11, 28), dt_.date(2026, 11, 29), dt_.date(2026, 11, 29)]
    data = pa.table({"id": pa.array([1, 2, 3], pa.int64()), "day": pa.array(days, pa.date32())})
    write_deltalake(table_uri, data, mode="error", partition_by=["day"])
    dt = DeltaTable(table_uri)
    assert dt.metadata().partition_columns == ["day"], broken(a, "partition column not recorded")
    dirs = sorted(
        p.name for p in Path(table_uri).iterdir() if p.is_dir() and p.name != "_delta_log"
    )
    assert dirs == ["day=2026-11-28", "day=2026-11-29"], broken(a, f"directories {dirs}")
    out = dt.to_pyarrow_table()
    assert out.schema.field("day").type == pa.date32(), broken(a, str(out.schema))
    hit = dt.to_pyarrow_dataset().to_table(filter=ds.field("day") == dt_.date(2026, 11, 29))
    assert sorted(hit.column("id").to_pylist()) == [2, 3], broken(a, "partition filter wrong")
