"""Checkpoints and log cleanup: the txn record must survive both."""

from __future__ import annotations

import json
import time

import pyarrow.parquet as pq
from deltalake import (
    CommitProperties,
    DeltaTable,
    PostCommitHookProperties,
    Transaction,
    write_deltalake,
)
from deltalake.exceptions import DeltaError

from ._support import broken, id_chunk, log_dir, log_listing, must_raise

APP = "oml-lake-writer/tenant-a/events"
SHORT_LOG_RETENTION = "interval 1 second"
PAST_LOG_RETENTION_S = 1.3


def _commits(table_uri: str, n: int, configuration=None) -> DeltaTable:
    """n commits (versions 0..n-1), commit v carrying txn (APP, v) and ("other", 100 + v)."""
    for v in range(n):
        write_deltalake(
            table_uri,
            id_chunk(v, rows=5),
            mode="error" if v == 0 else "append",
            configuration=configuration if v == 0 else None,
            commit_properties=CommitProperties(
                app_transactions=[Transaction(APP, v), Transaction("other", 100 + v)]
            ),
        )
    return DeltaTable(table_uri)


def _checkpoints(table_uri: str) -> list[str]:
    return [f for f in log_listing(table_uri) if f.endswith(".checkpoint.parquet")]


def _last_checkpoint_version(table_uri: str) -> int:
    return json.loads((log_dir(table_uri) / "_last_checkpoint").read_text())["version"]


def test_automatic_checkpoint_at_checkpoint_interval(table_uri):
    """Assumption: with ``delta.checkpointInterval`` = 5 delta-rs writes a checkpoint by itself
    when (version + 1) % 5 == 0: none after versions 0..3, one at version 4, with
    ``_last_checkpoint`` pointing at it.

    Sources:
    https://delta-io.github.io/delta-rs/api/transaction/ (PostCommitHookProperties)
    https://docs.rs/deltalake-core/latest/deltalake_core/protocol/checkpoints/index.html
    """
    a = "auto-checkpoint-at-interval"
    _commits(table_uri, 4, configuration={"delta.checkpointInterval": "5"})
    assert _checkpoints(table_uri) == [], broken(a, f"early checkpoint {_checkpoints(table_uri)}")
    write_deltalake(table_uri, id_chunk(9, rows=5), mode="append")
    assert _checkpoints(table_uri) == [f"{4:020d}.checkpoint.parquet"], broken(
        a, f"log after version 4: {log_listing(table_uri)}"
    )
    assert _last_checkpoint_version(table_uri) == 4, broken(a, "_last_checkpoint not at 4")


def test_explicit_create_checkpoint(table_uri):
    """Assumption: ``DeltaTable.create_checkpoint()`` writes a checkpoint at the current version
    and updates ``_last_checkpoint`` (default interval 100 never triggers in the test).

    Sources: https://delta-io.github.io/delta-rs/api/delta_table/ (create_checkpoint);
    https://docs.rs/deltalake-core/latest/deltalake_core/protocol/checkpoints/index.html.
    """
    a = "explicit-checkpoint"
    dt = _commits(table_uri, 3)
    assert _checkpoints(table_uri) == [], broken(a, "a checkpoint appeared without being asked")
    dt.create_checkpoint()
    assert _checkpoints(table_uri) == [f"{2:020d}.checkpoint.parquet"], broken(
        a, f"log: {log_listing(table_uri)}"
    )
    assert _last_checkpoint_version(table_uri) == 2, broken(a, "_last_checkpoint not at 2")


def test_checkpoint_keeps_txn_rows(table_uri):
    """Assumption: the checkpoint carries one ``txn`` row per app id with its latest version, so
    ``transaction_version`` still answers when every JSON commit before it is gone.

    Sources: https://github.com/delta-io/delta-rs/issues/2130 (Transaction Identifiers);
    https://docs.rs/deltalake-core/latest/deltalake_core/protocol/checkpoints/index.html.
    """
    a = "checkpoint-keeps-txn"
    dt = _commits(table_uri, 4)
    dt.create_checkpoint()
    (cp,) = _checkpoints(table_uri)
    txn_rows = [r for r in pq.read_table(log_dir(table_uri) / cp).column("txn").to_pylist() if r]
    assert {(r["appId"], r["version"]) for r in txn_rows} == {(APP, 3), ("other", 103)}, broken(
        a, f"txn rows in checkpoint: {txn_rows}"
    )
    for f in log_dir(table_uri).glob("*.json"):
        f.unlink()
    fresh = DeltaTable(table_uri)
    assert (fresh.transaction_version(APP), fresh.transaction_version("other")) == (3, 103), broken(
        a, "txn versions not readable from the checkpoint alone"
    )
    assert fresh.to_pyarrow_table().num_rows == 20, broken(a, "data not readable from checkpoint")


