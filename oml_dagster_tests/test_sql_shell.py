"""`oml-lake sql`: a tenant's tables as views, read-only; writes, settings and every way out of
the tenant's prefix are refused, and another tenant's tables are never seen."""

from __future__ import annotations

import base64
import io
import json
import os
import pty
import select
import subprocess
import time

import duckdb
import pytest

from oml_dagster import cli
from oml_dagster.lake.analytics import sandbox
from oml_dagster.lake.model.tables import SILVER_CLAIMS
from oml_dagster.simulate import acts, producer

from .dagster_support import BIN, subprocess_env
from .helpers import drain_all, make_tree, new_id


@pytest.fixture
def two_tenants(conn, lake):
    """Tenant A with a validated workarea (so a curated view), tenant B with other claims."""
    a, b = producer.create_tenant(conn), producer.create_tenant(conn)
    tree_a, tree_b = make_tree(conn, a), make_tree(conn, b)
    for i in range(3):
        acts.promote(conn, a, acts.Claim(new_id(), 1, tree_a.a1, "u.a.a1"), f"a{i}".encode())
    for i in range(5):
        acts.promote(conn, b, acts.Claim(new_id(), 1, tree_b.b, "u.b"), f"b{i}".encode())
    acts.upsert_area(conn, a, tree_a.a1, status="committed")
    acts.validate_area(conn, a, tree_a.a1)
    drain_all(conn, lake)
    return a.tenant_id, b.tenant_id, tree_a


