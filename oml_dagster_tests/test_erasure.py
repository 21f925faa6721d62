"""The erasure SLO in the lake (spec: "The erasure-SLO interaction"): once an erase is drained and
the tenant's bound has passed, one maintenance run leaves no copy of the erased ciphertext in any
file under the tenant's prefix (live, superseded, orphaned, log or checkpoint), while the other
claims stay readable with their bodies and the table stays readable at its latest version."""

from __future__ import annotations

import datetime as dt
import os
import shutil
import time
import uuid
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from deltalake import CommitProperties, DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError, TableNotFoundError

from oml_dagster.lake.audit.erasure import erased_artifacts, erasure_evidence
from oml_dagster.lake.model.tables import APP_ID, GOLD_CURATED, SILVER_CLAIMS, TableSpec
from oml_dagster.lake.store import deltalog, maintenance
from oml_dagster.lake.store.layout import Lake
from oml_dagster.lake.store.reads import conform, read_rows, tenant_tables
from oml_dagster.lake.write import deadletter
from oml_dagster.simulate import acts, producer
from oml_dagster_tests.helpers import claim, drain_all, holds, make_tree, split_checkpoint

BOUND = dt.timedelta(seconds=2)


def files_holding(lake: Lake, tenant_id: str, needle: bytes) -> list[str]:
    """Every file under the tenant's prefix that holds `needle` (raw, or in a decoded Parquet
    value)."""
    root = lake.tenant_uri(tenant_id)
    hits = []
    for directory, _, names in os.walk(root):
        for name in names:
            path = os.path.join(directory, name)
            if holds(Path(path).read_bytes(), needle):
                hits.append(os.path.relpath(path, root))
    return sorted(hits)


def leave_orphan(lake: Lake, tenant_id: str, spec: TableSpec, workarea_id: str | None = None):
    """What a writer leaves that loses a commit race (or, for a table still at its first
    version, is killed before committing): a data file with the table's current rows that no
    log entry references."""
    uri = lake.table_uri(tenant_id, spec, workarea_id)
    current = lake.open(uri)
    rows = conform(current.to_pyarrow_table(), spec)
    if current.version() == 0:
        pq.write_table(rows, Path(uri) / f"part-00000-{uuid.uuid4()}-c000.snappy.parquet")
        return
    stale = lake.open(uri, version=current.version() - 1)
    with pytest.raises(CommitFailedError):
        write_deltalake(
            stale,
            rows,
            mode="append",
            commit_properties=CommitProperties(max_commit_retries=0),
        )
    assert lake.open(uri).version() == current.version()


def wait_out(bound: dt.timedelta, since: float) -> None:
    time.sleep(max(0.0, since + bound.total_seconds() + 0.3 - time.time()))


def bodies_of(conn, tenant_id: str) -> dict[tuple[str, int], bytes]:
    rows = conn.execute(
        "SELECT artifact_id::text, version, dek FROM oml_sim.deks WHERE tenant_id = %s",
        (tenant_id,),
    ).fetchall()
    return {(a, v): bytes(dek) for a, v, dek in rows}


