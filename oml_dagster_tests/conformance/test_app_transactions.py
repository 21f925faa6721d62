"""Application transactions (Delta ``txn`` actions): the lake-writer's exactly-once bookkeeping.

The lake-writer records ``Transaction(app_id, version)`` in the same commit as the data it writes
and, before writing a batch, reads ``DeltaTable.transaction_version(app_id)`` to skip batches
already applied. These tests pin what delta-rs does and does not guarantee about that record.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError

from ._support import actions_of, broken, id_chunk, must_raise

APP = "oml-lake-writer/tenant-a/events"


def _txn(version: int, app_id: str = APP, **metadata: str) -> CommitProperties:
    return CommitProperties(
        app_transactions=[Transaction(app_id=app_id, version=version)],
        custom_metadata=metadata or None,
    )


def test_app_transaction_recorded_on_append(table_uri):
    """Assumption: an append via ``write_deltalake`` can carry application transactions and custom
    metadata in the same commit; ``transaction_version(app_id)`` reads each app id back (None for
    an unknown one) and the custom metadata lands as top-level keys of ``commitInfo``.

    Sources: https://delta-io.github.io/delta-rs/api/transaction/ (CommitProperties:
    app_transactions, custom_metadata); https://github.com/delta-io/delta-rs/issues/2130
    (Transaction Identifiers); https://github.com/delta-io/delta-rs/pull/3484
    (``transaction_version`` per application id).
    """
    a = "txn-on-append"
    props = CommitProperties(
        app_transactions=[Transaction(APP, 7), Transaction("other-app", 41)],
        custom_metadata={"oml.batch_id": "batch-7"},
    )
    write_deltalake(table_uri, id_chunk(0), mode="error", commit_properties=props)

    dt = DeltaTable(table_uri)
    assert dt.transaction_version(APP) == 7, broken(a, f"got {dt.transaction_version(APP)}")
    assert dt.transaction_version("other-app") == 41, broken(a, "second app id in one commit lost")
    assert dt.transaction_version("never-written") is None, broken(a, "unknown app id not None")
    txns = actions_of(table_uri, 0, "txn")
    assert {(t["appId"], t["version"]) for t in txns} == {(APP, 7), ("other-app", 41)}, broken(
        a, f"txn actions in commit 0: {txns}"
    )
    info = dt.history(1)[0]
    assert info.get("oml.batch_id") == "batch-7", broken(a, f"custom metadata not in {info}")


def test_app_transaction_recorded_on_merge(table_uri):
    """Assumption: MERGE accepts ``commit_properties`` with application transactions and custom
    metadata and records both in the MERGE commit.

    Sources: https://delta-io.github.io/delta-rs/api/delta_table/ (``DeltaTable.merge``:
    commit_properties); https://delta-io.github.io/delta-rs/api/transaction/.
    """
    a = "txn-on-merge"
    write_deltalake(table_uri, id_chunk(0), mode="error", commit_properties=_txn(1))
    dt = DeltaTable(table_uri)
    src = pa.table({"id": pa.array([5, 1000], pa.int64()), "c": pa.array(["upd", "new"])})
    metrics = (
        dt.merge(
            src,
            "t.id = s.id",
            source_alias="s",
            target_alias="t",
            commit_properties=_txn(2, **{"oml.batch_id": "batch-2"}),
        )
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute()
    )
    assert metrics["num_target_rows_updated"] == 1, broken(a, f"merge metrics {metrics}")
    assert dt.transaction_version(APP) == 2, broken(a, f"got {dt.transaction_version(APP)}")
    assert DeltaTable(table_uri).transaction_version(APP) == 2, broken(a, "fresh handle disagrees")
    txns = actions_of(table_uri, dt.version(), "txn")
    assert [(t["appId"], t["version"]) for t in txns] == [(APP, 2)], broken(a, f"txn: {txns}")
    info = dt.history(1)[0]
    assert info["operation"] == "MERGE", broken(a, f"last operation {info['operation']}")
    assert info.get("oml.batch_id") == "batch-2", broken(a, f"custom metadata not in {info}")


def test_concurrent_commit_with_same_app_id_is_rejected(table_uri):
    """Assumption: two writers holding the table at the same version both commit with the same
    app id: the second commit fails with ``CommitFailedError`` ("Concurrent transaction failed")
    even though delta-rs would otherwise rebase a blind append; the table keeps the first txn.

    Sources: https://github.com/delta-io/delta-rs/pull/632 (ConflictChecker modelled on the
    reference implementation, which fails a commit whose app id was written concurrently);
    https://github.com/delta-io/delta-rs/issues/2130.
    """
    a = "same-app-id-concurrent-rejected"
    write_deltalake(table_uri, id_chunk(0), mode="error", commit_properties=_txn(1))
    first, second = DeltaTable(table_uri), DeltaTable(table_uri)
    assert first.version() == second.version() == 0
    write_deltalake(first, id_chunk(1), mode="append", commit_properties=_txn(2))
    with must_raise(CommitFailedError, a, match="Concurrent transaction failed"):
        write_deltalake(second, id_chunk(2), mode="append", commit_properties=_txn(3))
    latest = DeltaTable(table_uri)
    assert latest.version() == 1, broken(a, f"table advanced to {latest.version()}")
    assert latest.transaction_version(APP) == 2, broken(a, "losing txn version was recorded")
    second.update_incremental()
    assert second.transaction_version(APP) == 2, broken(a, "update_incremental did not catch up")


def test_same_app_id_rejected_at_any_staleness(table_uri):
    """Assumption: the same-app-id rejection also holds when the losing handle is several versions
    behind (the intervening commits include one carrying the app id and one that does not).

    Sources: https://github.com/delta-io/delta-rs/pull/632;
    https://github.com/delta-io/delta-rs/issues/2130.
    """
    a = "same-app-id-rejected-when-stale"
    write_deltalake(table_uri, id_chunk(0), mode="error")
    stale = DeltaTable(table_uri)
    writer = DeltaTable(table_uri)
    write_deltalake(writer, id_chunk(1), mode="append", commit_properties=_txn(10))
    write_deltalake(writer, id_chunk(2), mode="append")
    with must_raise(CommitFailedError, a, match="Concurrent transaction failed"):
        write_deltalake(stale, id_chunk(3), mode="append", commit_properties=_txn(11))
    assert DeltaTable(table_uri).transaction_version(APP) == 10, broken(a, "stale txn recorded")


def test_concurrent_blind_appends_with_different_app_ids_both_commit(table_uri):
    """Assumption: by default a blind append that loses the race is retried on top of the winner,
    so two writers with different app ids both commit and both txn versions are readable.

    Sources: https://github.com/delta-io/delta-rs/issues/1595 (configurable commit retries);
    https://delta-io.github.io/delta-rs/api/transaction/ (max_commit_retries).
    """
    a = "different-app-ids-retried"
    write_deltalake(table_uri, id_chunk(0), mode="error")
    first, second = DeltaTable(table_uri), DeltaTable(table_uri)
    write_deltalake(first, id_chunk(1), mode="append", commit_properties=_txn(1, app_id="x"))
    write_deltalake(second, id_chunk(2), mode="append", commit_properties=_txn(1, app_id="y"))
    latest = DeltaTable(table_uri)
    assert latest.version() == 2, broken(a, f"expected both commits, version {latest.version()}")
    assert (latest.transaction_version("x"), latest.transaction_version("y")) == (1, 1), broken(
        a, "a txn of the retried commit is missing"
    )
    assert latest.to_pyarrow_table().num_rows == 300, broken(a, "rows of a commit missing")


def test_max_commit_retries_zero_surfaces_the_conflict(table_uri):
    """Assumption: ``CommitProperties(max_commit_retries=0)`` turns the automatic rebase of a blind
    append off: the losing writer gets ``CommitFailedError`` and nothing is committed for it.

    Sources: https://delta-io.github.io/delta-rs/api/transaction/ (max_commit_retries);
    https://github.com/delta-io/delta-rs/issues/1595.
    """
    a = "max-commit-retries-0"
    write_deltalake(table_uri, id_chunk(0), mode="error")
    first, second = DeltaTable(table_uri), DeltaTable(table_uri)
    write_deltalake(first, id_chunk(1), mode="append")
    with must_raise(CommitFailedError, a):
        write_deltalake(
            second,
            id_chunk(2),
            mode="append",
            commit_properties=CommitProperties(max_commit_retries=0),
        )
    assert DeltaTable(table_uri).version() == 1, broken(a, "losing append was committed anyway")


def test_txn_versions_are_not_required_to_be_monotonic(table_uri):
    """Assumption: delta-rs does NOT enforce monotonic txn versions: committing v5 then v3 for the
    same app id succeeds and the table reports 3. The lake-writer must enforce its own ordering.

    Sources: https://github.com/delta-io/delta-rs/issues/2580 (a commit repeating an already
    committed app id/version is still written); https://github.com/delta-io/delta-rs/issues/3821
    (the meaning of txn versions is left to the application).
    """
    a = "txn-not-monotonic"
    write_deltalake(table_uri, id_chunk(0), mode="error")
    dt = DeltaTable(table_uri)
    write_deltalake(dt, id_chunk(1), mode="append", commit_properties=_txn(5))
    write_deltalake(dt, id_chunk(2), mode="append", commit_properties=_txn(3))
    assert dt.version() == 2, broken(a, f"regressing txn commit rejected? version {dt.version()}")
    assert DeltaTable(table_uri).transaction_version(APP) == 3, broken(
        a, f"expected 3, got {DeltaTable(table_uri).transaction_version(APP)}"
    )
    write_deltalake(dt, id_chunk(3), mode="append", commit_properties=_txn(3))
    assert dt.version() == 3, broken(a, "repeating the same txn version was refused")


def test_zero_row_append_still_commits_the_txn(table_uri):
    """Assumption: appending zero rows with an app transaction makes a commit that records the txn
    and adds no data file (the lake-writer acknowledges empty batches this way).

    Source: https://delta-io.github.io/delta-rs/api/delta_writer/ (write_deltalake,
    commit_properties).
    """
    a = "zero-row-append-commits-txn"
    write_deltalake(table_uri, id_chunk(0), mode="error")
    dt = DeltaTable(table_uri)
    files_before = len(dt.file_uris())
    write_deltalake(dt, id_chunk(1).slice(0, 0), mode="append", commit_properties=_txn(9))
    assert dt.version() == 1, broken(a, f"no commit for the empty batch (version {dt.version()})")
    assert dt.transaction_version(APP) == 9, broken(a, "txn of the empty batch not recorded")
    assert len(dt.file_uris()) == files_before, broken(a, "an empty batch added a data file")


def test_append_creates_missing_table_but_error_mode_detects_existing(table_uri):
    """Assumption: ``mode="append"`` silently creates a missing table, so table creation must use
    ``mode="error"``, which raises ``DeltaError`` when the table already exists.

    Source: https://delta-io.github.io/delta-rs/api/delta_writer/ ("If the table does not already
    exist, it will be created"; mode "error").
    """
    a = "append-creates-table"
    write_deltalake(table_uri, id_chunk(0), mode="append")
    assert DeltaTable(table_uri).version() == 0, broken(a, "append did not create the table")
    with must_raise(DeltaError, a, match="already exists"):
        write_deltalake(table_uri, id_chunk(1), mode="error")
    assert DeltaTable(table_uri).version() == 0, broken(a, "mode=error wrote to an existing table")


def test_failed_commit_leaves_orphan_parquet(table_uri):
    """Assumption: a commit that fails after writing data leaves its Parquet file(s) in the table
    directory, unreferenced by the log (only ``vacuum(full=True)`` collects them).

    Sources: https://delta-io.github.io/delta-rs/usage/managing-tables/ (vacuum);
    https://github.com/delta-io/delta-rs/issues/3066 (commit retry/failure path).
    """
    a = "failed-commit-orphans"
    write_deltalake(table_uri, id_chunk(0), mode="error", commit_properties=_txn(1))
    first, second = DeltaTable(table_uri), DeltaTable(table_uri)
    write_deltalake(first, id_chunk(1), mode="append", commit_properties=_txn(2))
    with must_raise(CommitFailedError, a):
        write_deltalake(second, id_chunk(2), mode="append", commit_properties=_txn(3))
    on_disk = {p.name for p in Path(table_uri).glob("*.parquet")}
    referenced = {Path(u).name for u in DeltaTable(table_uri).file_uris()}
    assert len(on_disk - referenced) == 1, broken(
        a, f"expected one orphan file, found {sorted(on_disk - referenced)}"
    )
