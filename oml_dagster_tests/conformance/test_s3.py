"""S3: commits are put-if-absent (conditional PUT), against a real moto server on loopback."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError, TableNotFoundError

from ._support import broken, id_chunk, must_raise

pytestmark = pytest.mark.s3


def _commit_info(s3_table, version: int) -> dict:
    key = f"{s3_table.prefix}/_delta_log/{version:020d}.json"
    lines = s3_table.read_key(key).decode().splitlines()
    return next(json.loads(x)["commitInfo"] for x in lines if '"commitInfo"' in x)


def test_s3_write_and_read(s3_table):
    """Assumption: with ``AWS_ENDPOINT_URL``/``AWS_ALLOW_HTTP``/``AWS_REGION`` and static keys in
    ``storage_options`` (no locking provider, no DynamoDB) delta-rs creates, appends to and
    reads a Delta table on an S3 API server.

    Sources: https://delta-io.github.io/delta-rs/integrations/object-storage/s3/ (storage
    options: AWS_ENDPOINT_URL, AWS_REGION, ...); https://github.com/delta-io/delta-rs/discussions/4482
    (1.0 relies on S3 conditional writes; the DynamoDB log store is gone).
    """
    a = "s3-write-read"
    so = s3_table.storage_options
    write_deltalake(s3_table.uri, id_chunk(0), mode="error", storage_options=so)
    write_deltalake(s3_table.uri, id_chunk(1), mode="append", storage_options=so)
    dt = DeltaTable(s3_table.uri, storage_options=so)
    assert dt.version() == 1 and dt.to_pyarrow_table().num_rows == 200, broken(a, "read back")
    assert s3_table.log_keys() == [f"{s3_table.prefix}/_delta_log/{v:020d}.json" for v in (0, 1)], (
        broken(a, f"log objects {s3_table.log_keys()}")
    )


def test_s3_concurrent_commit_to_same_version_fails(s3_table):
    """Assumption: two handles loaded at the same version both commit: the first PUT of
    ``<version>.json`` wins, the second finds the object already there (put-if-absent) and, with
    retries off, fails with ``CommitFailedError``; the commit object keeps the winner's content.

    Sources: https://delta-io.github.io/delta-rs/integrations/object-storage/s3-like/
    (conditional put gives safe concurrency); https://github.com/apache/arrow-rs/pull/6682
    (object_store: native S3 conditional writes, PutMode::Create).
    """
    a = "s3-put-if-absent"
    so = s3_table.storage_options
    write_deltalake(s3_table.uri, id_chunk(0), mode="error", storage_options=so)
    first = DeltaTable(s3_table.uri, storage_options=so)
    second = DeltaTable(s3_table.uri, storage_options=so)
    no_retry = {"max_commit_retries": 0}
    write_deltalake(
        first,
        id_chunk(1),
        mode="append",
        commit_properties=CommitProperties(custom_metadata={"writer": "first"}, **no_retry),
    )
    with must_raise(CommitFailedError, a):
        write_deltalake(
            second,
            id_chunk(2),
            mode="append",
            commit_properties=CommitProperties(custom_metadata={"writer": "second"}, **no_retry),
        )
    assert _commit_info(s3_table, 1).get("writer") == "first", broken(
        a, "the losing writer overwrote the commit object"
    )
    assert len(s3_table.log_keys()) == 2, broken(a, f"log objects {s3_table.log_keys()}")
    dt = DeltaTable(s3_table.uri, storage_options=so)
    assert dt.version() == 1 and dt.to_pyarrow_table().num_rows == 200, broken(a, "table state")


def test_s3_concurrent_commit_with_same_app_id_rejected(s3_table):
    """Assumption: on S3 too, a concurrent commit carrying an app id that the winning commit
    recorded is rejected (``CommitFailedError``, "Concurrent transaction failed") with default
    retries, and the txn version stays the winner's.

    Sources: https://github.com/delta-io/delta-rs/pull/632;
    https://github.com/delta-io/delta-rs/issues/2130.
    """
    a = "s3-same-app-id-rejected"
    so = s3_table.storage_options
    write_deltalake(s3_table.uri, id_chunk(0), mode="error", storage_options=so)
    first = DeltaTable(s3_table.uri, storage_options=so)
    second = DeltaTable(s3_table.uri, storage_options=so)

    def txn(v: int) -> CommitProperties:
        return CommitProperties(app_transactions=[Transaction("writer", v)])

    write_deltalake(first, id_chunk(1), mode="append", commit_properties=txn(1))
    with must_raise(CommitFailedError, a, match="Concurrent transaction failed"):
        write_deltalake(second, id_chunk(2), mode="append", commit_properties=txn(2))
    dt = DeltaTable(s3_table.uri, storage_options=so)
    assert dt.transaction_version("writer") == 1, broken(a, "losing txn recorded")


def test_s3_losing_blind_append_is_retried_by_default(s3_table):
    """Assumption: with default commit retries, the losing blind append on S3 is rebased onto
    the next version rather than failing or overwriting.

    Sources: https://github.com/delta-io/delta-rs/issues/3066 (retry after VersionAlreadyExists);
    https://github.com/delta-io/delta-rs/issues/1595.
    """
    a = "s3-blind-append-retried"
    so = s3_table.storage_options
    write_deltalake(s3_table.uri, id_chunk(0), mode="error", storage_options=so)
    first = DeltaTable(s3_table.uri, storage_options=so)
    second = DeltaTable(s3_table.uri, storage_options=so)
    write_deltalake(first, id_chunk(1), mode="append")
    write_deltalake(second, id_chunk(2), mode="append")
    dt = DeltaTable(s3_table.uri, storage_options=so)
    assert dt.version() == 2 and dt.to_pyarrow_table().num_rows == 300, broken(
        a, f"version {dt.version()}"
    )


@pytest.mark.parametrize("key", ["aws_conditional_put", "conditional_put", "AWS_CONDITIONAL_PUT"])
def test_s3_conditional_put_disabled_makes_writes_fail(s3_table, key):
    """Assumption: the object_store option ``aws_conditional_put`` (aliases ``conditional_put``,
    ``AWS_CONDITIONAL_PUT``) set to ``disabled`` makes every Delta commit fail with ``OSError``
    ("... PutMode::Create when conditional put is disabled not yet implemented"): no table is
    created and no append to an existing table commits; delta-rs 1.6.6 has no unsafe fallback
    for S3 commits.

    Sources:
    https://delta-io.github.io/delta-rs/integrations/object-storage/s3/ (``aws_conditional_put``)
    https://docs.rs/object_store/latest/object_store/aws/enum.S3ConditionalPut.html
    https://github.com/apache/arrow-rs/pull/6682 (native S3 conditional writes)
    """
    a = f"s3-conditional-put-disabled[{key}]"
    so = dict(s3_table.storage_options, **{key: "disabled"})
    with must_raise(OSError, a, match="conditional put is disabled"):
        write_deltalake(s3_table.uri, id_chunk(0), mode="error", storage_options=so)
    assert s3_table.log_keys() == [], broken(a, f"log objects written: {s3_table.log_keys()}")
    with must_raise(TableNotFoundError, a):
        DeltaTable(s3_table.uri, storage_options=s3_table.storage_options)

    write_deltalake(s3_table.uri, id_chunk(0), storage_options=s3_table.storage_options)
    with must_raise(OSError, a, match="conditional put is disabled"):
        write_deltalake(s3_table.uri, id_chunk(1), mode="append", storage_options=so)
    assert len(s3_table.log_keys()) == 1, broken(a, f"append committed: {s3_table.log_keys()}")


def test_s3_conditional_put_etag_also_works(s3_table):
    """Assumption: ``aws_conditional_put=etag`` (the mode documented for S3-compatible stores)
    also commits against the moto server, like the default.

    Source: https://delta-io.github.io/delta-rs/integrations/object-storage/s3-like/
    ("'aws_conditional_put': 'etag'").
    """
    a = "s3-conditional-put-etag"
    so = dict(s3_table.storage_options, aws_conditional_put="etag")
    write_deltalake(s3_table.uri, pa.table({"id": pa.array([1], pa.int64())}), storage_options=so)
    write_deltalake(
        s3_table.uri, pa.table({"id": pa.array([2], pa.int64())}), mode="append", storage_options=so
    )
    assert DeltaTable(s3_table.uri, storage_options=so).version() == 1, broken(a, "not committed")
