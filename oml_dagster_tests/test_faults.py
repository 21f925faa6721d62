"""Riding through the faults production brings (ADR 0045), with real parts: the writer's
PostgreSQL sessions killed or its server restarted in the middle of `oml-lake drain
--until-idle`, an S3 API server behind a proxy that fails a share of requests, a lake on a full
tmpfs. After each, the lake equals a fault-free drain's (exactly once), and every non-zero exit
is one line a person can act on."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from oml_dagster.lake import db
from oml_dagster.lake.store.layout import Lake
from oml_dagster.simulate import producer
from oml_dagster_tests.helpers import assert_exactly_once
from oml_dagster_tests.test_commit_fence import mixed_workload
from oml_testbed.fault_proxy import KINDS, FaultProxy
from oml_testbed.s3_server import lake_env, new_bucket, s3_client, store_options

DRAIN = [sys.executable, "-m", "oml_dagster.cli", "drain", "--until-idle", "--max-batch", "10"]
# A streak of faults is ridden through quickly here: the bound is what a test can wait for.
FAST_RETRY = {"OML_RETRY_SECONDS": "60", "OML_RETRY_ATTEMPTS": "40"}


def _env(dsn: str, lake: Lake, **more: str) -> dict[str, str]:
    return {**os.environ, "OML_PG_DSN": dsn, "OML_LAKE_URI": lake.root, **FAST_RETRY, **more}


def one_line(stderr: str) -> str:
    """The error line of a failed command, which must be its only line on stderr (retry notices
    aside) and no traceback."""
    lines = [line for line in stderr.splitlines() if "retrying in" not in line]
    assert "Traceback" not in stderr, stderr
    assert len(lines) == 1, stderr
    assert lines[0].startswith("oml-lake: "), stderr
    return lines[0]


def _workload(conn, tenants: int = 2, claims: int = 14):
    made = [producer.create_tenant(conn) for _ in range(tenants)]
    for keys in made:
        mixed_workload(conn, keys, claims=claims)
    return made


def _terminate_others(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchone()[0]


def test_killed_sessions_mid_drain_are_reopened_and_the_drain_finishes(conn, lake, dsn):
    """Every session of the drain's database is terminated (`pg_terminate_backend`, as an
    operator or a failover does) again and again while `oml-lake drain --until-idle` runs: it
    reconnects each time, exits 0, and the lake is exact."""
    tenants = _workload(conn, tenants=3, claims=30)
    conn.close()  # the test's own session is not the writer's
    proc = subprocess.Popen(
        DRAIN, env=_env(dsn, lake), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    killed, kills = [], 0
    stop = threading.Event()

    def killer():
        nonlocal kills
        time.sleep(0.8)
        for _ in range(6):  # bounded: six rounds, 0.4 s apart
            if stop.is_set() or proc.poll() is not None:
                return
            n = _terminate_others(dsn)
            killed.append(n)
            kills += n > 0
            time.sleep(0.4)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    out, err = proc.communicate(timeout=240)
    stop.set()
    thread.join(10)
    assert proc.returncode == 0, err
    assert kills >= 2, f"the drain's sessions were really killed mid-drain: {killed}"
    assert "PostgreSQL connection lost" in err and "retrying in" in err
    with psycopg.connect(dsn, autocommit=True) as check:
        assert_exactly_once(check, lake, tenants)
        # The closing lag is read from the lake and PostgreSQL: nothing waits.
        for keys in tenants:
            assert f"lag tenant {keys.tenant_id}: 0 ops" in out, out


def test_an_unknown_database_is_refused_at_once(lake, dsn):
    unknown = psycopg.conninfo.make_conninfo(dsn, dbname="oml_no_such_database")
    done = subprocess.run(
        DRAIN, env=_env(unknown, lake), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 3, done.stderr
    assert "no such database" in one_line(done.stderr)
    assert "retrying in" not in done.stderr


def test_a_schema_not_upgraded_says_how_to_upgrade(lake, dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP SCHEMA oml CASCADE")
    done = subprocess.run(DRAIN, env=_env(dsn, lake), capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, done.stderr
    assert "oml-lake db upgrade" in one_line(done.stderr)


def test_debug_prints_the_traceback_above_the_line(lake, dsn):
    unknown = psycopg.conninfo.make_conninfo(dsn, dbname="oml_no_such_database")
    done = subprocess.run(
        [sys.executable, "-m", "oml_dagster.cli", "--debug", "drain"],
        env=_env(unknown, lake),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 3
    assert "Traceback" in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("oml-lake: PostgreSQL has no such")


@pytest.mark.s3
def test_conditional_put_turned_off_in_the_environment_is_refused_before_any_write(
    moto_endpoint, dsn, conn, tenant
):
    """object_store reads AWS_CONDITIONAL_PUT from the environment itself: the refusal sees it
    too, and refuses before the first object is written."""
    bucket = new_bucket(moto_endpoint, "oml-noput")
    s3 = s3_client(moto_endpoint)
    mixed_workload(conn, tenant, claims=4)
    env = {**os.environ, **lake_env(moto_endpoint, bucket), "OML_PG_DSN": dsn}
    env["AWS_CONDITIONAL_PUT"] = "disabled"
    done = subprocess.run(DRAIN, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr
    line = one_line(done.stderr)
    assert "AWS_CONDITIONAL_PUT=disabled" in line and "environment" in line
    assert s3.list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 0


# --- inside Dagster runs ------------------------------------------------------------------------


def _run_logs(instance, run_id: str) -> list[str]:
    return [e.user_message for e in instance.all_logs(run_id) if e.user_message]


def test_a_run_rides_through_killed_sessions(conn, lake, dsn, defs, instance, monkeypatch):
    """A lake-writer run whose PostgreSQL sessions are killed mid-run reconnects inside the run
    (a warning per retry in its log), succeeds, and leaves the lake exact."""
    from oml_dagster.defs.partitions import TENANT_PARTITIONS_NAME

    monkeypatch.setenv("OML_MAX_BATCH", "10")
    for key, value in FAST_RETRY.items():
        monkeypatch.setenv(key, value)
    (keys,) = _workload(conn, tenants=1, claims=40)
    conn.close()
    instance.add_dynamic_partitions(TENANT_PARTITIONS_NAME, [keys.tenant_id])
    kills: list[int] = []
    done = threading.Event()

    def killer():
        # Kill from the run's first session on, whenever it comes (a loaded machine starts the
        # run late): bounded in attempts (30 s) and in kills made (3).
        time.sleep(1.0)
        for _ in range(120):
            if done.is_set() or sum(1 for k in kills if k) >= 3:
                return
            kills.append(_terminate_others(dsn))
            time.sleep(0.5 if kills[-1] else 0.25)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    try:
        result = defs.resolve_job_def("lake_writer_job").execute_in_process(
            partition_key=keys.tenant_id, instance=instance
        )
    finally:
        done.set()
        thread.join(10)
    assert result.success
    assert sum(1 for k in kills if k) >= 1, kills
    logs = _run_logs(instance, result.run_id)
    assert any("PostgreSQL connection lost" in m and "retrying in" in m for m in logs), logs
    with psycopg.connect(dsn, autocommit=True) as check:
        assert_exactly_once(check, lake, [keys])


@pytest.mark.s3
def test_a_run_rides_through_a_failing_store(moto_endpoint, conn, dsn, defs, instance, monkeypatch):
    """A lake-writer run whose object store fails requests (object_store's own retries off, so
    every fault reaches the writer) retries inside the run (a warning per retry in its log),
    succeeds, and leaves the lake exact."""
    from oml_dagster.defs.partitions import TENANT_PARTITIONS_NAME

    (keys,) = _workload(conn, tenants=1, claims=12)
    bucket = new_bucket(moto_endpoint, "oml-run-faults")
    # Every kind of fault once, early and late in the run: table creation, commits, reads.
    schedule = dict(zip((5, 30, 60, 95, 130, 170), KINDS, strict=True))
    instance.add_dynamic_partitions(TENANT_PARTITIONS_NAME, [keys.tenant_id])
    with FaultProxy(moto_endpoint, schedule=schedule, delay_seconds=0.3) as proxy:
        for key, value in {**lake_env(proxy.endpoint, bucket), **FAST_RETRY}.items():
            monkeypatch.setenv(key, value)
        monkeypatch.setenv("OML_LAKE_STORAGE_OPTIONS", '{"max_retries": "0"}')
        monkeypatch.setenv("OML_MAX_BATCH", "10")
        result = defs.resolve_job_def("lake_writer_job").execute_in_process(
            partition_key=keys.tenant_id, instance=instance
        )
        injected = sum(proxy.injected.values())
    assert result.success
    assert injected >= 3, proxy.injected
    logs = _run_logs(instance, result.run_id)
    assert any("object store or network fault" in m and "retrying in" in m for m in logs), logs
    direct = Lake(f"s3://{bucket}/oml-lake", store_options(moto_endpoint))
    assert_exactly_once(conn, direct, [keys])


@pytest.mark.s3
def test_a_run_on_a_missing_bucket_fails_with_the_one_line(
    moto_endpoint, dsn, conn, tenant, defs, instance, monkeypatch
):
    """A permanent fault fails the run at once, and the run's failure reads the line `oml-lake`
    prints: the cause, the object and the remedy."""
    from oml_dagster.defs.partitions import TENANT_PARTITIONS_NAME

    for key, value in lake_env(moto_endpoint, "oml-never-created").items():
        monkeypatch.setenv(key, value)
    mixed_workload(conn, tenant, claims=4)
    instance.add_dynamic_partitions(TENANT_PARTITIONS_NAME, [tenant.tenant_id])
    started = time.monotonic()
    result = defs.resolve_job_def("lake_writer_job").execute_in_process(
        partition_key=tenant.tenant_id, instance=instance, raise_on_error=False
    )
    assert not result.success
    assert time.monotonic() - started < 30  # not retried: nothing transient about it
    (failure,) = result.get_step_failure_events()
    data = failure.step_failure_data
    assert data.user_failure_data is not None
    description = data.user_failure_data.description
    assert description.startswith("missing bucket") and "create the bucket" in description
    assert "\n" not in description


# --- a full disk ----------------------------------------------------------------------------------


@contextlib.contextmanager
def tmpfs(size_mib: int) -> Iterator[Path]:
    """A tmpfs of `size_mib` mounted on a fresh directory (the tests run as root)."""
    where = Path(tempfile.mkdtemp(prefix="oml-full-"))
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mib}M", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        where.rmdir()
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)
        shutil.rmtree(where, ignore_errors=True)


def grow(volume: Path, size_mib: int) -> None:
    """Free space the way an operator does: the volume grown."""
    subprocess.run(
        ["mount", "-o", f"remount,size={size_mib}M", str(volume)], check=True, timeout=30
    )


def test_a_full_disk_stops_with_one_line_and_the_next_drain_finishes_exact(conn, dsn, tmp_path):
    """A lake on a tmpfs too small for it: the drain exits 3 with one line (no traceback, no
    native panic report), and once space is freed (the tmpfs grown) the next drain finishes
    with the lake exact."""
    tenants = _workload(conn, tenants=2, claims=120)
    with tmpfs(2) as volume:
        lake = Lake(str(volume / "oml-lake"))
        full = subprocess.run(
            DRAIN, env=_env(dsn, lake), capture_output=True, text=True, timeout=240
        )
        assert full.returncode == 3, full.stderr
        line = one_line(full.stderr)
        assert line.startswith("oml-lake: disk full") and "free space" in line, line
        assert "panicked" not in full.stderr
        grow(volume, 256)
        done = subprocess.run(
            DRAIN, env=_env(dsn, lake), capture_output=True, text=True, timeout=240
        )
        assert done.returncode == 0, done.stderr
        assert_exactly_once(conn, lake, tenants)


# --- a failing object store -------------------------------------------------------------------


def _store_lake(endpoint: str, bucket: str, prefix: str = "oml-lake") -> Lake:
    return Lake(f"s3://{bucket}/{prefix}", store_options(endpoint)).with_store_defaults()


@pytest.mark.s3
def test_the_proxy_injects_each_fault_it_is_asked_for(moto_endpoint):
    """The proxy itself: each kind, forced, fails a botocore client that does not retry; a
    request reset after it took effect did take effect."""
    from botocore.exceptions import ClientError, ConnectionClosedError, EndpointConnectionError

    bucket = new_bucket(moto_endpoint, "oml-faults")
    seen = {}
    for kind in KINDS:
        with FaultProxy(moto_endpoint, rate=1.0, kinds=(kind,), delay_seconds=0.3) as proxy:
            s3 = s3_client(
                proxy.endpoint, retries={"max_attempts": 1}, s3={"addressing_style": "path"}
            )
            started = time.monotonic()
            try:
                s3.put_object(Bucket=bucket, Key=kind, Body=b"x" * 64)
                if kind == "truncate":
                    proxy.enabled = False
                    s3.put_object(Bucket=bucket, Key="whole", Body=b"y" * 64)
                    proxy.enabled = True
                    s3.get_object(Bucket=bucket, Key="whole")["Body"].read()
                seen[kind] = "passed"
            except ClientError as error:
                seen[kind] = error.response["Error"]["Code"]
            except (ConnectionClosedError, EndpointConnectionError, Exception) as error:
                seen[kind] = type(error).__name__
            took = time.monotonic() - started
            assert proxy.injected[kind] >= 1
        if kind == "delay":
            assert took >= 0.3 and seen[kind] == "passed"
    assert seen["slow_down"] == "SlowDown" and seen["internal_error"] == "InternalError"
    assert seen["reset_before"] != "passed" and seen["reset_after"] != "passed"
    assert seen["truncate"] != "passed", seen
    direct = s3_client(moto_endpoint)
    keys = {o["Key"] for o in direct.list_objects_v2(Bucket=bucket).get("Contents", [])}
    assert "reset_after" in keys and "reset_before" not in keys


@pytest.mark.s3
@pytest.mark.parametrize("rate", [0.1, 0.2])
def test_a_drain_command_rides_through_a_failing_store(moto_endpoint, conn, dsn, rate):
    """10 % and 20 % of requests failing in every way the proxy knows (delays of 0.5 s): the
    drain finishes on its own, exit 0, and the lake equals a fault-free drain's."""
    tenants = _workload(conn, tenants=2, claims=10)
    bucket = new_bucket(moto_endpoint, "oml-faults")
    with FaultProxy(moto_endpoint, rate=rate, seed=int(rate * 100), delay_seconds=0.5) as proxy:
        env = {**_env(dsn, Lake("unused")), **lake_env(proxy.endpoint, bucket)}
        # The default bound (300 s); batches of 50 ops, fewer requests than 10-op batches.
        env["OML_RETRY_SECONDS"] = "300"
        drain = [*DRAIN[:-1], "50"]
        done = subprocess.run(drain, env=env, capture_output=True, text=True, timeout=420)
        assert done.returncode == 0, done.stderr[-3000:]
        assert sum(proxy.injected.values()) >= 5, proxy.injected
    assert_exactly_once(conn, _store_lake(moto_endpoint, bucket), tenants)


