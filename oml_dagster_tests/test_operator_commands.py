"""The operator's commands never say "ok" wrongly, and tell one story: an unknown tenant is
refused by every command (exit 2, nothing written); a lost lake is a finding everywhere; `doctor`,
`reconcile` and `erasure-evidence` agree on the same lakes (clean, with a dead letter, with a
dead-lettered erase, with a breach, with a lost table) because they read one verdict; a dead
letter can be resolved for good; an interrupted drain says what it committed."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oml_dagster import cli
from oml_dagster.lake.audit.doctor import span
from oml_dagster.lake.model.tables import SILVER_CLAIMS
from oml_dagster.lake.write import deadletter
from oml_dagster.simulate import acts, producer
from oml_dagster.simulate.producer import Act, Event, commit_acts

from .helpers import claim, drain_all, make_tree, new_id

PER_TENANT = [
    ["areas-at"],
    ["reconcile"],
    ["doctor"],
    ["erasure-evidence"],
    ["drain"],
    ["deadletter", "list"],
    ["maintain", "all"],
    ["sql", "SELECT 1"],
]


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def frontier_and_cut(conn) -> tuple:
    return (
        conn.execute("SELECT count(*) FROM oml.lake_frontier").fetchone()[0],
        conn.execute("SELECT count(*) FROM oml.sequencer_tenant").fetchone()[0],
        conn.execute("SELECT count(*) FROM oml.outbox WHERE seq IS NOT NULL").fetchone()[0],
    )


# --- which tenant --------------------------------------------------------------------------------


@pytest.mark.parametrize("command", PER_TENANT, ids=lambda c: " ".join(c[:2]))
def test_every_command_refuses_an_unknown_tenant_and_writes_nothing(
    command, conn, lake, capsys, tenant
):
    tree = make_tree(conn, tenant)  # pending ops of a real tenant, not yet sequenced
    acts.promote(conn, tenant, claim(tree.a), b"body")
    before = frontier_and_cut(conn)
    unknown = new_id()
    head, rest = command[:-1] if command[0] == "sql" else command, command[-1:]
    args = [*head, "--tenant", unknown, *(rest if command[0] == "sql" else [])]
    code, out, err = run(capsys, *args)
    assert code == 2, (out, err)
    assert err.strip().splitlines() == [
        f"oml-lake: unknown tenant: tenant {unknown} is not known to PostgreSQL (no policy, "
        "sequencer or outbox row; 1 tenants are): check the id, or `oml-lake doctor` lists them"
    ]
    assert frontier_and_cut(conn) == before, "nothing sequenced or recorded"
    assert not Path(lake.tenant_uri(unknown)).exists()


def test_a_tenant_id_that_is_not_a_uuid_is_refused(conn, lake, capsys, tenant):
    code, _, err = run(capsys, "reconcile", "--tenant", "../other-tenant")
    assert code == 2 and "tenant '../other-tenant' is not a UUID" in err


def test_a_tenant_known_only_by_its_first_ops_is_drained(conn, lake, capsys):
    """A producer's first ops, before any policy or sequencer row: a known tenant."""
    keys = producer.create_tenant(conn)
    make_tree(conn, keys)
    conn.execute("DELETE FROM oml.tenant_policy WHERE tenant_id = %s", (keys.tenant_id,))
    code, out, _ = run(capsys, "drain", "--tenant", keys.tenant_id)
    assert code == 0 and f"tenant {keys.tenant_id} batch" in out


# --- a missing lake ------------------------------------------------------------------------------


