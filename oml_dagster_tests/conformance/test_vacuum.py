"""VACUUM: physical deletion of retracted/erased data (crypto-shredding relies on it)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pyarrow.parquet as pq
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import DeltaError

from ._support import broken, id_chunk, must_raise

RETENTION = "interval 2 seconds"
PAST_RETENTION_S = 2.6


def _table_with_one_tombstone(table_uri: str, configuration=None) -> tuple[DeltaTable, Path]:
    """v0 writes file A, v1 overwrites: A is tombstoned (removed from the log, still on disk)."""
    write_deltalake(table_uri, id_chunk(0), mode="error", configuration=configuration)
    (first,) = DeltaTable(table_uri).file_uris()
    write_deltalake(table_uri, id_chunk(1), mode="overwrite")
    dt = DeltaTable(table_uri)
    assert first not in dt.file_uris() and Path(first).exists()
    return dt, Path(first)


def test_vacuum_defaults_to_dry_run(table_uri):
    """Assumption: ``vacuum()`` is a dry run unless ``dry_run=False``: it lists the eligible files
    and deletes nothing (and commits nothing).

    Sources: https://delta-io.github.io/delta-rs/usage/managing-tables/ ("the function performs a
    dry-run by default"); https://delta-io.github.io/delta-rs/api/delta_table/ (vacuum).
    """
    a = "vacuum-default-dry-run"
    dt, tombstoned = _table_with_one_tombstone(table_uri)
    version = dt.version()
    listed = dt.vacuum(retention_hours=0, enforce_retention_duration=False)
    assert [Path(p).name for p in listed] == [tombstoned.name], broken(a, f"listed {listed}")
    assert tombstoned.exists(), broken(a, "the default call deleted the file")
    assert DeltaTable(table_uri).version() == version, broken(a, "a dry run committed")


def test_vacuum_honours_deleted_file_retention_duration(table_uri):
    """Assumption: with ``retention_hours=None`` vacuum uses ``delta.deletedFileRetentionDuration``
    (to the second): a file tombstoned less than the interval ago is kept, after the interval it
    is listed (even with retention enforcement on, since the check compares with the table
    property) and ``dry_run=False`` deletes it; the live file stays and the table reads. A real
    vacuum adds two commits (VACUUM START / VACUUM END).

    Sources:
    https://delta-io.github.io/delta-rs/api/delta_table/ (vacuum: "if none then the value from
    delta.deletedFileRetentionDuration is used")
    https://docs.rs/deltalake-core/latest/deltalake_core/operations/vacuum/index.html
    """
    a = "vacuum-honours-deletedFileRetentionDuration"
    conf = {"delta.deletedFileRetentionDuration": RETENTION}
    dt, tombstoned = _table_with_one_tombstone(table_uri, configuration=conf)
    early = dt.vacuum(retention_hours=None, enforce_retention_duration=False, dry_run=False)
    assert early == [] and tombstoned.exists(), broken(a, f"deleted inside retention: {early}")
    time.sleep(PAST_RETENTION_S)
    listed = dt.vacuum()
    assert [Path(p).name for p in listed] == [tombstoned.name], broken(
        a, f"after the interval the dry run listed {listed}"
    )
    version = dt.version()
    deleted = dt.vacuum(retention_hours=None, enforce_retention_duration=False, dry_run=False)
    assert [Path(p).name for p in deleted] == [tombstoned.name], broken(a, f"deleted {deleted}")
    assert not tombstoned.exists(), broken(a, "tombstoned file still on disk")
    fresh = DeltaTable(table_uri)
    assert fresh.to_pyarrow_table().num_rows == 100, broken(a, "live data lost")
    ops = [h["operation"] for h in fresh.history(2)]
    assert fresh.version() == version + 2 and ops == ["VACUUM END", "VACUUM START"], broken(
        a, f"vacuum commits: version {fresh.version()}, ops {ops}"
    )


def test_vacuum_rejects_retention_below_table_minimum_when_enforced(table_uri):
    """Assumption: with the default table retention (168 h) an explicit ``retention_hours`` below
    it raises unless ``enforce_retention_duration=False`` (``retention_hours`` is an integer).

    Source: https://delta-io.github.io/delta-rs/api/delta_table/ (vacuum:
    enforce_retention_duration).
    """
    a = "vacuum-enforces-minimum-retention"
    dt, tombstoned = _table_with_one_tombstone(table_uri)
    with must_raise(DeltaError, a, match="Invalid retention period"):
        dt.vacuum(retention_hours=1, dry_run=False)
    assert tombstoned.exists(), broken(a, "rejected vacuum deleted the file")


def test_full_vacuum_removes_old_orphans_only(table_uri):
    """Assumption: files in the table directory that the log never referenced (e.g. left by a
    failed commit) are removed only by ``vacuum(full=True)`` and only once older than the
    retention; a fresh orphan (an in-flight write) and ``_``-prefixed directories are kept.

    Sources:
    https://delta-io.github.io/delta-rs/api/delta_table/ (vacuum ``full``: "remove all files not
    referenced in the transaction log")
    https://docs.rs/deltalake-core/latest/deltalake_core/operations/vacuum/index.html
    """
    a = "vacuum-full-removes-orphans"
    conf = {"delta.deletedFileRetentionDuration": RETENTION}
    write_deltalake(table_uri, id_chunk(0), mode="error", configuration=conf)
    dt = DeltaTable(table_uri)
    root = Path(table_uri)
    old_orphan = root / "part-00000-old-orphan-c000.snappy.parquet"
    fresh_orphan = root / "part-00000-fresh-orphan-c000.snappy.parquet"
    underscored = root / "_staging" / "x.parquet"
    underscored.parent.mkdir()
    for p in (old_orphan, fresh_orphan, underscored):
        pq.write_table(id_chunk(9, rows=1), p)
    an_hour_ago = time.time() - 3600
    os.utime(old_orphan, (an_hour_ago, an_hour_ago))
    os.utime(underscored, (an_hour_ago, an_hour_ago))

    dt.vacuum(dry_run=False, enforce_retention_duration=False)
    assert old_orphan.exists(), broken(a, "a non-full vacuum removed an orphan")
    deleted = dt.vacuum(dry_run=False, full=True, enforce_retention_duration=False)
    assert [Path(p).name for p in deleted] == [old_orphan.name], broken(a, f"deleted {deleted}")
    assert not old_orphan.exists(), broken(a, "old orphan survived vacuum(full=True)")
    assert fresh_orphan.exists(), broken(a, "an orphan younger than the retention was removed")
    assert underscored.exists(), broken(a, "a file under an _-prefixed directory was removed")
    assert DeltaTable(table_uri).to_pyarrow_table().num_rows == 100, broken(a, "live data lost")


def test_checkpoint_after_expiry_drops_tombstone_so_only_full_vacuum_deletes(table_uri):
    """Assumption: a checkpoint written after a tombstone's ``delta.deletedFileRetentionDuration``
    has expired no longer carries that ``remove`` action, so a plain ``vacuum()`` on a handle
    loaded from that checkpoint no longer sees the superseded file and leaves it on disk; only
    ``vacuum(full=True)`` deletes it. (The handle that was open before the checkpoint still
    holds the tombstone in memory and would delete it.) Erasure relies on superseded ciphertext
    files being deleted: run full vacuums, or vacuum before checkpointing.

    Sources:
    https://delta-io.github.io/delta-rs/api/delta_table/ (vacuum ``full``: "when False, it will
    only vacuum not referenced files since last log checkpoint")
    https://docs.rs/deltalake-core/latest/deltalake_core/protocol/checkpoints/index.html
    """
    a = "checkpoint-drops-expired-tombstones"
    conf = {"delta.deletedFileRetentionDuration": RETENTION}
    dt, tombstoned = _table_with_one_tombstone(table_uri, configuration=conf)
    time.sleep(PAST_RETENTION_S)
    dt.create_checkpoint()
    (cp,) = [
        p
        for p in (Path(table_uri) / "_delta_log").iterdir()
        if p.name.endswith(".checkpoint.parquet")
    ]
    removes = [r for r in pq.read_table(cp).column("remove").to_pylist() if r]
    assert removes == [], broken(a, f"checkpoint kept expired tombstones: {removes}")
    reopened = DeltaTable(table_uri)  # state now comes from the checkpoint
    plain = reopened.vacuum(dry_run=False)
    assert plain == [] and tombstoned.exists(), broken(
        a, f"plain vacuum now finds the file dropped from the checkpoint: {plain}"
    )
    full = reopened.vacuum(dry_run=False, full=True)
    assert [Path(p).name for p in full] == [tombstoned.name], broken(a, f"full vacuum: {full}")
    assert not tombstoned.exists(), broken(a, "superseded file survived vacuum(full=True)")