def test_erased_ciphertext_leaves_every_file_under_the_tenant_prefix(conn, lake):
    keys = producer.create_tenant(conn, erasure_bound=BOUND)
    tree = make_tree(conn, keys)
    made, bodies = [], {}
    for i in range(6):
        workarea, path = (tree.a, "u.a") if i % 3 == 0 else (tree.b, "u.b")
        c = claim(workarea, path)
        plaintext = f"plaintext {i} of {c.artifact_id}".encode()
        bodies[c.artifact_id] = (plaintext, acts.promote(conn, keys, c, plaintext).ciphertext)
        made.append(c)
        if i % 2:
            drain_all(conn, lake)
    acts.upsert_area(conn, keys, tree.b, status="committed")
    acts.validate_area(conn, keys, tree.b)
    drain_all(conn, lake)
    # Earlier maintenance rewrote the body into new files: those copies are superseded too.
    maintenance.compact(conn, lake, keys.tenant_id)
    target = made[1]
    erased = bodies[target.artifact_id][1]
    leave_orphan(lake, keys.tenant_id, SILVER_CLAIMS)
    leave_orphan(lake, keys.tenant_id, GOLD_CURATED, tree.b)

    acts.erase(conn, keys, target)
    drain_all(conn, lake)
    erased_at = time.time()
    silver_uri = lake.table_uri(keys.tenant_id, SILVER_CLAIMS)
    row = next(
        r
        for r in read_rows(lake.open(silver_uri), SILVER_CLAIMS)
        if r["artifact_id"] == target.artifact_id
    )
    assert row["state"] == "erased" and row["body_ciphertext"] is None
    before = files_holding(lake, keys.tenant_id, erased)
    # Live tables no longer hold it; superseded files (written, compacted) and orphans still do.
    silver_copies = [p for p in before if p.startswith("silver/claims/")]
    curated_copies = [p for p in before if p.startswith("gold/curated/")]
    assert len(silver_copies) >= 3 and len(curated_copies) >= 2, before

    wait_out(BOUND, erased_at)
    results = maintenance.maintain(conn, lake, keys.tenant_id, task="vacuum")

    assert files_holding(lake, keys.tenant_id, erased) == []
    removed = {r.table: r.files_removed for r in results if r.operation == maintenance.VACUUM}
    assert removed[SILVER_CLAIMS.name] >= len(silver_copies)

    # Every other claim reads back with its body, which still opens under its key.
    deks = bodies_of(conn, keys.tenant_id)
    for name, spec, uri in tenant_tables(lake, keys.tenant_id):
        if spec not in (SILVER_CLAIMS, GOLD_CURATED):
            continue
        rows = read_rows(lake.open(uri), spec)
        assert rows, name
        for r in rows:
            if r["artifact_id"] == target.artifact_id:
                assert r["body_ciphertext"] is None and r["state"] == "erased"
                continue
            plaintext, ciphertext = bodies[r["artifact_id"]]
            assert r["body_ciphertext"] == ciphertext, name
            dek = deks[(r["artifact_id"], r["version"])]
            assert producer.open_body(ciphertext, dek, r["artifact_id"], r["version"]) == plaintext

    # No log entry older than the bound survives except the checkpoint's own commit.
    cutoff = time.time() - BOUND.total_seconds()
    for name, _, uri in tenant_tables(lake, keys.tenant_id):
        checkpoint = deltalog.last_checkpoint(lake.filesystem(uri))
        for entry in (Path(uri) / "_delta_log").glob("*.json"):
            if entry.stat().st_mtime < cutoff:
                assert checkpoint is not None and int(entry.name[:20]) >= checkpoint, (name, entry)


