"""Statistics: nothing derived from ``body_ciphertext`` may leak into the Delta log or the
Parquet footers (min/max of a ciphertext column would expose prefixes of encrypted payloads)."""

from __future__ import annotations

import json

import pytest
from deltalake import ColumnProperties, DeltaTable, WriterProperties, write_deltalake

from ._support import (
    actions_of,
    add_actions,
    added_paths,
    broken,
    envelope_rows,
    footer_compression,
    footer_stats,
)

BODY = "body_ciphertext"
NO_BODY_STATS = WriterProperties(
    column_properties={BODY: ColumnProperties(statistics_enabled="NONE")}
)


def _log_stats(table_uri: str, version: int) -> list[dict]:
    return [json.loads(a["stats"]) for a in actions_of(table_uri, version, "add")]


def test_binary_columns_get_no_stats_in_the_delta_log(table_uri):
    """Assumption: delta-rs writes no ``minValues``/``maxValues`` (and, on 1.6.6, no
    ``nullCount``) for a binary column into the add actions' stats, while other columns get
    them; ``get_add_actions`` shows a null ``null_count.body_ciphertext`` and no min/max column.

    Source: https://github.com/delta-io/delta-rs/pull/3146 (binary columns excluded from column
    statistics).
    """
    a = "binary-no-log-stats"
    write_deltalake(table_uri, envelope_rows([1, 2, 3]), mode="error")
    (stats,) = _log_stats(table_uri, 0)
    for key in ("minValues", "maxValues", "nullCount"):
        assert BODY not in stats[key], broken(a, f"{key} has {BODY}: {stats}")
        assert "id" in stats[key] and "s" in stats[key], broken(a, f"{key} lost id/s: {stats}")
    cols = add_actions(DeltaTable(table_uri))
    assert f"min.{BODY}" not in cols.column_names and f"max.{BODY}" not in cols.column_names, (
        broken(a, f"get_add_actions columns {cols.column_names}")
    )
    assert cols.column(f"null_count.{BODY}").to_pylist() == [None], broken(
        a, "get_add_actions now reports a null count for the binary column"
    )


def _apply(kind: str, table_uri: str, wp: WriterProperties | None) -> list[str]:
    """Run one write path with ``wp`` and return the files it added."""
    write_deltalake(table_uri, envelope_rows([1, 2]), mode="error", writer_properties=wp)
    if kind == "write":
        return added_paths(table_uri, 0)
    write_deltalake(table_uri, envelope_rows([3, 4]), mode="append", writer_properties=wp)
    dt = DeltaTable(table_uri)
    if kind == "merge":
        src = envelope_rows([2, 5])
        (
            dt.merge(src, "t.id = s.id", "s", "t", writer_properties=wp, streamed_exec=False)
            .when_matched_update_all()
            .when_not_matched_insert_all()
            .execute()
        )
    elif kind == "compact":
        dt.optimize.compact(writer_properties=wp)
    elif kind == "z_order":
        dt.optimize.z_order(["id"], writer_properties=wp)
    else:  # pragma: no cover
        raise ValueError(kind)
    return added_paths(table_uri, dt.version())


@pytest.mark.parametrize("kind", ["write", "merge", "compact", "z_order"])
def test_footer_stats_switched_off_for_body_ciphertext(table_uri, kind):
    """Assumption: ``WriterProperties(column_properties={"body_ciphertext":
    ColumnProperties(statistics_enabled="NONE")})`` passed to write_deltalake, MERGE,
    optimize.compact and optimize.z_order leaves no Parquet footer statistics for that column
    in the files each of them writes, while other columns keep theirs.

    Sources:
    https://delta-io.github.io/delta-rs/api/delta_writer/ (ColumnProperties.statistics_enabled)
    https://delta-io.github.io/delta-rs/api/delta_table/delta_table_optimizer/ (writer_properties)
    """
    a = f"footer-stats-off-on-{kind}"
    new_files = _apply(kind, table_uri, NO_BODY_STATS)
    assert new_files, broken(a, "the operation wrote no file")
    for path in new_files:
        stats = footer_stats(path)
        assert stats[BODY] is None, broken(a, f"{BODY} footer statistics present: {stats[BODY]}")
        assert stats["id"] is not None and stats["id"][0], broken(a, f"id lost stats: {stats}")