def test_a_lost_lake_is_a_finding_in_every_command_that_reads_it(conn, lake, capsys, tenant):
    tree = make_tree(conn, tenant)
    acts.promote(conn, tenant, claim(tree.a), b"body")
    drain_all(conn, lake)
    shutil.rmtree(lake.tenant_uri(tenant.tenant_id))
    t = tenant.tenant_id

    code, _, err = run(capsys, "areas-at", "--tenant", t)
    assert code == 1 and f"tenant {t} has no bronze.events" in err
    code, out, _ = run(capsys, "maintain", "all", "--tenant", t)
    assert code == 1 and f"tenant {t}: FINDING" in out and "a lost lake" in out
    code, out, _ = run(capsys, "reconcile", "--tenant", t)
    assert code == 1 and "a lost lake: backfill the tenant" in out
    code, out, _ = run(capsys, "doctor", "--tenant", t)
    assert code == 1 and "a lost lake: 4 tables the frontier records are missing" in out
    code, _, err = run(capsys, "sql", "--tenant", t, "SELECT 1")
    assert code == 1 and "has no lake tables" in err
    code, out, _ = run(capsys, "erasure-evidence", "--tenant", t)
    assert code == 1 and "FINDING: a lost lake" in out


def test_a_tenant_never_drained_is_not_a_lost_lake(conn, lake, capsys, tenant):
    code, out, _ = run(capsys, "maintain", "all", "--tenant", tenant.tenant_id)
    assert code == 0 and "no lake tables (nothing drained yet)" in out


# --- one story ----------------------------------------------------------------------------------


def _bad_act(conn, keys, op: str, payload) -> None:
    commit_acts(conn, keys, [Act(Event("test.bad", {"op": op}), [(op, payload)])])


def lake_with(condition: str, conn, lake) -> str:
    """A drained tenant, clean or with one condition an operator must see."""
    bound = dt.timedelta(seconds=2) if condition == "breach" else dt.timedelta(days=7)
    keys = producer.create_tenant(conn, erasure_bound=bound)
    tree = make_tree(conn, keys)
    c = claim(tree.a)
    acts.promote(conn, keys, c, b"body")
    if condition == "dead letter":
        _bad_act(conn, keys, "claim.unknown_op", {"x": 1})
    if condition == "dead-lettered erase":
        acts.erase(conn, keys, claim(tree.a))  # never promoted: dead-lettered
    drain_all(conn, lake)
    if condition == "breach":
        acts.erase(conn, keys, c)
        drain_all(conn, lake)
        silver = Path(lake.table_uri(keys.tenant_id, SILVER_CLAIMS))
        orphan = silver / "part-00000-orphan-c000.snappy.parquet"
        orphan.write_bytes(b"PAR1")  # an unreferenced data file past bound + cadence
        long_ago = time.time() - 86400
        os.utime(orphan, (long_ago, long_ago))
    if condition == "lost table":
        shutil.rmtree(lake.table_uri(keys.tenant_id, SILVER_CLAIMS))
    return keys.tenant_id


CONDITIONS = ["clean", "dead letter", "dead-lettered erase", "breach", "lost table"]


@pytest.mark.parametrize("condition", CONDITIONS)
def test_doctor_reconcile_and_evidence_tell_the_same_story(condition, conn, lake, capsys):
    t = lake_with(condition, conn, lake)
    hours = ["--cadence-hours", "0.0001"]  # a short cadence: the orphan is past its deadline
    doctor_code, out, _ = run(capsys, "doctor", "--tenant", t, "--json", *hours)
    doctor = json.loads(out)
    reconcile_code, out, _ = run(capsys, "reconcile", "--tenant", t, "--json")
    reconciled = json.loads(out)
    evidence_code, out, _ = run(capsys, "erasure-evidence", "--tenant", t, "--json", *hours)
    evidence = json.loads(out)

    failing = sorted(f"{c['table']}/{c['check']}" for c in reconciled["checks"] if not c["passed"])
    assert sorted(f["check"] for f in doctor["failed_checks"]) == failing
    assert doctor["erasure"] == evidence["verdict"]
    assert (reconcile_code == 1) == bool(failing) == (not reconciled["ok"])
    lost = evidence["lost_tables"]
    assert lost == doctor["lost_tables"]
    assert (evidence_code == 1) == (evidence["verdict"]["state"] != "holds" or bool(lost))
    assert (doctor_code == 1) == (not doctor["healthy"])
    expected = {
        "clean": ([], "holds", True),
        "dead letter": (["silver.claims/no_open_dead_letters"], "holds", False),
        "dead-lettered erase": (["silver.claims/no_open_dead_letters"], "at risk", False),
        "breach": ([], "breached", False),
        "lost table": (["silver.claims/frontier_matches_delta_log"], "holds", False),
    }[condition]
    assert (failing, evidence["verdict"]["state"], doctor["healthy"]) == expected
    assert bool(lost) == (condition == "lost table")
    # The text screens say the same as the JSON.
    _, text, _ = run(capsys, "doctor", "--tenant", t, *hours)
    assert f"{len(failing)} failed checks" in text
    state = evidence["verdict"]["state"]
    assert f"erasure SLO {state if state == 'holds' else state.upper()}" in text
    _, text, _ = run(capsys, "erasure-evidence", "--tenant", t, *hours)
    assert f"erasure SLO {state if state == 'holds' else state.upper()}" in text


