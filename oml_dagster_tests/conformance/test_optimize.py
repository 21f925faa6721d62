"""OPTIMIZE (bin-pack compaction and Z-order) versus the lake-writer's txn bookkeeping.

Compaction runs as a separate maintenance job; it must not disturb the per-app txn versions the
writer uses to skip already-applied batches, and it must stay traceable through commit metadata.
"""

from __future__ import annotations

import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from ._support import actions_of, broken, id_chunk

APP = "oml-lake-writer/tenant-a/events"


def _table_with_small_files(table_uri: str, files: int = 4) -> DeltaTable:
    for k in range(files):
        write_deltalake(
            table_uri,
            id_chunk(k, rows=10),
            mode="error" if k == 0 else "append",
            commit_properties=CommitProperties(app_transactions=[Transaction(APP, k + 1)]),
        )
    return DeltaTable(table_uri)


@pytest.mark.parametrize("kind", ["compact", "z_order"])
def test_optimize_drops_app_transactions_but_keeps_custom_metadata(table_uri, kind):
    """Assumption: OPTIMIZE (``compact`` and ``z_order``) accepts ``commit_properties`` but writes
    no ``txn`` action into its commit (the app transactions passed are dropped), while the custom
    metadata lands in the OPTIMIZE ``commitInfo``; ``transaction_version`` keeps the value the
    last data commit recorded.

    Sources:
    https://delta-io.github.io/delta-rs/api/delta_table/delta_table_optimizer/ (commit_properties)
    https://delta-io.github.io/delta-rs/usage/optimize/small-file-compaction-with-optimize/
    https://delta-io.github.io/delta-rs/usage/optimize/delta-lake-z-order/
    """
    a = f"optimize-{kind}-txn-and-metadata"
    dt = _table_with_small_files(table_uri)
    assert dt.transaction_version(APP) == 4
    props = CommitProperties(
        app_transactions=[Transaction(APP, 99), Transaction("maintenance", 1)],
        custom_metadata={"oml.maintenance": kind},
    )
    if kind == "compact":
        metrics = dt.optimize.compact(commit_properties=props)
    else:
        metrics = dt.optimize.z_order(["id"], commit_properties=props)
    assert metrics["numFilesRemoved"] == 4 and metrics["numFilesAdded"] == 1, broken(
        a, f"optimize did not rewrite the small files: {metrics}"
    )
    version = dt.version()
    assert actions_of(table_uri, version, "txn") == [], broken(
        a, f"OPTIMIZE commit now carries txn actions: {actions_of(table_uri, version, 'txn')}"
    )
    info = dt.history(1)[0]
    assert info["operation"] == "OPTIMIZE", broken(a, f"last operation {info['operation']}")
    assert info.get("oml.maintenance") == kind, broken(a, f"custom metadata missing from {info}")
    fresh = DeltaTable(table_uri)
    assert fresh.transaction_version(APP) == 4, broken(
        a, f"txn version changed by OPTIMIZE to {fresh.transaction_version(APP)}"
    )
    assert fresh.transaction_version("maintenance") is None, broken(
        a, "an app id passed only to OPTIMIZE became visible"
    )
    assert fresh.to_pyarrow_table().num_rows == 40, broken(a, "OPTIMIZE changed the row count")
