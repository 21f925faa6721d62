"""`OpenTables.txn`: a drain's tables answer their app transaction from what they last read or
committed, and read the log again whenever the table moved: another writer's commit, the
writer's own, or a table deleted and created again under the drain."""

from __future__ import annotations

import shutil

import pyarrow as pa
from deltalake import CommitProperties, Transaction, write_deltalake

from oml_dagster.lake.model.tables import APP_ID
from oml_dagster.lake.store.layout import Lake
from oml_dagster.lake.store.open_tables import OpenTables

ROWS = pa.table({"n": pa.array([1], pa.int64())})


def _append(target, txn: int, mode: str = "append") -> None:
    write_deltalake(
        target,
        ROWS,
        mode=mode,
        commit_properties=CommitProperties(app_transactions=[Transaction(APP_ID, txn)]),
    )


def test_the_txn_follows_every_move_of_the_table(tmp_path):
    lake = Lake(str(tmp_path / "oml-lake"))
    uri = str(tmp_path / "oml-lake" / "t")
    _append(uri, 5, mode="error")
    tables = OpenTables(lake)
    table = tables.open(uri)
    assert tables.txn(uri, table) == 5
    assert tables.txn(uri, None) == 0

    _append(lake.open(uri), 9)  # another writer
    table = tables.open(uri)
    assert tables.txn(uri, table) == 9 == table.transaction_version(APP_ID)

    _append(table, 12)  # the drain's own commit, which it records
    tables.keep(uri, table, 12)
    assert tables.txn(uri, tables.open(uri)) == 12 == table.transaction_version(APP_ID)

    shutil.rmtree(uri)  # deleted under the drain, then created again by a rebuild
    _append(uri, 3, mode="error")
    table = tables.open(uri)
    assert table.version() == 0
    assert tables.txn(uri, table) == 3


def test_a_table_without_the_writers_transaction_reads_as_zero(tmp_path):
    lake = Lake(str(tmp_path / "oml-lake"))
    uri = str(tmp_path / "oml-lake" / "t")
    write_deltalake(uri, ROWS)
    tables = OpenTables(lake)
    assert tables.txn(uri, tables.open(uri)) == 0