def test_cleanup_metadata_keeps_logs_inside_log_retention(table_uri):
    """Assumption: ``cleanup_metadata()`` takes no retention argument and uses
    ``delta.logRetentionDuration`` (default 30 days): right after a checkpoint it deletes nothing.

    Sources: https://delta-io.github.io/delta-rs/api/delta_table/ (cleanup_metadata);
    https://github.com/delta-io/delta-rs/issues/2072 (logRetentionDuration).
    """
    a = "cleanup-honours-default-log-retention"
    dt = _commits(table_uri, 4)
    dt.create_checkpoint()
    before = log_listing(table_uri)
    dt.cleanup_metadata()
    assert log_listing(table_uri) == before, broken(
        a, f"removed {set(before) - set(log_listing(table_uri))}"
    )


def test_cleanup_metadata_needs_a_checkpoint(table_uri):
    """Assumption: with an expired ``delta.logRetentionDuration`` but no checkpoint,
    ``cleanup_metadata()`` deletes no commit (it only removes logs a checkpoint covers).

    Source: https://github.com/delta-io/delta-rs/issues/2072 ("it doesn't remove any logs since
    that could corrupt the table" without checkpoints).
    """
    a = "cleanup-needs-checkpoint"
    dt = _commits(table_uri, 4, configuration={"delta.logRetentionDuration": SHORT_LOG_RETENTION})
    time.sleep(PAST_LOG_RETENTION_S)
    before = log_listing(table_uri)
    dt.cleanup_metadata()
    assert log_listing(table_uri) == before, broken(a, "commits deleted without a checkpoint")
    assert DeltaTable(table_uri, version=0).version() == 0, broken(a, "version 0 unreadable")


def test_cleanup_expired_logs_keeps_latest_version_and_txn(table_uri):
    """Assumption: after a checkpoint and an expired ``delta.logRetentionDuration``,
    ``cleanup_metadata()`` deletes the commits before the checkpoint; the latest version still
    reads with all data and every app id's txn version (read from the checkpoint); time travel to
    a deleted version then fails with ``DeltaError``.

    Sources: https://delta-io.github.io/delta-rs/api/delta_table/ (cleanup_metadata);
    https://github.com/delta-io/delta-rs/issues/2072.
    """
    a = "cleanup-keeps-latest-and-txn"
    dt = _commits(table_uri, 4, configuration={"delta.logRetentionDuration": SHORT_LOG_RETENTION})
    dt.create_checkpoint()
    time.sleep(PAST_LOG_RETENTION_S)
    dt.cleanup_metadata()
    remaining = log_listing(table_uri)
    assert not any(f"{v:020d}.json" in remaining for v in range(3)), broken(
        a, f"expired commits kept: {remaining}"
    )
    fresh = DeltaTable(table_uri)
    assert fresh.version() == 3 and fresh.to_pyarrow_table().num_rows == 20, broken(
        a, "latest version not readable after cleanup"
    )
    assert (fresh.transaction_version(APP), fresh.transaction_version("other")) == (3, 103), broken(
        a, "txn versions lost by log cleanup"
    )
    with must_raise(DeltaError, a):
        DeltaTable(table_uri, version=1)


def test_automatic_checkpoint_also_cleans_expired_logs(table_uri):
    """Assumption: when delta-rs writes an automatic checkpoint it also runs log cleanup as a
    post-commit hook (``cleanup_expired_logs`` defaults to the table's
    ``delta.enableExpiredLogCleanup``, on by default), so with a short
    ``delta.logRetentionDuration`` older commits vanish without ``cleanup_metadata()`` being
    called; the txn record survives. ``PostCommitHookProperties(cleanup_expired_logs=False)`` on
    the commit keeps them.

    Sources:
    https://delta-io.github.io/delta-rs/api/transaction/ (PostCommitHookProperties:
    create_checkpoint, cleanup_expired_logs)
    https://docs.rs/deltalake-core/latest/deltalake_core/protocol/checkpoints/index.html
    (cleanup_expired_logs_for)
    """
    a = "auto-checkpoint-cleans-logs"
    conf = {"delta.logRetentionDuration": SHORT_LOG_RETENTION, "delta.checkpointInterval": "5"}
    kept_uri = f"{table_uri}-no-cleanup"
    _commits(table_uri, 4, configuration=conf)
    _commits(kept_uri, 4, configuration=conf)
    time.sleep(PAST_LOG_RETENTION_S)
    write_deltalake(table_uri, id_chunk(9, rows=5), mode="append")
    write_deltalake(
        kept_uri,
        id_chunk(9, rows=5),
        mode="append",
        post_commithook_properties=PostCommitHookProperties(cleanup_expired_logs=False),
    )
    listing = log_listing(table_uri)
    assert not any(f"{v:020d}.json" in listing for v in range(4)), broken(
        a, f"expired commits kept after the automatic checkpoint: {listing}"
    )
    assert f"{4:020d}.checkpoint.parquet" in listing, broken(a, f"no checkpoint: {listing}")
    fresh = DeltaTable(table_uri)
    assert fresh.version() == 4 and fresh.transaction_version(APP) == 3, broken(
        a, "latest state or txn lost"
    )
    kept = log_listing(kept_uri)
    assert all(f"{v:020d}.json" in kept for v in range(5)), broken(
        a, f"cleanup_expired_logs=False did not keep the commits: {kept}"
    )
    assert f"{4:020d}.checkpoint.parquet" in kept, broken(a, "checkpoint hook skipped")