def test_log_cleanup_keeps_the_latest_version_and_ends_time_travel(conn, lake):
    keys = producer.create_tenant(conn, erasure_bound=BOUND)
    tree = make_tree(conn, keys)
    made = []
    for i in range(4):
        c = claim(tree.a)
        acts.promote(conn, keys, c, f"body {i}".encode())
        drain_all(conn, lake)
        made.append(c)
    acts.erase(conn, keys, made[0])
    drain_all(conn, lake)
    erased_at = time.time()
    snapshot = {
        name: (lake.open(uri).version(), read_rows(lake.open(uri), spec))
        for name, spec, uri in tenant_tables(lake, keys.tenant_id)
    }
    txns = {
        name: lake.open(uri).transaction_version(APP_ID)
        for name, _, uri in tenant_tables(lake, keys.tenant_id)
    }

    wait_out(BOUND, erased_at)
    silver_uri = lake.table_uri(keys.tenant_id, SILVER_CLAIMS)
    # A file from a write still in flight (younger than the bound) is not an orphan yet.
    in_flight = Path(silver_uri) / "part-00000-in-flight-c000.snappy.parquet"
    in_flight.write_bytes(b"PAR1 in flight")
    results = maintenance.maintain(conn, lake, keys.tenant_id, task="vacuum")
    assert in_flight.exists()
    assert sum(r.log_files_removed for r in results) > 0

    for name, spec, uri in tenant_tables(lake, keys.tenant_id):
        table = lake.open(uri)
        version, rows = snapshot[name]
        assert table.version() in (version, version + 2)  # VACUUM START and END, if any
        assert read_rows(table, spec) == rows
        assert table.transaction_version(APP_ID) == txns[name]
        checkpoint = deltalog.last_checkpoint(lake.filesystem(uri))
        if version > 0:
            # Versions before the checkpoint the cleanup kept are gone: time travel to them
            # fails ("No files in log segment", a TableNotFoundError).
            assert checkpoint is not None and checkpoint > 0, name
            with pytest.raises(TableNotFoundError, match="No files in log segment"):
                DeltaTable(uri, version=checkpoint - 1)

    # The writer goes on from where the log says it is: nothing re-applied, the next act lands.
    late = claim(tree.a)
    acts.promote(conn, keys, late, b"after cleanup")
    drain_all(conn, lake)
    silver = read_rows(lake.open(silver_uri), SILVER_CLAIMS)
    assert sorted(r["artifact_id"] for r in silver) == sorted(c.artifact_id for c in [*made, late])


CADENCE = dt.timedelta(seconds=1)


def test_erasure_evidence_fails_until_vacuum_then_holds(conn, lake):
    # The promotes' drains supersede silver files before the first check; a bound of a few
    # seconds keeps them within bound + cadence on a slow machine (and on S3) too.
    bound = dt.timedelta(seconds=8)
    keys = producer.create_tenant(conn, erasure_bound=bound)
    tree = make_tree(conn, keys)
    made = [claim(tree.a) for _ in range(3)]
    for c in made:
        acts.promote(conn, keys, c, b"secret " + c.artifact_id.encode())
        drain_all(conn, lake)
    acts.upsert_area(conn, keys, tree.a, status="committed")
    acts.validate_area(conn, keys, tree.a)
    drain_all(conn, lake)
    fresh = erasure_evidence(conn, lake, keys.tenant_id, cadence=CADENCE)
    assert fresh.ok, fresh.findings()

    acts.erase(conn, keys, made[0])
    drain_all(conn, lake)
    # The evidence is judged at pinned instants, so a slow machine cannot age the copies past
    # their deadline between the drain and the check (the copies were superseded before this).
    drained_at = dt.datetime.now(dt.UTC)
    just_erased = erasure_evidence(conn, lake, keys.tenant_id, cadence=CADENCE, now=drained_at)
    assert just_erased.ok, "superseded copies younger than bound + cadence are within the SLO"
    silver = next(t for t in just_erased.tables if t.table == SILVER_CLAIMS.name)
    assert silver.erased_rows == 1 and silver.erased_rows_with_body == 0
    assert silver.unreferenced_files >= 1

    past_deadline = drained_at + bound + CADENCE + dt.timedelta(seconds=0.5)
    overdue = erasure_evidence(conn, lake, keys.tenant_id, cadence=CADENCE, now=past_deadline)
    assert not overdue.ok
    assert any("silver.claims" in f and "unreferenced data files" in f for f in overdue.findings())
    assert any(f"gold.curated/{tree.a}" in f for f in overdue.findings())

    wait_out(bound, drained_at.timestamp())  # VACUUM keeps what was removed within the bound
    maintenance.maintain(conn, lake, keys.tenant_id, task="vacuum")
    after = erasure_evidence(conn, lake, keys.tenant_id, cadence=CADENCE)
    assert after.ok, after.findings()