# --- a restarted server -----------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["immediate", "fast"])
def test_a_restarted_server_mid_drain_is_ridden_through(cluster, tmp_path, mode):
    """`pg_ctl restart -m immediate` (a crash and recovery) or `-m fast` twice in the middle of
    `oml-lake drain --until-idle`: the drain reconnects, exits 0, and the lake is exact."""
    dsn = cluster.create_database(f"oml_restart_{mode}_{uuid.uuid4().hex[:6]}")
    with psycopg.connect(dsn, autocommit=True) as conn:
        db.upgrade(conn)
        producer.ensure_schema(conn)
        tenants = _workload(conn, tenants=3, claims=30)
    lake = Lake(str(tmp_path / "oml-lake"))
    proc = subprocess.Popen(
        DRAIN, env=_env(dsn, lake), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    # Mid-drain: after its first batch landed. A restart before its first connection is a first
    # contact, waited for without a retry line (ADR 0070); a slow start on a loaded machine
    # would otherwise put both restarts there.
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if " batch (" in line:
            break
    restarts = 0
    for pause in (0.0, 0.8):
        time.sleep(pause)
        if proc.poll() is not None:
            break
        cluster.restart(mode)
        restarts += 1
    out, err = proc.communicate(timeout=240)
    out = "".join(lines) + out
    assert proc.returncode == 0, err
    assert restarts >= 1 and "PostgreSQL connection lost" in err, err
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert_exactly_once(conn, lake, tenants)
