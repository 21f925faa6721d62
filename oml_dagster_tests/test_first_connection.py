"""A server never reached is not a lost one (ADR 0070): every command, and a Dagster run, whose
first connection to PostgreSQL fails says `cannot reach PostgreSQL at HOST:PORT (reason)` in one
line and gives up within OML_PG_CONNECT_SECONDS (exit 4), while a connection that was
established and then lost is still ridden through (ADR 0045). Real ports where nothing listens,
and a throwaway cluster stopped and started under a command."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid

import psycopg
import pytest

from oml_dagster.lake import db
from oml_dagster.lake.errors import PostgresUnreachable
from oml_dagster.lake.faults import EXIT_TRANSIENT, Connector, describe
from oml_dagster.simulate import producer
from oml_dagster_tests.helpers import assert_exactly_once
from oml_dagster_tests.test_faults import FAST_RETRY, _workload, one_line
from oml_testbed.s3_server import _free_loopback_port

CLI = [sys.executable, "-m", "oml_dagster.cli"]
# Every command that talks to PostgreSQL, with the arguments it needs to get that far.
COMMANDS = [
    ["db", "upgrade"],
    ["sequence"],
    ["drain", "--until-idle"],
    ["reconcile"],
    ["doctor"],
    ["erasure-evidence"],
    ["deadletter", "list"],
    ["maintain", "compact"],
    ["sql", "--tenant", str(uuid.uuid4()), "SELECT 1"],
    ["areas-at", "--tenant", str(uuid.uuid4())],
    ["simulate", "--tenants", "1", "--claims", "1", "--no-progress"],
]
# How much longer than its bound a command may take: Python's start and the imports (about
# 2-4 s on this shared machine) and the last try's own timeout.
SLACK_S = 20


def _nowhere() -> str:
    return f"postgresql://postgres@127.0.0.1:{_free_loopback_port()}/oml"


def _run(args: list[str], env: dict[str, str], timeout: float = 120) -> tuple:
    started = time.monotonic()
    done = subprocess.run(
        [*CLI, *args], env={**os.environ, **env}, capture_output=True, text=True, timeout=timeout
    )
    return done, time.monotonic() - started


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_every_command_that_never_reaches_postgres_says_so_in_one_line(args, tmp_path):
    nowhere = _nowhere()
    port = nowhere.rsplit(":", 1)[1].split("/")[0]
    env = {
        "OML_PG_DSN": nowhere,
        "OML_LAKE_URI": str(tmp_path / "oml-lake"),
        "OML_PG_CONNECT_SECONDS": "1",
        **FAST_RETRY,
    }
    done, seconds = _run(args, env)
    assert done.returncode == EXIT_TRANSIENT, done.stderr
    line = one_line(done.stderr)
    assert line.startswith(
        f"oml-lake: cannot reach PostgreSQL at 127.0.0.1:{port} (connection refused)"
    ), line
    assert "OML_PG_DSN" in line and "OML_PG_CONNECT_SECONDS" in line
    assert "retrying in" not in done.stderr  # nothing was lost, so nothing is ridden through
    assert seconds < 1 + SLACK_S


def test_the_default_bound_is_tried_for_then_given_up(tmp_path):
    """Without the setting, the first contact is tried for 5 s (the README's bound), not the
    retry bound's 300."""
    env = {"OML_PG_DSN": _nowhere(), "OML_LAKE_URI": str(tmp_path / "oml-lake"), **FAST_RETRY}
    env.pop("OML_PG_CONNECT_SECONDS", None)
    done, seconds = _run(["drain"], {**env, "OML_RETRY_SECONDS": "300"})
    assert done.returncode == EXIT_TRANSIENT
    assert "(connection refused)" in one_line(done.stderr)
    assert "tried for 5 s" in done.stderr
    assert 5 <= seconds < 5 + SLACK_S


def test_a_refused_login_is_not_an_unreachable_server(dsn):
    """A server that answers and refuses stays what it was: permanent, at once."""
    unknown = psycopg.conninfo.make_conninfo(dsn, dbname="oml_no_such_database_here")
    with pytest.raises(psycopg.OperationalError) as raised:
        Connector(unknown, first_contact_seconds=30).connect()
    line, code = describe(raised.value)
    assert code == 3 and "no such database" in line


def test_a_host_that_drops_packets_is_given_up_within_the_bound():
    """A try against a listener that never answers is bounded by what is left of the bound,
    not the kernel's TCP timeout."""
    import socket

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(0)  # accepts into the backlog, never answers the startup packet
        port = silent.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(PostgresUnreachable) as raised:
            Connector(
                f"postgresql://postgres@127.0.0.1:{port}/x", first_contact_seconds=2
            ).connect()
    assert time.monotonic() - started < 2 + 5
    assert raised.value.address == f"127.0.0.1:{port}"
    assert "timeout" in raised.value.reason


def test_a_dagster_run_that_never_reaches_postgres_fails_with_the_line(
    lake, defs, instance, monkeypatch
):
    """The Dagster resources take the same first contact: the run fails within the bound, its
    failure the one line."""
    from dagster import DagsterEventType

    from oml_dagster.defs.partitions import TENANT_PARTITIONS_NAME

    nowhere = _nowhere()
    monkeypatch.setenv("OML_PG_DSN", nowhere)
    monkeypatch.setenv("OML_PG_CONNECT_SECONDS", "1")
    tenant_id = str(uuid.uuid4())
    instance.add_dynamic_partitions(TENANT_PARTITIONS_NAME, [tenant_id])
    started = time.monotonic()
    result = defs.resolve_job_def("lake_writer_job").execute_in_process(
        partition_key=tenant_id, instance=instance, raise_on_error=False
    )
    assert not result.success
    assert time.monotonic() - started < 1 + SLACK_S
    failures = [
        e.event_specific_data.error.message
        for e in result.all_events
        if e.event_type == DagsterEventType.STEP_FAILURE
    ]
    assert failures and any("cannot reach PostgreSQL at 127.0.0.1:" in f for f in failures), (
        failures
    )


# --- a throwaway cluster: a server that comes, and one that goes -------------------------------


def _database(cluster) -> str:
    dsn = cluster.create_database(f"oml_first_{uuid.uuid4().hex[:8]}")
    with psycopg.connect(dsn, autocommit=True) as conn:
        db.upgrade(conn)
        producer.ensure_schema(conn)
    return dsn


def test_a_server_that_comes_up_within_the_bound_is_waited_for(cluster, tmp_path):
    """A drain started while its server is down, which comes up inside OML_PG_CONNECT_SECONDS,
    connects and drains: the bound is a wait, not a single try."""
    dsn = _database(cluster)
    with psycopg.connect(dsn, autocommit=True) as conn:
        tenants = _workload(conn, tenants=1, claims=6)
    cluster.stop("fast")
    try:
        proc = subprocess.Popen(
            [*CLI, "drain", "--until-idle"],
            env={
                **os.environ,
                "OML_PG_DSN": dsn,
                "OML_LAKE_URI": str(tmp_path / "oml-lake"),
                "OML_PG_CONNECT_SECONDS": "40",
            },
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(3)
        assert proc.poll() is None, proc.communicate()
    finally:
        cluster.start()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    from oml_dagster.lake.store.layout import Lake

    with psycopg.connect(dsn, autocommit=True) as conn:
        assert_exactly_once(conn, Lake(str(tmp_path / "oml-lake")), tenants)


def test_a_lost_server_is_ridden_through_not_called_unreachable(cluster):
    """Once a connection succeeded, a failed one is psycopg's own (transient) error at once,
    which `retrying` rides through: not PostgresUnreachable."""
    dsn = _database(cluster)
    connector = Connector(dsn, first_contact_seconds=30)
    connector.connect().close()
    cluster.stop("fast")
    try:
        started = time.monotonic()
        with pytest.raises(psycopg.OperationalError) as raised:
            connector.connect()
        assert not isinstance(raised.value, PostgresUnreachable)
        assert time.monotonic() - started < 5  # no first-contact wait
        line, code = describe(raised.value)
        assert "PostgreSQL connection lost" in line and code == EXIT_TRANSIENT
    finally:
        cluster.start()


def test_a_drain_that_loses_its_server_for_good_gives_up_past_the_retry_bound(cluster, tmp_path):
    """A drain that connected, then lost its server for longer than OML_RETRY_SECONDS, rides
    through (retry lines) and then stops with the lost-connection line and the bound, exit 4."""
    dsn = _database(cluster)
    with psycopg.connect(dsn, autocommit=True) as conn:
        _workload(conn, tenants=2, claims=30)
    env = {
        **os.environ,
        "OML_PG_DSN": dsn,
        "OML_LAKE_URI": str(tmp_path / "oml-lake"),
        "OML_RETRY_SECONDS": "4",
        "OML_RETRY_ATTEMPTS": "40",
        "OML_PG_CONNECT_SECONDS": "30",
    }
    proc = subprocess.Popen(
        [*CLI, "drain", "--until-idle", "--max-batch", "5"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    stopped = threading.Event()

    def stop_when_draining():
        assert proc.stdout is not None
        for line in proc.stdout:  # the first batch landed: the drain is connected
            if " batch (" in line:
                cluster.stop("immediate")
                stopped.set()
                break
        proc.stdout.read()

    reader = threading.Thread(target=stop_when_draining, daemon=True)
    reader.start()
    try:
        err = proc.communicate(timeout=120)[1]
    finally:
        reader.join(10)
        cluster.start()
    assert stopped.is_set(), err
    assert proc.returncode == EXIT_TRANSIENT, err
    line = one_line(err)
    assert "PostgreSQL connection lost" in line and "OML_RETRY_SECONDS" in line, line
    assert "cannot reach" not in err
    assert "retrying in" in err