def test_erasure_evidence_reports_dead_lettered_and_waiting_erases(conn, lake):
    keys = producer.create_tenant(conn, erasure_bound=BOUND)
    tree = make_tree(conn, keys)
    held = claim(tree.a)
    acts.promote(conn, keys, held, b"kept")
    ghost = claim(tree.a)  # never promoted: its erase is refused
    acts.erase(conn, keys, ghost)
    drain_all(conn, lake)
    evidence = erasure_evidence(conn, lake, keys.tenant_id, cadence=CADENCE)
    assert not evidence.ok
    ((seq, artifact_id, reason),) = evidence.dead_lettered_erases
    assert artifact_id == ghost.artifact_id and "does not hold" in reason
    assert any(
        f"erase of {ghost.artifact_id} dead-lettered at seq {seq}" in f for f in evidence.findings()
    )

    conn.execute("UPDATE oml.lake_dead_letter SET requeued_at = now(), requeued_by = 'test'")
    acts.erase(conn, keys, held)  # written, not drained
    waiting = erasure_evidence(conn, lake, keys.tenant_id, cadence=CADENCE)
    assert [p[1] for p in waiting.pending_erases] == [held.artifact_id]
    assert waiting.ok, "an erase younger than bound + cadence is still within the SLO"
    later = dt.datetime.now(dt.UTC) + BOUND + CADENCE + dt.timedelta(seconds=1)
    late = erasure_evidence(conn, lake, keys.tenant_id, cadence=CADENCE, now=later)
    assert not late.ok and any(f"erase of {held.artifact_id}" in f for f in late.findings())
    statuses = {
        a.artifact_id: (a.status, a.overdue(later), a.copies)
        for a in erased_artifacts(conn, lake, keys.tenant_id, cadence=CADENCE, now=later).artifacts
    }
    # The lake never held the ghost and its dead letter is closed; the held one waits with its
    # body still in the live version, past its deadline.
    assert statuses[ghost.artifact_id] == ("refused", False, [])
    status, overdue, copies = statuses[held.artifact_id]
    assert (status, overdue, [c.copy_class for c in copies]) == ("pending", True, ["live"])
    drain_all(conn, lake)
    assert erasure_evidence(conn, lake, keys.tenant_id, cadence=CADENCE).pending_erases == []


