"""MERGE: the lake-writer's upsert/retract path (copy-on-write rewrites of matched files)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError

from ._support import (
    LIST_OF_STRUCT,
    add_actions,
    added_paths,
    broken,
    envelope_rows,
    id_chunk,
    must_raise,
)

TEN_FILES = 10


def _ten_file_table(table_uri: str) -> DeltaTable:
    """Ten data files; file k holds ids k*100 .. k*100+99."""
    for k in range(TEN_FILES):
        write_deltalake(table_uri, id_chunk(k), mode="error" if k == 0 else "append")
    dt = DeltaTable(table_uri)
    assert len(dt.file_uris()) == TEN_FILES
    return dt


def _update_c(dt: DeltaTable, ids: list[int], streamed_exec: bool = True, **kw) -> dict:
    src = pa.table({"id": pa.array(ids, pa.int64()), "c": pa.array(["u"] * len(ids))})
    return (
        dt.merge(
            src,
            "t.id = s.id",
            source_alias="s",
            target_alias="t",
            streamed_exec=streamed_exec,
            **kw,
        )
        .when_matched_update({"c": "s.c"})
        .execute()
    )


def _file_holding(dt: DeltaTable, key: int) -> str:
    aa = add_actions(dt).to_pylist()
    hits = [r["path"] for r in aa if r["min.id"] <= key <= r["max.id"]]
    assert len(hits) == 1
    return hits[0]


def test_merge_rewrites_only_files_holding_matched_rows(table_uri):
    """Assumption: MERGE removes exactly the data files that hold matched rows and adds their
    rewritten replacements; the other files stay in the table untouched (10 files, keys in 1:
    one removed, one added, nine unchanged).

    Sources: https://delta-io.github.io/delta-rs/usage/merging-tables/ ("selective changes ...
    without having to rewrite the entire table"); https://github.com/delta-io/delta-rs/issues/4512
    (merge/update/delete are copy-on-write file rewrites).
    """
    a = "merge-rewrites-only-matched-files"
    dt = _ten_file_table(table_uri)
    before = set(add_actions(dt).column("path").to_pylist())
    target_file = _file_holding(dt, 305)
    metrics = _update_c(dt, [305, 310])
    after = set(add_actions(dt).column("path").to_pylist())
    assert before - after == {target_file}, broken(a, f"removed {sorted(before - after)}")
    assert len(after - before) == 1, broken(a, f"added {sorted(after - before)}")
    assert len(before & after) == TEN_FILES - 1, broken(a, "an unmatched file was rewritten")
    assert (metrics["num_target_files_removed"], metrics["num_target_files_added"]) == (1, 1), (
        broken(a, f"merge metrics {metrics}")
    )
    assert metrics["num_target_rows_updated"] == 2 and metrics["num_target_rows_copied"] == 98, (
        broken(a, f"row metrics {metrics}")
    )


def test_merge_can_set_columns_to_null(table_uri):
    """Assumption: MERGE can set a column to NULL, both with an explicit ``"NULL"`` update
    expression and by updating from a NULL source value (``when_matched_update_all``).

    Source: https://delta-io.github.io/delta-rs/api/delta_table/delta_table_merger/
    (when_matched_update: SQL expressions; when_matched_update_all).
    """
    a = "merge-set-null"
    write_deltalake(table_uri, envelope_rows([1, 2, 3]), mode="error")
    dt = DeltaTable(table_uri)
    (
        dt.merge(pa.table({"id": pa.array([1], pa.int64())}), "t.id = s.id", "s", "t")
        .when_matched_update({"body_ciphertext": "NULL", "s": "NULL"})
        .execute()
    )
    src = envelope_rows([2])
    src = src.set_column(2, "body_ciphertext", pa.array([None], pa.binary()))
    src = src.set_column(3, "tags", pa.array([None], LIST_OF_STRUCT))
    dt.merge(src, "t.id = s.id", "s", "t").when_matched_update_all().execute()
    rows = {r["id"]: r for r in dt.to_pyarrow_table().to_pylist()}
    assert rows[1]["body_ciphertext"] is None and rows[1]["s"] is None, broken(
        a, f"explicit NULL update not applied: {rows[1]}"
    )
    assert rows[2]["body_ciphertext"] is None and rows[2]["tags"] is None, broken(
        a, f"null source values not applied: {rows[2]}"
    )
    assert rows[3]["body_ciphertext"] == b"\x00ct-3\xff", broken(a, "unmatched row was changed")


def test_merge_handles_binary_and_list_of_struct_columns(table_uri):
    """Assumption: MERGE updates and inserts rows with ``binary`` (arbitrary bytes, incl. NUL)
    and ``list<struct>`` columns (incl. empty lists and null struct fields) and reads them back
    unchanged.

    Sources: https://delta-io.github.io/delta-rs/usage/merging-tables/;
    https://delta-io.github.io/delta-rs/upgrade-guides/guide-1.0.0/ (Arrow types passed through
    unmodified by write_deltalake and merge).
    """
    a = "merge-binary-list-struct"
    write_deltalake(table_uri, envelope_rows([1, 2]), mode="error")
    dt = DeltaTable(table_uri)
    src = pa.table(
        {
            "id": pa.array([2, 3], pa.int64()),
            "s": pa.array(["upd", "ins"]),
            "body_ciphertext": pa.array([b"\x00\x01\xfe\xff", b""], pa.binary()),
            "tags": pa.array([[{"k": "x", "n": 1}, {"k": None, "n": None}], []], LIST_OF_STRUCT),
        }
    )
    (
        dt.merge(src, "t.id = s.id", "s", "t")
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute()
    )
    rows = {r["id"]: r for r in dt.to_pyarrow_table().to_pylist()}
    assert rows[2]["body_ciphertext"] == b"\x00\x01\xfe\xff", broken(a, f"binary: {rows[2]}")
    assert rows[2]["tags"] == [{"k": "x", "n": 1}, {"k": None, "n": None}], broken(
        a, f"list<struct> update: {rows[2]['tags']}"
    )
    assert rows[3]["body_ciphertext"] == b"" and rows[3]["tags"] == [], broken(
        a, f"insert of empty binary / empty list: {rows[3]}"
    )
    assert rows[1] == envelope_rows([1]).to_pylist()[0], broken(a, "unmatched row changed")


def test_merge_writes_view_types_in_parquet(table_uri):
    """Assumption: files written by MERGE store ``string_view``/``binary_view`` and a list field
    named ``element`` in their Parquet (Arrow) schema, whereas ``write_deltalake`` writes
    ``string``/``binary``/``item``; readers that open the Parquet files directly must cast
    (``DeltaTable`` readers see the table schema).

    Source: https://delta-io.github.io/delta-rs/upgrade-guides/guide-1.0.0/ ("DeltaLake now always
    passes through all Arrow data types without modification for both write_deltalake and
    DeltaTable.merge").
    """
    a = "merge-writes-view-types"
    write_deltalake(table_uri, envelope_rows([1, 2]), mode="error")
    dt = DeltaTable(table_uri)
    written = pq.read_schema(added_paths(table_uri, 0)[0])
    dt.merge(envelope_rows([1]), "t.id = s.id", "s", "t").when_matched_update_all().execute()
    merged = pq.read_schema(added_paths(table_uri, dt.version())[0])
    assert (written.field("s").type, written.field("body_ciphertext").type) == (
        pa.string(),
        pa.binary(),
    ), broken(a, f"write_deltalake schema changed: {written}")
    assert written.field("tags").type.value_field.name == "item", broken(a, str(written))
    assert (merged.field("s").type, merged.field("body_ciphertext").type) == (
        pa.string_view(),
        pa.binary_view(),
    ), broken(a, f"MERGE no longer writes view types: {merged}")
    assert merged.field("tags").type.value_field.name == "element", broken(a, str(merged))
    assert dt.to_pyarrow_table().schema.field("s").type == pa.string(), broken(
        a, "table-level read schema is no longer plain string"
    )


def test_streamed_exec_false_derives_pruning_predicate_from_source(table_uri):
    """Assumption: with ``streamed_exec=False`` MERGE derives a pruning predicate from the source
    keys and skips target files that cannot match (10 files, keys in one: 1 scanned, 9 skipped).

    Sources: https://delta-io.github.io/delta-rs/usage/merging-tables/ (Optimizing Merge
    Performance: predicate from "the minimum and maximum of the join keys";
    num_target_files_skipped_during_scan); https://github.com/delta-io/delta-rs/issues/3786.
    """
    a = "merge-streamed-false-prunes"
    dt = _ten_file_table(table_uri)
    metrics = _update_c(dt, [305, 310], streamed_exec=False)
    assert metrics["num_target_files_skipped_during_scan"] > 0, broken(a, f"metrics {metrics}")
    assert (
        metrics["num_target_files_scanned"],
        metrics["num_target_files_skipped_during_scan"],
    ) == (
        1,
        9,
    ), broken(a, f"expected 1 scanned / 9 skipped, metrics {metrics}")


def test_streamed_exec_false_pruning_is_a_min_max_range(table_uri):
    """Assumption: the derived pruning predicate is the [min, max] range of the source keys, not
    the key set: keys 105 and 905 (files 1 and 9) make MERGE scan the nine files 1..9 and skip
    only file 0, although only two files are rewritten.

    Source: https://delta-io.github.io/delta-rs/usage/merging-tables/ ("the minimum and maximum
    of the join keys").
    """
    a = "merge-pruning-is-range"
    dt = _ten_file_table(table_uri)
    metrics = _update_c(dt, [105, 905], streamed_exec=False)
    assert (
        metrics["num_target_files_scanned"],
        metrics["num_target_files_skipped_during_scan"],
    ) == (
        9,
        1,
    ), broken(a, f"metrics {metrics}")
    assert metrics["num_target_files_removed"] == 2, broken(a, f"metrics {metrics}")


def test_streamed_exec_true_scans_every_file(table_uri):
    """Assumption: with the default ``streamed_exec=True`` MERGE on 1.6.6 scans every target
    file (no file skipped) even for a single key, although the current docs page describes
    predicate derivation for the streamed mode too; the lake-writer passes
    ``streamed_exec=False``.

    Sources: https://delta-io.github.io/delta-rs/usage/merging-tables/;
    https://github.com/delta-io/delta-rs/issues/3786 (streamed_exec=False).
    """
    a = "merge-streamed-true-scans-all"
    dt = _ten_file_table(table_uri)
    metrics = _update_c(dt, [305])
    assert (
        metrics["num_target_files_scanned"],
        metrics["num_target_files_skipped_during_scan"],
    ) == (
        TEN_FILES,
        0,
    ), broken(a, f"metrics {metrics}")


def test_streamed_false_merges_on_disjoint_files_both_commit(table_uri):
    """Assumption: two concurrent ``streamed_exec=False`` MERGEs (no app transactions) whose source
    keys fall in different files both commit: the second is rebased, not rejected.

    Sources: https://github.com/delta-io/delta-rs/pull/632 (conflict checker: files read vs
    files added/removed concurrently); https://delta-io.github.io/delta-rs/usage/merging-tables/.
    """
    a = "merge-disjoint-concurrent-commit"
    dt = _ten_file_table(table_uri)
    first, second = DeltaTable(table_uri), DeltaTable(table_uri)
    _update_c(first, [105], streamed_exec=False)
    _update_c(second, [705], streamed_exec=False)
    assert DeltaTable(table_uri).version() == dt.version() + 2, broken(a, "a merge was lost")
    rows = {r["id"]: r["c"] for r in DeltaTable(table_uri).to_pyarrow_table().to_pylist()}
    assert (rows[105], rows[705]) == ("u", "u"), broken(a, "an update is missing")


@pytest.mark.parametrize("streamed_exec", [False, True])
def test_concurrent_merges_with_same_app_id_always_rejected(table_uri, streamed_exec):
    """Assumption: with app transactions, a concurrent MERGE carrying the same app id is always
    rejected (``CommitFailedError``), even when its files do not overlap the winner's. With
    ``streamed_exec=False`` the error says "Concurrent transaction failed" (the txn check); with
    ``streamed_exec=True`` the file-level check fires first ("... added new data").

    Sources: https://github.com/delta-io/delta-rs/pull/632;
    https://github.com/delta-io/delta-rs/issues/2130.
    """
    a = f"merge-same-app-id-rejected[streamed_exec={streamed_exec}]"
    _ten_file_table(table_uri)
    first, second = DeltaTable(table_uri), DeltaTable(table_uri)

    def props(v: int) -> CommitProperties:
        return CommitProperties(app_transactions=[Transaction("writer", v)])

    _update_c(first, [105], streamed_exec=streamed_exec, commit_properties=props(1))
    reason = "added new data" if streamed_exec else "Concurrent transaction failed"
    with must_raise(CommitFailedError, a, match=reason):
        _update_c(second, [705], streamed_exec=streamed_exec, commit_properties=props(2))
    assert DeltaTable(table_uri).transaction_version("writer") == 1, broken(a, "loser recorded")


def test_streamed_true_merge_conflicts_with_concurrent_append(table_uri):
    """Assumption: a default (``streamed_exec=True``) MERGE conflicts with any concurrent append,
    even one that adds keys it does not touch ("a concurrent transactions added new data").

    Sources: https://github.com/delta-io/delta-rs/pull/632;
    https://github.com/delta-io/delta-rs/issues/3786.
    """
    a = "merge-streamed-true-conflicts-append"
    _ten_file_table(table_uri)
    merger, appender = DeltaTable(table_uri), DeltaTable(table_uri)
    write_deltalake(appender, id_chunk(50), mode="append")
    with must_raise(CommitFailedError, a, match="concurrent transaction"):
        _update_c(merger, [305])


def test_streamed_false_merge_tolerates_append_outside_its_range(table_uri):
    """Assumption: a ``streamed_exec=False`` MERGE commits over a concurrent append whose keys lie
    outside the MERGE's derived key range (the append's file was not read by the MERGE).

    Sources: https://github.com/delta-io/delta-rs/pull/632;
    https://delta-io.github.io/delta-rs/usage/merging-tables/.
    """
    a = "merge-streamed-false-tolerates-append"
    dt = _ten_file_table(table_uri)
    merger, appender = DeltaTable(table_uri), DeltaTable(table_uri)
    write_deltalake(appender, id_chunk(50), mode="append")
    _update_c(merger, [305], streamed_exec=False)
    assert DeltaTable(table_uri).version() == dt.version() + 2, broken(a, "merge not committed")


def test_concurrent_merges_touching_the_same_file_conflict(table_uri):
    """Assumption: two concurrent MERGEs that rewrite the same file conflict even with
    ``streamed_exec=False`` and no app transactions; the second raises ``CommitFailedError``.

    Source: https://github.com/delta-io/delta-rs/pull/632.
    """
    a = "merge-same-file-conflict"
    _ten_file_table(table_uri)
    first, second = DeltaTable(table_uri), DeltaTable(table_uri)
    _update_c(first, [405], streamed_exec=False)
    with must_raise(CommitFailedError, a):
        _update_c(second, [406], streamed_exec=False)
