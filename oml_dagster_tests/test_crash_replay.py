"""Exactly-once through crashes: a writer killed with SIGKILL (a real subprocess) at random
points, many times, then finishing, leaves every event in bronze once and every claim row once
with its right final state."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest

from oml_dagster.lake.store.layout import Lake
from oml_dagster.lake.write.drain import DrainPolicy, drain
from oml_dagster.simulate import producer
from oml_dagster_tests.helpers import assert_exactly_once
from oml_dagster_tests.test_commit_fence import mixed_workload

# Dies at its k-th table commit: SIGKILL from inside, between fold and commit or between tables.
_KILL_AT_COMMIT = """
import os, signal, sys
import psycopg
from oml_dagster.lake.store.layout import Lake
from oml_dagster.lake.write.writer import WriterConfig, drain_tenant
from oml_dagster.lake.ingest import sequencer
from oml_dagster.lake.write.commit import CommitObserver
k = int(sys.argv[1]); calls = 0
class Hook(CommitObserver):
    def before(self, commit):
        global calls
        calls += 1
        if calls == k:
            os.kill(os.getpid(), signal.SIGKILL)
with psycopg.connect(os.environ["OML_PG_DSN"], autocommit=True) as conn:
    sequencer.sequence(conn)
    for tenant in sys.argv[2:]:
        for _ in range(50):
            if not drain_tenant(conn, Lake(os.environ["OML_LAKE_URI"]), tenant,
                                config=WriterConfig(max_batch=9, txn_lag_limit=4), commits=Hook()).ops:
                break
"""


def _env(dsn: str, lake: Lake) -> dict:
    return {**os.environ, "OML_PG_DSN": dsn, "OML_LAKE_URI": lake.root}


def _finish_and_assert_exactly_once(conn, lake: Lake, tenants) -> None:
    drain(conn, lake, [t.tenant_id for t in tenants], policy=DrainPolicy(until_idle=True))
    assert_exactly_once(conn, lake, tenants)


@pytest.mark.slow
def test_killed_at_every_commit_point_then_finishing(conn, lake, dsn):
    tenants = [producer.create_tenant(conn) for _ in range(2)]
    for keys in tenants:
        mixed_workload(conn, keys, claims=8)
    ids = [t.tenant_id for t in tenants]
    kills = 0
    for k in range(1, 30):
        done = subprocess.run(
            [sys.executable, "-c", _KILL_AT_COMMIT, str(k), *ids], env=_env(dsn, lake), timeout=120
        )
        kills += done.returncode == -signal.SIGKILL
    assert kills >= 10, "the writer really died mid-drain, many times"
    _finish_and_assert_exactly_once(conn, lake, tenants)


@pytest.mark.slow
def test_killed_at_random_times_then_finishing(conn, lake, dsn):
    rng = random.Random(11)
    tenants = [producer.create_tenant(conn) for _ in range(2)]
    for keys in tenants:
        mixed_workload(conn, keys, claims=10)
    cmd = [sys.executable, "-m", "oml_dagster.cli", "drain", "--until-idle", "--max-batch", "6"]
    for _ in range(8):
        proc = subprocess.Popen(cmd, env=_env(dsn, lake), stdout=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.8, 2.5))
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    _finish_and_assert_exactly_once(conn, lake, tenants)