def test_erasure_evidence_command_exits_nonzero_on_a_dead_lettered_erase(conn, dsn, lake):
    """A dead-lettered erase is a breach in progress (spec): at risk, naming it, exit 1 — and
    `doctor` says the same from the same verdict."""
    import subprocess
    import sys

    keys = producer.create_tenant(conn, erasure_bound=BOUND)
    tree = make_tree(conn, keys)
    acts.erase(conn, keys, claim(tree.a))
    drain_all(conn, lake)
    env = {**os.environ, "OML_PG_DSN": dsn, "OML_LAKE_URI": lake.root}
    done = subprocess.run(
        [sys.executable, "-m", "oml_dagster.cli", "erasure-evidence", "--tenant", keys.tenant_id],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"tenant {keys.tenant_id}: erasure SLO AT RISK (bound 2 s + cadence 1 day" in done.stdout
    assert "dead-lettered: a breach in progress" in done.stdout


def erase_a_claim_written_long_ago(conn, lake: Lake, bound: dt.timedelta, age: dt.timedelta):
    """A claim promoted, its silver files dated `age` back, then erased and drained: the erase
    removes (tombstones) those files just now. Returns the tenant's keys, tree, silver's root and
    the files' date."""
    keys = producer.create_tenant(conn, erasure_bound=bound)
    tree = make_tree(conn, keys)
    c = claim(tree.a)
    acts.promote(conn, keys, c, b"old body")
    drain_all(conn, lake)
    silver_uri = Path(lake.table_uri(keys.tenant_id, SILVER_CLAIMS))
    long_ago = time.time() - age.total_seconds()
    for f in silver_uri.glob("*.parquet"):
        os.utime(f, (long_ago, long_ago))
    acts.erase(conn, keys, c)
    drain_all(conn, lake)
    return keys, tree, silver_uri, long_ago


def test_a_superseded_file_ages_from_its_removal_not_its_writing(conn, lake):
    keys, _, silver_uri, long_ago = erase_a_claim_written_long_ago(
        conn, lake, BOUND, dt.timedelta(days=1)
    )
    drained_at = dt.datetime.now(dt.UTC)  # pinned: a slow machine must not age the removal
    evidence = erasure_evidence(conn, lake, keys.tenant_id, cadence=CADENCE, now=drained_at)
    silver = next(t for t in evidence.tables if t.table == SILVER_CLAIMS.name)
    assert silver.unreferenced_files >= 1
    assert silver.overdue_files == [], "removed just now: within the bound"
    # An orphan (no tombstone) that old is overdue.
    orphan = silver_uri / "part-00000-orphan-c000.snappy.parquet"
    orphan.write_bytes(b"PAR1")
    os.utime(orphan, (long_ago, long_ago))
    evidence = erasure_evidence(conn, lake, keys.tenant_id, cadence=CADENCE)
    silver = next(t for t in evidence.tables if t.table == SILVER_CLAIMS.name)
    assert silver.overdue_files == [orphan.name]


def test_a_tombstone_kept_only_in_a_multi_part_checkpoint_still_dates_the_removal(conn, lake):
    """Log cleanup leaves the removes of expired commits only in the checkpoint; a checkpoint in
    parts (as Spark writes them) holds them as well as a single file does."""
    keys, tree, silver_uri, _ = erase_a_claim_written_long_ago(
        conn, lake, dt.timedelta(hours=1), dt.timedelta(days=3)
    )
    acts.promote(conn, keys, claim(tree.a), b"another")
    drain_all(conn, lake)
    lake.open(str(silver_uri)).create_checkpoint()
    version = split_checkpoint(str(silver_uri), 3)
    for commit in (silver_uri / "_delta_log").glob("*.json"):
        if int(commit.name[:20]) < version:
            commit.unlink()
    drained_at = dt.datetime.now(dt.UTC)
    evidence = erasure_evidence(conn, lake, keys.tenant_id, cadence=CADENCE, now=drained_at)
    silver = next(t for t in evidence.tables if t.table == SILVER_CLAIMS.name)
    assert silver.unreferenced_files >= 1
    assert silver.overdue_files == [], "removed just now: within the bound"
    per_artifact = erased_artifacts(conn, lake, keys.tenant_id, cadence=CADENCE, now=drained_at)
    superseded = [
        copy for a in per_artifact.artifacts for copy in a.copies if copy.copy_class == "superseded"
    ]
    assert superseded and all(c.expires_at > drained_at for c in superseded)


# --- blind spots of the evidence (each failed on the evidence before it was fixed) ---------------


def test_a_requeued_erase_ages_from_the_original_erase(conn, lake):
    keys = producer.create_tenant(conn, erasure_bound=BOUND)
    tree = make_tree(conn, keys)
    c = claim(tree.a)
    acts.promote(conn, keys, c, b"to be erased")
    drain_all(conn, lake)
    an_hour_ago = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)
    bad = {
        "artifact_id": c.artifact_id,
        "version": str(c.version),
        "at": producer.instant(an_hour_ago),
    }
    producer.commit_acts(
        conn, keys, [producer.Act(c.event("claim.erased", bad), [("claim.erase", bad)])]
    )
    conn.execute("UPDATE oml.outbox SET created_at = %s WHERE op = 'claim.erase'", (an_hour_ago,))
    drain_all(conn, lake)
    (seq,) = [s for (s,) in conn.execute("SELECT seq FROM oml.lake_dead_letter")]
    refused = erasure_evidence(conn, lake, keys.tenant_id, cadence=CADENCE)
    assert not refused.ok and refused.dead_lettered_erases[0][0] == seq

    # An operator fixes the payload and re-enqueues it an hour later; it is not drained yet.
    deadletter.requeue(conn, seq, "operator", payload=dict(bad, version=c.version))
    waiting = erasure_evidence(conn, lake, keys.tenant_id, cadence=CADENCE)
    assert waiting.dead_lettered_erases == []
    ((_, artifact_id, age),) = waiting.pending_erases
    assert artifact_id == c.artifact_id and age >= 3600 - 5, "aged from the first erase"
    assert not waiting.ok, "waiting an hour past a 3 s SLO is a breach, requeue or not"
    (erased,) = erased_artifacts(conn, lake, keys.tenant_id, cadence=CADENCE).artifacts
    assert erased.status == "pending" and erased.erased_at <= an_hour_ago + dt.timedelta(seconds=1)

    drain_all(conn, lake)
    applied = erasure_evidence(conn, lake, keys.tenant_id, cadence=CADENCE)
    assert applied.pending_erases == [] and applied.ok, applied.findings()