# --- resolving a dead letter ---------------------------------------------------------------------


def test_a_dead_letter_resolved_for_good_is_kept_for_audit_and_no_longer_a_finding(
    conn, lake, capsys, tenant
):
    tree = make_tree(conn, tenant)
    acts.promote(conn, tenant, claim(tree.a), b"body")
    _bad_act(conn, tenant, "claim.unknown_op", {"x": 1})
    drain_all(conn, lake)
    t = tenant.tenant_id
    (letter,) = deadletter.list_dead_letters(conn, t)
    assert run(capsys, "reconcile", "--tenant", t)[0] == 1

    code, _, err = run(capsys, "deadletter", "resolve", str(letter.seq), "--reason", " ")
    assert code == 2 and "needs a reason" in err
    code, out, _ = run(
        capsys, "deadletter", "resolve", str(letter.seq), "--reason", "unknown op", "--by", "ana"
    )
    assert code == 0 and f"resolved dead letter {letter.seq}" in out and "by ana" in out

    assert run(capsys, "deadletter", "list", "--tenant", t)[1].strip() == "no dead letters"
    _, listed, _ = run(capsys, "deadletter", "list", "--tenant", t, "--all")
    assert f"seq {letter.seq} tenant {t} claim.unknown_op:" in listed
    assert "by ana: unknown op]" in listed
    assert listed.count("claim.unknown_op:") == 1, "the op name once"
    assert run(capsys, "reconcile", "--tenant", t)[0] == 0
    code, out, _ = run(capsys, "doctor", "--tenant", t)
    assert code == 0 and "0 open dead letters" in out

    code, _, err = run(capsys, "deadletter", "resolve", str(letter.seq), "--reason", "again")
    assert code == 2 and "already resolved" in err
    code, _, err = run(capsys, "deadletter", "requeue", str(letter.seq))
    assert code == 2 and "was resolved" in err
    code, _, err = run(capsys, "deadletter", "resolve", "999999", "--reason", "x")
    assert code == 2 and "no dead letter with seq 999999" in err
    # The op stays refused: nothing of it reached the lake, and a drain changes nothing.
    assert run(capsys, "drain", "--tenant", t)[0] == 0
    assert deadletter.list_dead_letters(conn, t, include_requeued=True)[0].resolved_by == "ana"


