"""The writer against a real S3 API server on loopback: the same tables as a local lake, replays
skip, and two racing writers are fenced by put-if-absent plus the txn version."""

from __future__ import annotations

import threading

import psycopg
import pytest

from oml_dagster.lake.drain import drain
from oml_dagster.lake.writer import WriterConfig, drain_tenant
from oml_dagster_tests.helpers import LakeView, lake_snapshot
from oml_dagster_tests.test_commit_fence import mixed_workload

pytestmark = pytest.mark.s3


def test_s3_lake_equals_a_local_lake_and_replays_skip(conn, lake, tenant, s3_lake):
    mixed_workload(conn, tenant)
    drain(
        conn,
        s3_lake,
        [tenant.tenant_id],
        until_idle=True,
        config=WriterConfig(max_batch=9, txn_lag_limit=4),
    )
    drain(conn, lake, [tenant.tenant_id], until_idle=True)
    assert lake_snapshot(s3_lake, tenant.tenant_id) == lake_snapshot(lake, tenant.tenant_id)
    assert not drain_tenant(conn, s3_lake, tenant.tenant_id).committed


def test_two_writers_racing_on_s3(conn, dsn, lake, tenant, s3_lake):
    mixed_workload(conn, tenant, claims=8)
    errors = []

    def writer(max_batch: int) -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as own:
                config = WriterConfig(max_batch=max_batch, txn_lag_limit=max(1, max_batch // 2))
                drain(own, s3_lake, [tenant.tenant_id], until_idle=True, config=config)
        except Exception as error:
            errors.append(error)

    threads = [threading.Thread(target=writer, args=(n,)) for n in (5, 7)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert not errors, errors
    drain(conn, s3_lake, [tenant.tenant_id], until_idle=True)
    bronze = LakeView(s3_lake, tenant.tenant_id).bronze
    assert len(bronze) == len({r["journal_seq"] for r in bronze})
    drain(conn, lake, [tenant.tenant_id], until_idle=True)
    assert lake_snapshot(s3_lake, tenant.tenant_id) == lake_snapshot(lake, tenant.tenant_id)