def test_a_table_without_a_checkpoint_has_its_log_checked(conn, lake):
    keys = producer.create_tenant(conn, erasure_bound=BOUND)
    tree = make_tree(conn, keys)
    for i in range(3):
        acts.promote(conn, keys, claim(tree.a), f"body {i}".encode())
        drain_all(conn, lake)
    silver_uri = lake.table_uri(keys.tenant_id, SILVER_CLAIMS)
    assert deltalog.last_checkpoint(lake.filesystem(silver_uri)) is None
    long_ago = time.time() - 86400
    log = sorted((Path(silver_uri) / "_delta_log").glob("*.json"))
    assert len(log) >= 3
    for entry in log:
        os.utime(entry, (long_ago, long_ago))
    evidence = erasure_evidence(conn, lake, keys.tenant_id, cadence=CADENCE)
    silver = next(t for t in evidence.tables if t.table == SILVER_CLAIMS.name)
    # Every entry but the latest is one a checkpoint would let log cleanup expire.
    assert silver.overdue_log_entries == [e.name for e in log[:-1]]
    assert not evidence.ok

    maintenance.maintain(conn, lake, keys.tenant_id, task="vacuum")
    after = erasure_evidence(conn, lake, keys.tenant_id, cadence=CADENCE)
    assert after.ok, after.findings()


def test_a_lake_restored_from_before_an_erase_fails_the_evidence(conn, lake, tmp_path):
    keys = producer.create_tenant(conn, erasure_bound=BOUND)
    tree = make_tree(conn, keys)
    c = claim(tree.a)
    acts.promote(conn, keys, c, b"restored with the backup")
    drain_all(conn, lake)
    prefix = Path(lake.tenant_uri(keys.tenant_id))
    shutil.copytree(prefix, tmp_path / "backup")
    acts.erase(conn, keys, c)
    drain_all(conn, lake)
    assert erasure_evidence(conn, lake, keys.tenant_id, cadence=CADENCE).pending_erases == []

    # The lake comes back from the old copy; the frontier cache in Postgres still says drained.
    shutil.rmtree(prefix)
    shutil.copytree(tmp_path / "backup", prefix)
    evidence = erasure_evidence(conn, lake, keys.tenant_id, cadence=CADENCE)
    assert [p[1] for p in evidence.pending_erases] == [c.artifact_id]
    later = dt.datetime.now(dt.UTC) + BOUND + CADENCE + dt.timedelta(seconds=1)
    late = erasure_evidence(conn, lake, keys.tenant_id, cadence=CADENCE, now=later)
    assert not late.ok and any(f"erase of {c.artifact_id}" in f for f in late.findings())
    (erased,) = erased_artifacts(conn, lake, keys.tenant_id, cadence=CADENCE).artifacts
    assert erased.status == "pending"
    assert [copy.copy_class for copy in erased.copies] == ["live"]


# --- per erased version ------------------------------------------------------------------------


