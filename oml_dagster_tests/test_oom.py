"""An out-of-memory kill by the kernel in the middle of a drain, then a drain that finishes with
the lake exact: `oml-lake drain` runs in a memory-limited cgroup
(`oml_testbed.memory_cgroup`, v2 or v1) whose limit sits below what its batches need, so the
kernel's OOM killer ends it with SIGKILL part way (no handler runs, as in a container over its
limit); a second drain without the limit goes on from what the lake's txn versions record."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import psycopg
import pytest

from oml_dagster.lake.store.layout import Lake
from oml_dagster_tests.helpers import assert_exactly_once
from oml_testbed.memory_cgroup import CgroupUnavailable, memory_limited

MIB = 1024 * 1024
# Above what the command needs to start and sequence (about 200 MiB here), below what one batch of
# these tenants needs (a whole tenant's 18,000 ops: 380-430 MiB, measured on this machine).
LIMIT = int(os.environ.get("OML_TEST_OOM_LIMIT_MIB", "300")) * MIB


def _drain(env: dict[str, str], preexec=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "oml_dagster.cli", "drain", "--until-idle"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        preexec_fn=preexec,
    )


def test_a_drain_killed_by_the_kernel_for_memory_is_finished_exact_by_the_next(dsn, conn, tmp_path):
    simulate = subprocess.run(
        [sys.executable, "-m", "oml_dagster.cli", "simulate", "--tenants", "2", "--claims",
         "6000", "--seed", "45", "--no-progress"],
        env={**os.environ, "OML_PG_DSN": dsn},
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert simulate.returncode == 0, simulate.stderr
    lake = Lake(str(tmp_path / "oml-lake"))
    env = {
        **os.environ,
        "OML_PG_DSN": dsn,
        "OML_LAKE_URI": lake.root,
        # Whole-tenant batches and no budget: the batch's need is what the limit undercuts.
        "OML_MAX_BATCH": "50000",
        "OML_MEMORY_BUDGET_MIB": "0",
    }
    try:
        with memory_limited(LIMIT) as cgroup:
            killed = _drain(env, preexec=cgroup.enter)
            kills = cgroup.oom_kills()
    except CgroupUnavailable as missing:
        pytest.skip(str(missing))
    assert killed.returncode == -9, (killed.returncode, killed.stderr[-2000:])
    assert kills >= 1
    # It was at work, not starting: the sequencer's cut had committed.
    assert conn.execute("SELECT count(seq) FROM oml.outbox").fetchone()[0] > 0
    finished = _drain(env)
    assert finished.returncode == 0, finished.stderr
    tenants = [
        SimpleNamespace(tenant_id=t)
        for (t,) in conn.execute("SELECT DISTINCT tenant_id::text FROM oml.outbox")
    ]
    assert len(tenants) == 2
    with psycopg.connect(dsn, autocommit=True) as check:
        assert_exactly_once(check, lake, tenants)
