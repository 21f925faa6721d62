"""`oml-lake doctor`: a drained, clean tenant needs no operator; each condition that does — drain
lag past its limit, an open dead letter (an erase among them), a table past its checkpoint
interval, a failed check, an erasure deadline at risk — is on the tenant's screen and makes the
command exit non-zero."""

from __future__ import annotations

import datetime as dt
import json
import time

from oml_dagster import cli
from oml_dagster.lake.audit.doctor import examine
from oml_dagster.lake.ingest import sequencer
from oml_dagster.lake.model.tables import SILVER_CLAIMS
from oml_dagster.simulate import acts, producer

from .helpers import claim, drain_all, make_tree

HOUR = dt.timedelta(hours=1)


def test_a_clean_drained_tenant_needs_no_operator(conn, lake, capsys):
    keys = producer.create_tenant(conn)
    tree = make_tree(conn, keys)
    acts.promote(conn, keys, claim(tree.a), b"fine")
    drain_all(conn, lake)
    health = examine(conn, lake, keys.tenant_id)
    assert health.healthy, health.problems
    assert (health.lag_ops, health.dead_letters) == (0, 0)
    assert cli.main(["doctor", "--tenant", keys.tenant_id]) == 0
    assert f"tenant {keys.tenant_id}: ok; lag 0 ops" in capsys.readouterr().out


def test_each_condition_that_needs_an_operator_is_on_the_screen(conn, lake, capsys):
    keys = producer.create_tenant(conn, erasure_bound=dt.timedelta(seconds=2))
    tree = make_tree(conn, keys)
    kept, erased = claim(tree.a), claim(tree.a)
    for c in (kept, erased):
        acts.promote(conn, keys, c, b"body of " + c.artifact_id.encode())
        drain_all(conn, lake)
    acts.erase(conn, keys, erased)
    acts.erase(conn, keys, claim(tree.a))  # never promoted: dead-lettered
    drain_all(conn, lake)
    conn.execute(
        "UPDATE oml.lake_frontier SET txn_version = 1 WHERE tenant_id = %s AND table_name = %s",
        (keys.tenant_id, SILVER_CLAIMS.name),
    )
    acts.demote(conn, keys, kept)  # written, not drained: lag
    conn.execute("UPDATE oml.outbox SET created_at = now() - interval '1 hour' WHERE seq IS NULL")

    health = examine(conn, lake, keys.tenant_id, cadence=HOUR, checkpoint_interval=3)
    assert not health.healthy
    assert health.lag_ops == 0, "not yet sequenced: the doctor counts sequenced ops only"
    assert conn.execute("SELECT count(*) FROM oml.outbox WHERE seq IS NULL").fetchone()[0] == 2

    sequencer.sequence(conn)
    # Past the bound: the erased body's superseded copies wait only for the next VACUUM.
    past_bound = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=3)
    health = examine(
        conn, lake, keys.tenant_id, cadence=HOUR, checkpoint_interval=3, now=past_bound
    )
    problems = "\n".join(health.problems)
    assert health.lag_ops == 2 and health.lag_seconds >= 3500
    assert "drain lag 2 ops" in problems
    assert (health.dead_letters, health.dead_lettered_erases) == (1, 1)
    assert "1 open dead letters (1 erases)" in problems
    assert any(t == SILVER_CLAIMS.name for t, _ in health.checkpoint_overdue)
    assert f"check {SILVER_CLAIMS.name}/frontier_matches_delta_log failed" in problems
    at_risk = {(a.artifact_id, a.status) for a in health.erasures_at_risk}
    # The applied erase keeps superseded copies within one cadence of its deadline; the
    # dead-lettered one is a breach in progress.
    assert examine(conn, lake, keys.tenant_id, cadence=HOUR).erasures_at_risk[0].status == (
        "dead-lettered"
    ), "inside the bound the applied erase is not at risk yet"
    assert (erased.artifact_id, "applied") in at_risk
    assert any(status == "dead-lettered" for _, status in at_risk)

    time.sleep(max(0.0, (past_bound - dt.datetime.now(dt.UTC)).total_seconds()))
    assert cli.main(["doctor", "--tenant", keys.tenant_id, "--cadence-hours", "1", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["healthy"] is False and report["dead_letters"] == 1
    assert {a["status"] for a in report["erasures_at_risk"]} == {"applied", "dead-lettered"}
    assert cli.main(["doctor", "--tenant", keys.tenant_id]) == 1
    assert "NEEDS AN OPERATOR" in capsys.readouterr().out
