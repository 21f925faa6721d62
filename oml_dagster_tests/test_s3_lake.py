"""The writer against a real S3 API server on loopback: the same tables as a local lake, replays
skip, and two racing writers are fenced by put-if-absent plus the txn version."""

from __future__ import annotations

import threading

import psycopg
import pytest

from oml_dagster.lake.store.lookups import FileKeys
from oml_dagster.lake.store.open_tables import OpenTables
from oml_dagster.lake.write.drain import DrainPolicy, drain
from oml_dagster.lake.write.writer import WriterConfig, drain_tenant
from oml_dagster_tests.helpers import LakeView, lake_snapshot
from oml_dagster_tests.test_commit_fence import mixed_workload

pytestmark = pytest.mark.s3


def test_s3_lake_equals_a_local_lake_and_replays_skip(conn, lake, tenant, s3_lake):
    mixed_workload(conn, tenant)
    drain(
        conn,
        s3_lake,
        [tenant.tenant_id],
        policy=DrainPolicy(until_idle=True, config=WriterConfig(max_batch=9, txn_lag_limit=4)),
    )
    drain(conn, lake, [tenant.tenant_id], policy=DrainPolicy(until_idle=True))
    assert lake_snapshot(s3_lake, tenant.tenant_id) == lake_snapshot(lake, tenant.tenant_id)
    assert not drain_tenant(conn, s3_lake, tenant.tenant_id).committed


def test_two_writers_racing_on_s3(conn, dsn, lake, tenant, s3_lake):
    mixed_workload(conn, tenant, claims=8)
    errors = []

    def writer(max_batch: int) -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as own:
                config = WriterConfig(max_batch=max_batch, txn_lag_limit=max(1, max_batch // 2))
                drain(
                    own,
                    s3_lake,
                    [tenant.tenant_id],
                    policy=DrainPolicy(until_idle=True, config=config),
                )
        except Exception as error:
            errors.append(error)

    threads = [threading.Thread(target=writer, args=(n,)) for n in (5, 7)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert not errors, errors
    drain(conn, s3_lake, [tenant.tenant_id], policy=DrainPolicy(until_idle=True))
    bronze = LakeView(s3_lake, tenant.tenant_id).bronze
    assert len(bronze) == len({r["journal_seq"] for r in bronze})
    drain(conn, lake, [tenant.tenant_id], policy=DrainPolicy(until_idle=True))
    assert lake_snapshot(s3_lake, tenant.tenant_id) == lake_snapshot(lake, tenant.tenant_id)


def test_lookups_by_query_on_s3_give_the_lake_lookups_by_reading_give(
    conn, lake, tenant, s3_lake, monkeypatch
):
    """Every lookup of the drain into S3 goes to the query engine (ADR 0043), every lookup of
    the drain into the local lake reads the files' match columns: the same tables."""
    mixed_workload(conn, tenant)
    queried: list[int] = []
    rows_with = FileKeys.rows_with

    def counting(self, table, spec, matches):
        before = self.queried
        found = rows_with(self, table, spec, matches)
        if any(matches.values()):
            queried.append(self.queried - before)
        return found

    monkeypatch.setattr(FileKeys, "rows_with", counting)
    # Lookups in the files, not in small tables kept whole (ADR 0078).
    monkeypatch.setattr(OpenTables, "WHOLE_MOST_ROWS", 0)
    monkeypatch.setattr(FileKeys, "QUERY_FROM_ROWS", 0)
    monkeypatch.setattr(FileKeys, "QUERY_ROWS_PER_VALUE", 0)
    config = WriterConfig(max_batch=9, txn_lag_limit=4)
    drain(conn, s3_lake, [tenant.tenant_id], policy=DrainPolicy(until_idle=True, config=config))
    assert queried and set(queried) == {1}  # each lookup one query

    monkeypatch.setattr(FileKeys, "QUERY_MOST_VALUES", 0)
    queried.clear()
    drain(conn, lake, [tenant.tenant_id], policy=DrainPolicy(until_idle=True, config=config))
    assert queried and set(queried) == {0}
    assert lake_snapshot(s3_lake, tenant.tenant_id) == lake_snapshot(lake, tenant.tenant_id)