def test_compact_without_writer_properties_brings_footer_min_max_back(table_uri):
    """Assumption: OPTIMIZE ignores the column settings files were written with: compacting files
    written with stats off for ``body_ciphertext`` but without passing ``writer_properties``
    produces a file whose footer has min/max for ``body_ciphertext`` again.

    Source: https://delta-io.github.io/delta-rs/api/delta_table/delta_table_optimizer/
    (writer_properties is a per-call argument of compact).
    """
    a = "compact-without-wp-restores-min-max"
    write_deltalake(table_uri, envelope_rows([1, 2]), mode="error", writer_properties=NO_BODY_STATS)
    write_deltalake(table_uri, envelope_rows([3]), mode="append", writer_properties=NO_BODY_STATS)
    dt = DeltaTable(table_uri)
    assert all(footer_stats(p)[BODY] is None for p in dt.file_uris())
    dt.optimize.compact()
    (path,) = added_paths(table_uri, dt.version())
    stats = footer_stats(path)
    assert stats[BODY] is not None and stats[BODY][0], broken(
        a, f"compact without writer_properties no longer writes {BODY} min/max: {stats[BODY]}"
    )


def test_data_skipping_stats_columns_restricts_log_stats(table_uri):
    """Assumption: ``delta.dataSkippingStatsColumns`` listing every column but ``body_ciphertext``
    is honoured: ``body_ciphertext`` has no nullCount/min/max in the log and is not even a
    column of ``get_add_actions``; listed columns keep their stats and an unlisted non-binary
    column loses them (control table).

    Sources: https://github.com/delta-io/delta-rs/pull/2128 (stats schema honours
    dataSkippingStatsColumns); https://github.com/delta-io/delta-rs/issues/2854 and
    https://github.com/delta-io/delta-rs/pull/3146 (binary columns in the property).
    """
    a = "dataSkippingStatsColumns-honoured"
    write_deltalake(
        table_uri,
        envelope_rows([1, 2]),
        mode="error",
        configuration={"delta.dataSkippingStatsColumns": "id,s,tags"},
    )
    (stats,) = _log_stats(table_uri, 0)
    for key in ("minValues", "maxValues", "nullCount"):
        assert BODY not in stats[key], broken(a, f"{key} has {BODY}: {stats}")
        assert "id" in stats[key] and "s" in stats[key], broken(a, f"{key}: {stats}")
    cols = add_actions(DeltaTable(table_uri)).column_names
    assert not any(c.endswith(f".{BODY}") for c in cols), broken(a, f"columns {cols}")

    control = f"{table_uri}-control"
    write_deltalake(
        control,
        envelope_rows([1, 2]),
        mode="error",
        configuration={"delta.dataSkippingStatsColumns": "id"},
    )
    (ctl,) = _log_stats(control, 0)
    assert "s" not in ctl["minValues"] and "s" not in ctl["nullCount"], broken(
        a, f"unlisted column s still has stats: {ctl}"
    )


def test_writer_properties_without_compression_write_uncompressed_files(table_uri):
    """Assumption: passing ``WriterProperties`` without ``compression`` writes UNCOMPRESSED Parquet
    (write_deltalake, MERGE and OPTIMIZE alike), whereas no ``writer_properties`` gives SNAPPY for
    writes and ZSTD for OPTIMIZE; the lake-writer must always set ``compression`` explicitly.

    Sources: https://delta-io.github.io/delta-rs/api/delta_writer/ (WriterProperties.compression);
    https://delta-io.github.io/delta-rs/api/delta_table/delta_table_optimizer/.
    """
    a = "writer-properties-default-compression"
    write_deltalake(table_uri, envelope_rows([1]), mode="error")
    (default_file,) = added_paths(table_uri, 0)
    assert footer_compression(default_file) == "SNAPPY", broken(a, "default write not SNAPPY")
    write_deltalake(table_uri, envelope_rows([2]), mode="append", writer_properties=NO_BODY_STATS)
    (wp_file,) = added_paths(table_uri, 1)
    assert footer_compression(wp_file) == "UNCOMPRESSED", broken(
        a, f"WriterProperties without compression now gives {footer_compression(wp_file)}"
    )
    dt = DeltaTable(table_uri)
    dt.optimize.compact(writer_properties=NO_BODY_STATS)
    (compacted,) = added_paths(table_uri, dt.version())
    assert footer_compression(compacted) == "UNCOMPRESSED", broken(a, "compact with wp compressed")
    write_deltalake(table_uri, envelope_rows([3]), mode="append")
    dt.update_incremental()
    dt.optimize.compact()
    (default_compacted,) = added_paths(table_uri, dt.version())
    assert footer_compression(default_compacted) == "ZSTD", broken(a, "default compact not ZSTD")
    zstd = WriterProperties(
        compression="ZSTD", column_properties={BODY: ColumnProperties(statistics_enabled="NONE")}
    )
    write_deltalake(table_uri, envelope_rows([4]), mode="append", writer_properties=zstd)
    dt.update_incremental()
    (explicit,) = added_paths(table_uri, dt.version())
    assert footer_compression(explicit) == "ZSTD", broken(a, "explicit compression ignored")
    assert footer_stats(explicit)[BODY] is None, broken(a, "explicit compression re-enabled stats")
