"""`oml-lake` end to end: db upgrade, sequence, drain --until-idle, deadletter list/requeue."""

from __future__ import annotations

import os
import subprocess
import sys

import psycopg
import pytest

from oml_dagster.lake.errors import UnsupportedObjectStore
from oml_dagster.lake.store.layout import Lake
from oml_dagster.simulate import acts
from oml_dagster.simulate.producer import Act, Event, commit_acts
from oml_dagster_tests.conftest import ADMIN_DSN, _dsn_for
from oml_dagster_tests.helpers import LakeView, make_tree, new_id, promoted


def oml_lake(*args: str, env: dict, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, "-m", "oml_dagster.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if check:
        assert done.returncode == 0, done.stderr
    return done


@pytest.fixture
def empty_db():
    name = f"oml_cli_{new_id()[:8]}"
    with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    yield _dsn_for(name)
    with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_db_upgrade_is_idempotent(empty_db, tmp_path):
    env = {**os.environ, "OML_PG_DSN": empty_db}
    first = oml_lake("db", "upgrade", env=env)
    assert "applied 0001_oml_schema" in first.stdout
    assert "up to date" in oml_lake("db", "upgrade", env=env).stdout
    with psycopg.connect(empty_db) as conn:
        tables = {
            r[0]
            for r in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = 'oml'"
            )
        }
    assert {
        "outbox",
        "claim_bodies",
        "api_keys",
        "tenant_policy",
        "lake_frontier",
        "lake_dead_letter",
    } <= tables


def test_upgrade_then_drain_until_idle_fills_the_lake(conn, dsn, lake, tenant):
    env = {**os.environ, "OML_PG_DSN": dsn, "OML_LAKE_URI": lake.root}
    tree = make_tree(conn, tenant)
    c = promoted(conn, tenant, tree.a)
    acts.demote(conn, tenant, c)
    commit_acts(conn, tenant, [Act(Event("test.bad", {}), [("claim.teleport", {})])])
    seq = oml_lake("sequence", env=env)
    assert f"sequenced tenant {tenant.tenant_id}: 14 rows, seq 1..14" in seq.stdout

    out = oml_lake("drain", "--until-idle", "--max-batch", "4", env=env).stdout
    assert "silver.claims: committed" in out and "bronze.events: committed" in out
    assert "dead-lettered seq" in out and "unknown op 'claim.teleport'" in out
    assert f"lag tenant {tenant.tenant_id}: 0 ops" in out
    assert LakeView(lake, tenant.tenant_id).claim(c)["state"] == "demoted"

    listed = oml_lake("deadletter", "list", env=env).stdout
    assert "claim.teleport: unknown op" in listed
    bad_seq = int(listed.split()[1])
    requeued = oml_lake("deadletter", "requeue", str(bad_seq), "--by", "ops:test", env=env)
    assert f"re-enqueued dead letter {bad_seq}" in requeued.stdout
    again = oml_lake("deadletter", "requeue", str(bad_seq), env=env, check=False)
    assert again.returncode == 2 and "already re-enqueued" in again.stderr
    assert "no dead letters" in oml_lake("deadletter", "list", env=env).stdout
    assert "ops:test" in oml_lake("deadletter", "list", "--all", env=env).stdout


def test_drain_reports_rows_waiting_behind_a_gap_and_still_exits(conn, dsn, lake, tenant):
    env = {**os.environ, "OML_PG_DSN": dsn, "OML_LAKE_URI": lake.root}
    make_tree(conn, tenant)
    conn.execute(
        "INSERT INTO oml.outbox (tenant_id, journal_seq, op, payload) VALUES (%s, 99, 'x', '{}')",
        (tenant.tenant_id,),
    )
    out = oml_lake("drain", "--until-idle", env=env).stdout
    assert f"gap tenant {tenant.tenant_id}: 1 rows wait for journal_seq 5" in out


def test_an_object_store_without_conditional_put_is_refused(dsn, monkeypatch):
    with pytest.raises(UnsupportedObjectStore, match="conditional put"):
        Lake("s3://bucket/oml-lake", {"aws_conditional_put": "disabled"}).checked()
    with pytest.raises(UnsupportedObjectStore, match="scheme 'gs'"):
        Lake("gs://bucket/oml-lake").checked()
    env = {
        **os.environ,
        "OML_PG_DSN": dsn,
        "OML_LAKE_URI": "s3://b/oml-lake",
        "OML_LAKE_STORAGE_OPTIONS": '{"AWS_S3_ALLOW_UNSAFE_RENAME": "true"}',
    }
    done = oml_lake("drain", env=env, check=False)
    assert done.returncode == 3 and "UnsupportedObjectStore" in done.stderr
    assert done.stderr.strip().count("\n") == 0, done.stderr  # one line, no traceback


# `oml-lake` as the console script runs it, with a hook on the interpreter's teardown.
_ENTRY = """
import atexit, sys
atexit.register(lambda: print("teardown ran"))
from oml_dagster import cli
sys.argv = ["oml-lake", *sys.argv[1:]]
cli.entry()
"""


def _entry(
    *args: str, env: dict | None = None, script: str = _ENTRY
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", script, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_command_leaves_without_the_interpreter_s_teardown_and_keeps_its_output():
    """ADR 0042: a finished command exits straight after flushing its output, so native thread
    pools still winding down cannot abort it (SIGABRT, exit -6) at finalization."""
    done = _entry("--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: oml-lake")
    assert "simulate" in done.stdout  # the whole help text, flushed
    assert "teardown ran" not in done.stdout


def test_the_command_s_exit_codes_survive_the_direct_exit(tmp_path):
    usage = _entry("no-such-command")
    assert usage.returncode == 2
    assert "invalid choice: 'no-such-command'" in usage.stderr
    # A setting the command refuses: exit 3 (a person must fix it), naming it.
    env = {**os.environ, "OML_MAX_BATCH": "many", "OML_LAKE_URI": str(tmp_path / "oml-lake")}
    refused = _entry("drain", "--until-idle", env=env)
    assert refused.returncode == 3
    assert "OML_MAX_BATCH" in refused.stderr
    # Stopped by Ctrl-C: 130, as a shell reports it.
    interrupt = "def main():\n    raise KeyboardInterrupt\ncli.main = main\ncli.entry()"
    stopped = _entry(script=_ENTRY.replace("cli.entry()", interrupt))
    assert stopped.returncode == 130, stopped.stderr