def sql(capsys, *args: str) -> tuple[int, str, str]:
    code = cli.main(["sql", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_one_shot_query_as_table_and_json(capsys, conn, two_tenants):
    a, _, tree = two_tenants
    code, out, _ = sql(capsys, "--tenant", a, "SELECT count(*) AS n FROM silver_claims")
    assert code == 0
    assert out.splitlines()[0].strip() == "n" and out.splitlines()[2].strip() == "3"

    code, out, _ = sql(
        capsys,
        "--tenant",
        a,
        "--json",
        "SELECT event_type, count(*) AS n FROM bronze_events GROUP BY 1 ORDER BY 1",
    )
    assert code == 0
    expected = dict(
        conn.execute(
            "SELECT payload->>'event_type', count(*) FROM oml.outbox"
            " WHERE tenant_id = %s AND op = 'journal.event' GROUP BY 1",
            (a,),
        ).fetchall()
    )
    assert {r["event_type"]: r["n"] for r in json.loads(out)} == expected

    view = sandbox.curated_view(tree.a1)
    assert "-" not in view
    code, out, _ = sql(capsys, "--tenant", a, "--json", f"SELECT state FROM {view}")
    assert code == 0 and [r["state"] for r in json.loads(out)] == ["promoted"] * 3


def test_bodies_come_out_as_ciphertext(capsys, conn, two_tenants):
    a, _, _ = two_tenants
    code, out, _ = sql(
        capsys, "--tenant", a, "--json", "SELECT artifact_id, body_ciphertext FROM silver_claims"
    )
    assert code == 0
    stored = {
        str(artifact): bytes(body)
        for artifact, body in conn.execute(
            "SELECT artifact_id, body_ciphertext FROM oml.claim_bodies WHERE tenant_id = %s", (a,)
        )
    }
    rows = json.loads(out)
    assert len(rows) == 3
    for row in rows:
        body = base64.b64decode(row["body_ciphertext"])
        assert body == stored[row["artifact_id"]]
        assert b"a0" not in body and b"a1" not in body and b"a2" not in body


@pytest.mark.parametrize(
    "statement",
    [
        "INSERT INTO silver_claims SELECT * FROM silver_claims",
        "DELETE FROM silver_claims",
        "UPDATE gold_areas SET status = 'validated'",
        "CREATE TABLE x AS SELECT 1",
        "DROP VIEW silver_claims",
        "COPY silver_claims TO '/tmp/oml-copy.csv'",
        "ATTACH '/tmp/oml-other.db' AS other",
        "INSTALL httpfs",
        "LOAD httpfs",
        "SET enable_external_access = true",
        "PRAGMA enable_profiling",
        "SELECT 1; DELETE FROM silver_claims",
        "SELECT * FROM read_parquet('x.parquet')",
        "SELECT * FROM read_csv('/etc/passwd')",
        "SELECT * FROM '/etc/passwd'",
        "SELECT * FROM duckdb_settings()",
    ],
)
def test_writes_settings_and_file_access_are_refused(capsys, lake, two_tenants, statement):
    a, _, _ = two_tenants
    version = lake.open(lake.table_uri(a, SILVER_CLAIMS)).version()
    code, out, err = sql(capsys, "--tenant", a, statement)
    assert code == 2, (out, err)
    assert "refused" in err
    assert lake.open(lake.table_uri(a, SILVER_CLAIMS)).version() == version


def test_another_tenants_tables_are_never_seen(capsys, lake, two_tenants):
    a, b, _ = two_tenants
    other = lake.table_uri(b, SILVER_CLAIMS)
    code, out, _ = sql(capsys, "--tenant", a, "--json", "SHOW TABLES")
    assert code == 0
    names = {r["name"] for r in json.loads(out)}
    assert {"bronze_events", "silver_claims", "gold_lineage", "gold_areas"} <= names
    for view in names:  # every row of every view is tenant A's
        code, out, _ = sql(
            capsys, "--tenant", a, "--json", f"SELECT DISTINCT tenant_id FROM {view}"
        )
        assert code == 0 and {r["tenant_id"] for r in json.loads(out)} <= {a}
    for query in (f"SELECT * FROM delta_scan('{other}')", f"SELECT * FROM '{other}/*.parquet'"):
        code, _, err = sql(capsys, "--tenant", a, query)
        assert code == 2 and "refused" in err

    # Behind the query guard, the connection itself cannot leave the tenant's prefix.
    with sandbox.tenant_connection(lake, a, lockdown=True) as tc:
        with pytest.raises(duckdb.PermissionException):
            tc.con.execute(f"SELECT count(*) FROM delta_scan('{other}')").fetchall()
        with pytest.raises(duckdb.Error):
            tc.con.execute("SET enable_external_access = true")
        with pytest.raises(duckdb.Error):
            tc.con.execute("SET allowed_directories = ['/']")
        assert tc.con.execute("SELECT count(*) FROM silver_claims").fetchone()[0] == 3


def test_queries_from_stdin_and_errors(capsys, monkeypatch, two_tenants):
    a, _, _ = two_tenants
    monkeypatch.setattr(
        "sys.stdin", io.StringIO("SELECT 1 AS one;\nSELECT count(*) AS n FROM gold_areas;")
    )
    code, out, _ = sql(capsys, "--tenant", a)
    assert code == 0 and out.splitlines()[2].strip() == "4"  # the last statement's rows

    code, _, err = sql(capsys, "--tenant", a, "SELECT no_such_column FROM silver_claims")
    assert code == 1 and "no_such_column" in err

    unknown = new_id()
    code, _, err = sql(capsys, "--tenant", unknown, "SELECT 1")
    assert code == 2 and f"tenant {unknown} is not known to PostgreSQL" in err

    with pytest.raises(SystemExit) as exit_:
        cli.main(["sql", "--tenant", "../" + a, "SELECT 1"])
    assert exit_.value.code == 2
    assert "is not a UUID" in capsys.readouterr().err


def test_interactive_shell_on_a_terminal(lake, two_tenants):
    """On a terminal the shell prompts, runs each ';'-terminated query, keeps going after a
    refusal, and ends on end-of-input."""
    a, _, _ = two_tenants
    main, child = pty.openpty()
    proc = subprocess.Popen(
        [str(BIN / "oml-lake"), "sql", "--tenant", a],
        stdin=child,
        stdout=child,
        stderr=child,
        env=subprocess_env(OML_LAKE_URI=lake.root),
        close_fds=True,
    )
    os.close(child)
    try:
        os.write(main, b"SELECT count(*) AS n\n  FROM silver_claims;\n")
        os.write(main, b"DELETE FROM silver_claims;\n")
        os.write(main, b"SELECT 'still here' AS s;\n")
        os.write(main, b"\x04")  # end of input
        output = b""
        deadline = time.monotonic() + 60
        while proc.poll() is None or _readable(main):
            if time.monotonic() > deadline:
                raise AssertionError(f"shell did not finish: {output.decode(errors='replace')}")
            if _readable(main):
                try:
                    output += os.read(main, 65536)
                except OSError:
                    break
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        os.close(main)
    text = output.decode(errors="replace")
    assert "oml-lake>" in text and "silver_claims" in text
    assert "refused: DELETE statements are refused" in text
    assert "still here" in text
    assert proc.returncode == 2  # the worst outcome of the session: a refusal


def _readable(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0.1)[0])