def test_per_artifact_evidence_lists_the_files_a_byte_scan_finds_until_vacuum(conn, lake):
    keys = producer.create_tenant(conn, erasure_bound=BOUND)
    tree = make_tree(conn, keys)
    made, ciphertexts = [], {}
    for i in range(6):
        workarea, path = (tree.a, "u.a") if i % 3 == 0 else (tree.b, "u.b")
        c = claim(workarea, path)
        ciphertexts[c.artifact_id] = acts.promote(conn, keys, c, f"body {i}".encode()).ciphertext
        made.append(c)
        if i % 2:
            drain_all(conn, lake)
    acts.upsert_area(conn, keys, tree.b, status="committed")
    acts.validate_area(conn, keys, tree.b)
    drain_all(conn, lake)
    maintenance.compact(conn, lake, keys.tenant_id)
    leave_orphan(lake, keys.tenant_id, SILVER_CLAIMS)
    leave_orphan(lake, keys.tenant_id, GOLD_CURATED, tree.b)
    assert erased_artifacts(conn, lake, keys.tenant_id, cadence=CADENCE).artifacts == []

    targets = [made[1], made[3]]  # one in the validated area (curated too), one not
    for c in targets:
        acts.erase(conn, keys, c)
    drain_all(conn, lake)
    erased_at = time.time()
    evidence = erased_artifacts(conn, lake, keys.tenant_id, cadence=CADENCE)
    assert sorted(a.artifact_id for a in evidence.artifacts) == sorted(
        c.artifact_id for c in targets
    )
    for artifact in evidence.artifacts:
        scanned = files_holding(lake, keys.tenant_id, ciphertexts[artifact.artifact_id])
        assert sorted(c.path for c in artifact.copies) == scanned
        assert {c.copy_class for c in artifact.copies} == {"superseded", "orphan"}
        assert artifact.status == "applied"
        assert artifact.deadline == artifact.applied_at + BOUND + CADENCE
        for copy in artifact.copies:
            assert artifact.applied_at < copy.expires_at <= artifact.deadline + CADENCE
    in_curated = next(a for a in evidence.artifacts if a.artifact_id == made[1].artifact_id)
    assert any(c.table == f"gold.curated/{tree.b}" for c in in_curated.copies)

    wait_out(BOUND, erased_at)
    maintenance.maintain(conn, lake, keys.tenant_id, task="vacuum")
    after = erased_artifacts(conn, lake, keys.tenant_id, cadence=CADENCE)
    assert [a.copies for a in after.artifacts] == [[], []]
    for c in targets:
        assert files_holding(lake, keys.tenant_id, ciphertexts[c.artifact_id]) == []


def test_erasure_evidence_json_lists_every_erased_version(conn, dsn, lake):
    import json
    import subprocess
    import sys

    keys = producer.create_tenant(conn, erasure_bound=BOUND)
    tree = make_tree(conn, keys)
    c = claim(tree.a)
    acts.promote(conn, keys, c, b"json")
    drain_all(conn, lake)
    acts.erase(conn, keys, c)
    drain_all(conn, lake)
    env = {**os.environ, "OML_PG_DSN": dsn, "OML_LAKE_URI": lake.root}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "oml_dagster.cli",
            "erasure-evidence",
            "--tenant",
            keys.tenant_id,
            "--json",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["tenant_id"] == keys.tenant_id
    assert report["bound_seconds"] == BOUND.total_seconds()
    (artifact,) = report["artifacts"]
    assert artifact["artifact_id"] == c.artifact_id and artifact["version"] == c.version
    assert artifact["erased_at"] < artifact["deadline"]
    assert artifact["copies"], "the superseded file is still there"
    assert {copy["class"] for copy in artifact["copies"]} == {"superseded"}
    assert all(
        copy["expires_at"] and copy["path"].startswith("silver/claims/")
        for copy in artifact["copies"]
    )