# --- an interrupted drain ------------------------------------------------------------------------


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_interrupted_drain_says_what_it_committed_and_a_rerun_resumes(
    stop, conn, dsn, lake, tmp_path, tenant
):
    # Some 100 batches of 3 ops: seconds of work left after the second one lands, so the signal
    # meets a drain under way even on a loaded machine.
    tree = make_tree(conn, tenant)
    for _ in range(300):
        acts.promote(conn, tenant, claim(tree.a), b"body")
    out_path, err_path = tmp_path / "out", tmp_path / "err"
    env = {**os.environ, "OML_PG_DSN": dsn, "OML_LAKE_URI": lake.root}
    command = [sys.executable, "-m", "oml_dagster.cli", "drain", "--until-idle", "--max-batch", "3"]
    with out_path.open("w") as out, err_path.open("w") as err:
        drain = subprocess.Popen(command, env=env, stdout=out, stderr=err)
        deadline = time.monotonic() + 120
        while out_path.read_text().count(" batch (") < 2:
            assert drain.poll() is None, err_path.read_text()
            assert time.monotonic() < deadline, "no batch line within 120 s"
            time.sleep(0.05)
        drain.send_signal(stop)
        code = drain.wait(60)
    lines = out_path.read_text().splitlines()
    batches = [line for line in lines if " batch (" in line]
    assert code != 0 or len(batches) < 100, "the drain had finished before the signal came"
    assert code == 130, err_path.read_text()
    assert len(batches) >= 2, "each committed batch was reported as it landed"
    said = err_path.read_text().strip().splitlines()
    assert len(said) == 1, said
    (summary,) = said
    assert summary.startswith("oml-lake drain: interrupted after ")
    assert f"tenant {tenant.tenant_id} through seq " in summary
    through = int(summary.split(" through seq ")[1].split(".")[0])
    last_reported = int(batches[-1].split(", ")[1].split("]")[0])
    assert through <= last_reported
    done = subprocess.run(
        [sys.executable, "-m", "oml_dagster.cli", "drain", "--until-idle"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert f"lag tenant {tenant.tenant_id}: 0 ops" in done.stdout
    assert cli.main(["reconcile", "--tenant", tenant.tenant_id]) == 0


# --- the smaller warts ---------------------------------------------------------------------------


def test_a_closed_pipe_stops_a_command_quietly_and_is_not_retried(conn, dsn, lake, tenant):
    """`oml-lake ... | head`: the reader goes away; that is no network fault to ride through."""
    tree = make_tree(conn, tenant)
    for _ in range(60):
        acts.promote(conn, tenant, claim(tree.a), b"body")
    env = {**os.environ, "OML_PG_DSN": dsn, "OML_LAKE_URI": lake.root}
    started = time.monotonic()
    done = subprocess.run(
        f"{sys.executable} -m oml_dagster.cli drain --until-idle --max-batch 2 | head -1",
        shell=True,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.stdout.count("\n") == 1
    assert "retrying" not in done.stderr and "fault" not in done.stderr, done.stderr
    assert time.monotonic() - started < 60
    status = subprocess.run(
        [sys.executable, "-m", "oml_dagster.cli", "drain", "--until-idle", "--max-batch", "2"],
        env=env,
        capture_output=True,
        timeout=120,
    )
    assert status.returncode == 0  # the rest drains; what the first one committed is kept


def test_a_refusal_names_its_op_once():
    assert cli.refusal_line("claim.erase", "wrong tenant: x") == "claim.erase: wrong tenant: x"
    assert cli.refusal_line("claim.reassign", "claim.reassign: field 'held' is missing") == (
        "claim.reassign: field 'held' is missing"
    )
    line = cli.refusal_line("claim.reassign", "claim.reassign at journal_seq 108 is not newer")
    assert line.count("claim.reassign") == 1


@given(st.integers(min_value=0, max_value=400 * 86400))
def test_a_span_reads_back_as_its_seconds(seconds):
    """Every duration prints as whole units an operator reads ("7 days", "1 day 6 h"), never
    "7 days, 0:00:00", and adds back up to its seconds."""
    text = span(dt.timedelta(seconds=seconds))
    units = {"day": 86400, "days": 86400, "h": 3600, "min": 60, "s": 1}
    words = text.split()
    numbers = [int(n) for n in words[::2]]
    assert sum(n * units[u] for n, u in zip(numbers, words[1::2], strict=True)) == seconds
    assert ":" not in text and "," not in text
    assert all(numbers) or text == "0 s", "no zero parts"


def test_the_help_cites_no_missing_document(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "DESIGN §" not in capsys.readouterr().out


def test_log_cleanup_without_a_checkpoint_says_so():
    from oml_dagster.lake.store.maintenance import LOG_CLEANUP, MaintenanceResult

    result = MaintenanceResult(new_id(), "silver.claims", LOG_CLEANUP, "unchanged", "log files")
    line = result.describe()
    assert "checkpoint at None" not in line and "no checkpoint yet" in line
    with_one = MaintenanceResult(
        new_id(), "silver.claims", LOG_CLEANUP, "unchanged", "log files", checkpoint_version=7
    )
    assert "checkpoint at 7" in with_one.describe()
