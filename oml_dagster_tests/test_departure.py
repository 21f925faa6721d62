"""A tenant's departure (DESIGN "A tenant's departure"; ADR 0075, 0076): the export of its live
tables with a manifest that `verify-export` checks, and the purge of its prefix and of the
writer's records of it, with a receipt."""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psycopg
import pytest
from dagster import RunsFilter, build_sensor_context
from hypothesis import given, settings
from hypothesis import strategies as st

from oml_dagster.cli import main as cli_main
from oml_dagster.defs.partitions import TENANT_PARTITIONS_NAME
from oml_dagster.defs.resources import build_resources
from oml_dagster.lake.audit import export, purge
from oml_dagster.lake.errors import ExportTargetRefused, TenantNotDeparted
from oml_dagster.lake.faults import EXIT_FINDINGS, EXIT_OK, EXIT_USAGE
from oml_dagster.lake.model.tables import BRONZE_EVENTS, SILVER_CLAIMS
from oml_dagster.lake.policy import known_tenants
from oml_dagster.lake.queries import cross_scope, tenant_scope
from oml_dagster.lake.store.layout import Lake
from oml_dagster.lake.store.reads import read_rows
from oml_dagster.simulate import acts, producer
from oml_dagster_tests.dagster_support import materialize_partition
from oml_dagster_tests.helpers import claim, drain_all, holds, make_tree


def files_holding(root: Path, needle: bytes) -> list[str]:
    """Every file under `root` that holds `needle` (raw, or in a decoded Parquet value)."""
    return sorted(
        str(p.relative_to(root))
        for p in root.rglob("*")
        if p.is_file() and holds(p.read_bytes(), needle)
    )


def populated(conn, lake, tenant_id: str | None = None):
    """A tenant with claims in two areas (one validated: a curated table), an erased claim and
    a demoted one, drained. Returns (keys, erased ciphertext, kept ciphertexts)."""
    keys = producer.create_tenant(conn, tenant_id)
    tree = make_tree(conn, keys)
    made, bodies = [], {}
    for i in range(5):
        workarea, path = (tree.a, "u.a") if i % 2 == 0 else (tree.b, "u.b")
        c = claim(workarea, path)
        bodies[c.artifact_id] = acts.promote(
            conn, keys, c, f"secret {i} {c.artifact_id}".encode()
        ).ciphertext
        made.append(c)
        drain_all(conn, lake)
    acts.upsert_area(conn, keys, tree.b, status="committed")
    acts.validate_area(conn, keys, tree.b)
    drain_all(conn, lake)
    acts.erase(conn, keys, made[1])
    acts.demote(conn, keys, made[2])
    drain_all(conn, lake)
    erased = bodies.pop(made[1].artifact_id)
    return keys, erased, [v for k, v in bodies.items() if k != made[2].artifact_id]


def test_an_export_holds_the_live_rows_only_and_verifies(conn, lake, tmp_path):
    keys, erased, kept = populated(conn, lake)
    tenant_id = keys.tenant_id
    # The lake still holds the erased ciphertext in superseded files (no VACUUM yet).
    assert any(
        holds(p.read_bytes(), erased)
        for p in Path(lake.tenant_uri(tenant_id)).rglob("*")
        if p.is_file()
    )
    target = tmp_path / "export"
    result = export.export_tenant(conn, lake, tenant_id, Lake(str(target)))
    manifest = result.manifest
    names = {t["name"] for t in manifest["tables"]}
    assert {"bronze.events", "silver.claims", "gold.lineage", "gold.areas"} <= names
    assert any(n.startswith("gold.curated/") for n in names)
    assert files_holding(target, erased) == []
    for ciphertext in kept:
        assert files_holding(target, ciphertext), "a live body is exported"
    # Fresh tables: one commit each, no history.
    for t in manifest["tables"]:
        assert t["export_version"] == 0
        log = target / tenant_id / t["path"] / "_delta_log"
        assert sorted(p.name for p in log.glob("*.json")) == [f"{0:020d}.json"]
    bronze = next(t for t in manifest["tables"] if t["name"] == BRONZE_EVENTS.name)
    assert manifest["journal_head"]["journal_seq"] == bronze["rows"]
    check = export.verify_export(Lake(str(target)))
    assert check.ok, check.findings
    assert check.journal_head == manifest["journal_head"]


def test_verify_export_names_a_tampered_file(conn, lake, tmp_path):
    keys, _, _ = populated(conn, lake)
    target = tmp_path / "export"
    manifest = export.export_tenant(conn, lake, keys.tenant_id, Lake(str(target))).manifest
    silver = next(t for t in manifest["tables"] if t["name"] == SILVER_CLAIMS.name)
    victim = next(f["path"] for f in silver["files"] if f["path"].endswith(".parquet"))
    data = bytearray((target / victim).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (target / victim).write_bytes(bytes(data))
    check = export.verify_export(Lake(str(target)))
    assert not check.ok
    assert any(line.startswith(victim) and "SHA-256" in line for line in check.findings)
    # A log entry gone: named as missing, and the table no longer opens as it was.
    log = next(f["path"] for f in silver["files"] if "/_delta_log/" in f["path"])
    (target / log).unlink()
    check = export.verify_export(Lake(str(target)))
    assert f"{log}: listed in the manifest, missing" in check.findings


def test_verify_export_catches_a_forged_journal_even_with_a_matching_manifest(conn, lake, tmp_path):
    keys, _, _ = populated(conn, lake)
    target = tmp_path / "export"
    export.export_tenant(conn, lake, keys.tenant_id, Lake(str(target)))
    # Another key in the manifest: the chain no longer verifies under the keys it names.
    loaded = json.loads((target / export.MANIFEST).read_text())
    loaded["public_keys"] = {k: bytes(32).hex() for k in loaded["public_keys"]}
    (target / export.MANIFEST).write_text(json.dumps(loaded))
    check = export.verify_export(Lake(str(target)))
    assert any("journal_chain_verifies" in line for line in check.findings), check.findings


def test_an_export_target_must_be_empty_and_outside_the_lake(conn, lake, tmp_path):
    keys, _, _ = populated(conn, lake)
    with pytest.raises(ExportTargetRefused, match="lake root"):
        export.export_tenant(conn, lake, keys.tenant_id, Lake(os.path.join(lake.root, "exports")))
    full = tmp_path / "full"
    full.mkdir()
    (full / "something.txt").write_text("x")
    with pytest.raises(ExportTargetRefused, match="something.txt"):
        export.export_tenant(conn, lake, keys.tenant_id, Lake(str(full)))
    assert sorted(p.name for p in full.iterdir()) == ["something.txt"]


def test_an_interrupted_export_resumes_without_a_row_twice(conn, lake, tmp_path):
    keys, _, _ = populated(conn, lake)
    target = tmp_path / "export"

    class Crash(Exception):
        pass

    seen: list[str] = []

    def crash_after_two(name: str) -> None:
        seen.append(name)
        if len(seen) == 2:
            raise Crash(name)

    with pytest.raises(Crash):
        export.export_tenant(
            conn, lake, keys.tenant_id, Lake(str(target)), after_table=crash_after_two
        )
    assert not (target / export.MANIFEST).exists()
    # A table whose write died before its commit leaves files but no table.
    third = target / keys.tenant_id / "gold" / "lineage"
    if not (third / "_delta_log").exists():
        third.mkdir(parents=True, exist_ok=True)
        (third / "part-00000-orphan.parquet").write_bytes(b"PAR1 half written")
    # More ops after the first run: the resumed export keeps the first run's snapshot.
    make_tree(conn, keys)
    drain_all(conn, lake)
    result = export.export_tenant(conn, lake, keys.tenant_id, Lake(str(target)))
    assert result.resumed and len(result.written) == len(result.manifest["tables"]) - 2
    check = export.verify_export(Lake(str(target)))
    assert check.ok, check.findings
    fresh = export.export_tenant(conn, lake, keys.tenant_id, Lake(str(tmp_path / "again")))
    first_rows = {t["name"]: t["rows"] for t in result.manifest["tables"]}
    later_rows = {t["name"]: t["rows"] for t in fresh.manifest["tables"]}
    assert later_rows[BRONZE_EVENTS.name] > first_rows[BRONZE_EVENTS.name]


# --- purge ------------------------------------------------------------------------------------


def neighbour_of(tenant_id: str) -> str:
    """Another tenant id sharing all but the last character with `tenant_id`."""
    last = "1" if tenant_id[-1] != "1" else "2"
    return tenant_id[:-1] + last


def tree_bytes(root: Path, skip: str) -> dict[str, bytes]:
    """Every file under `root` but those under `root/skip/`, with its bytes."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in root.rglob("*")
        if p.is_file() and not str(p.relative_to(root)).startswith(f"{skip}/")
    }


@pytest.fixture
def departing(conn, lake):
    """A populated tenant, a populated neighbour whose id shares all but one character, and
    objects under paths that extend the tenant's id as a string; the tenant then departs with
    ops not yet drained."""
    keys, _, _ = populated(conn, lake, str(uuid.UUID("0f0f0f0f-0000-4000-8000-0000000000a1")))
    other, _, _ = populated(conn, lake, neighbour_of(keys.tenant_id))
    root = Path(lake.root)
    for stray in (f"{keys.tenant_id}0/stray.bin", f"{keys.tenant_id}-old/x/y.bin"):
        (root / stray).parent.mkdir(parents=True, exist_ok=True)
        (root / stray).write_bytes(b"not the tenant's")
    acts.upsert_area(
        conn, keys, str(uuid.uuid4()), path="late", status="development", parent_id=None
    )
    acts.depart(conn, keys)
    return keys.tenant_id, other.tenant_id


def writer_rows(conn, tenant_id: str) -> dict[str, int]:
    return {
        table: conn.execute(
            f"SELECT count(*) FROM oml.{table} WHERE tenant_id = %s", (tenant_id,)
        ).fetchone()[0]
        for table in ("lake_frontier", "lake_verdicts", "lake_dead_letter")
    }


def test_a_purge_is_refused_for_a_tenant_that_has_not_departed(conn, lake):
    keys, _, _ = populated(conn, lake)
    before = tree_bytes(Path(lake.root), "")
    with pytest.raises(TenantNotDeparted, match=keys.tenant_id):
        purge.purge_tenant(conn, lake, keys.tenant_id, by="test")
    assert tree_bytes(Path(lake.root), "") == before
    assert writer_rows(conn, keys.tenant_id)["lake_frontier"] > 0


def test_a_purge_removes_the_prefix_and_the_writer_rows_and_leaves_a_receipt(conn, lake, departing):
    tenant_id, other = departing
    root = Path(lake.root)
    neighbours = tree_bytes(root, tenant_id)
    other_rows = writer_rows(conn, other)
    got = purge.purge_tenant(conn, lake, tenant_id, by="operator")

    assert not (root / tenant_id).exists()
    assert tree_bytes(root, tenant_id) == neighbours
    assert writer_rows(conn, tenant_id) == {
        "lake_frontier": 0,
        "lake_verdicts": 0,
        "lake_dead_letter": 0,
    }
    assert writer_rows(conn, other) == other_rows
    assert got["listing_after"] == [] and got["requested_by"] == "operator"
    assert got["objects"] > 0 and got["bytes"] > 0 and got["log_entries"] > 0
    assert got["writer_rows"]["lake_frontier"] >= 5
    names = {t["name"] for t in got["tables"]}
    assert {"bronze.events", "silver.claims", "gold.areas"} <= names
    # The undrained ops were drained before the inventory: the last area is in gold.areas' count.
    assert got["credentials"] == {**got["credentials"], "own": False, "revocable": False}
    assert purge.receipt(conn, tenant_id) == got
    # Idempotent: a second purge returns the receipt and touches nothing.
    assert purge.purge_tenant(conn, lake, tenant_id, by="someone else") == got
    # The retained outbox never refills the prefix, and the tenant is no longer listed.
    drain_all(conn, lake)
    assert not (root / tenant_id).exists()
    assert tenant_id not in known_tenants(conn) and other in known_tenants(conn)


def test_a_purge_killed_at_random_points_finishes_on_rerun(conn, lake, departing):
    tenant_id, other = departing
    root = Path(lake.root)
    neighbours = tree_bytes(root, tenant_id)
    rng = random.Random(46)

    class Killed(Exception):
        pass

    def killed_at(calls: int):
        seen: list[str] = []

        def step(name: str) -> None:
            seen.append(name)
            if len(seen) == calls:
                raise Killed(name)

        return step

    finished, kills = None, []
    for _ in range(40):  # bounded: a run killed after its first step still gets further
        try:
            finished = purge.purge_tenant(
                conn, lake, tenant_id, by="test", step=killed_at(rng.randint(1, 12))
            )
            break
        except Killed as where:
            kills.append(str(where))
            assert tree_bytes(root, tenant_id) == neighbours
    assert len(kills) >= 3, kills
    assert finished is not None
    assert not (root / tenant_id).exists()
    assert finished["listing_after"] == [] and finished["objects"] > 0
    assert writer_rows(conn, tenant_id)["lake_frontier"] == 0
    assert tree_bytes(root, tenant_id) == neighbours


def purge_state(conn, tenant_id: str) -> str | None:
    row = conn.execute(
        "SELECT state FROM oml.lake_tenant_purge WHERE tenant_id = %s", (tenant_id,)
    ).fetchone()
    return row[0] if row else None


def test_a_purge_command_killed_after_random_delays_finishes_on_rerun(conn, dsn, lake, departing):
    """`oml-lake tenant purge` killed (SIGKILL) at random: first after a random delay (before or
    during its drain), then each time a random moment after its record appears (while it
    deletes). Bounded: six kills at most; then one run to the end."""
    tenant_id, other = departing
    root = Path(lake.root)
    # Probe keys a crashed conditional-put probe left under the prefix: they go too, and they
    # make the deletion long enough to be killed in.
    probes = root / tenant_id / "_oml_probe"
    probes.mkdir(parents=True)
    for i in range(3000):
        (probes / f"{i:05d}").write_bytes(b"first")
    neighbours = tree_bytes(root, tenant_id)
    rng = random.Random(4646)
    command = [sys.executable, "-m", "oml_dagster.cli", "tenant", "purge", "--tenant", tenant_id]
    env = {**os.environ, "OML_PG_DSN": dsn, "OML_LAKE_URI": lake.root}
    states = []
    for attempt in range(6):
        process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        if attempt == 0:
            deadline = time.monotonic() + rng.uniform(0.3, 1.5)
        else:
            deadline = time.monotonic() + 60
            while purge_state(conn, tenant_id) is None and time.monotonic() < deadline:
                time.sleep(0.005)
            deadline = time.monotonic() + rng.uniform(0.0, 0.05)
        while process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.002)
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
        states.append((process.returncode, purge_state(conn, tenant_id)))
        assert tree_bytes(root, tenant_id) == neighbours
        if process.returncode == EXIT_OK:
            break
    # At least one run was killed with its purge under way (recorded, not finished).
    assert (-signal.SIGKILL, purge.PURGING) in states, states
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == EXIT_OK, done.stderr
    made = json.loads(done.stdout)
    assert made["listing_after"] == [] and made["objects"] > 0
    assert not (root / tenant_id).exists()
    assert tree_bytes(root, tenant_id) == neighbours
    assert writer_rows(conn, tenant_id)["lake_frontier"] == 0


def test_a_departed_tenant_past_its_deadline_is_a_breach_until_purged(conn, lake):
    keys = producer.create_tenant(conn, erasure_bound=dt.timedelta(seconds=1))
    make_tree(conn, keys)
    drain_all(conn, lake)
    acts.depart(conn, keys, at=dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1))
    found = purge.overdue_departures(conn)
    assert [d.tenant_id for d in found] == [keys.tenant_id]
    assert keys.tenant_id in found[0].finding()
    assert purge.due_for_purge(conn, dt.timedelta(seconds=30)) == [keys.tenant_id]
    # Half the bound (0.5 s here) when the grace is longer: the purge lands within the bound.
    assert purge.due_for_purge(conn, dt.timedelta(hours=1)) == [keys.tenant_id]
    before = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=2)
    assert purge.due_for_purge(conn, dt.timedelta(seconds=0), now=before) == []
    purge.purge_tenant(conn, lake, keys.tenant_id, by="test")
    assert purge.overdue_departures(conn) == []
    assert purge.due_for_purge(conn, dt.timedelta(seconds=0)) == []


def test_the_purge_record_is_under_row_level_security(conn, lake, writer_conn):
    made = []
    for _ in range(2):
        keys = producer.create_tenant(conn)
        acts.depart(conn, keys)
        purge.purge_tenant(writer_conn, lake, keys.tenant_id, by="writer role")
        made.append(keys.tenant_id)
    first, second = made
    with tenant_scope(writer_conn, first):
        seen = writer_conn.execute("SELECT tenant_id::text FROM oml.lake_tenant_purge").fetchall()
        assert seen == [(first,)]
    with pytest.raises(psycopg.errors.InsufficientPrivilege), tenant_scope(writer_conn, first):
        writer_conn.execute(
            "INSERT INTO oml.lake_tenant_purge (tenant_id, state, requested_by, removed)"
            " VALUES (%s, 'purging', 'x', '{}')",
            (str(uuid.uuid4()),),
        )
    with cross_scope(writer_conn):
        rows = writer_conn.execute("SELECT tenant_id::text FROM oml.lake_tenant_purge").fetchall()
        assert {first, second} <= {r[0] for r in rows}
    with pytest.raises(psycopg.errors.InsufficientPrivilege), cross_scope(writer_conn):
        writer_conn.execute("DELETE FROM oml.lake_tenant_purge WHERE tenant_id = %s", (first,))
    assert purge.receipt(writer_conn, first)["tenant_id"] == first


# --- the command line -------------------------------------------------------------------------


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli_main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_the_tenant_commands_export_verify_and_purge_with_named_exit_codes(
    conn, dsn, lake, tmp_path, capsys
):
    keys, erased, _ = populated(conn, lake)
    tenant_id = keys.tenant_id
    code, _, err = run(capsys, "tenant", "purge", "--tenant", tenant_id)
    assert code == EXIT_USAGE and err.count("\n") == 1 and tenant_id in err
    code, _, err = run(capsys, "tenant", "receipt", "--tenant", tenant_id)
    assert code == EXIT_USAGE and tenant_id in err

    target = tmp_path / "export"
    code, out, _ = run(capsys, "tenant", "export", "--tenant", tenant_id, "--to", str(target))
    assert code == EXIT_OK and json.loads(out)["tables"]["silver.claims"] == 5
    code, out, _ = run(capsys, "tenant", "verify-export", str(target))
    assert code == EXIT_OK and "verifies" in out
    code, _, err = run(capsys, "tenant", "export", "--tenant", tenant_id, "--to", lake.root)
    assert code == EXIT_USAGE and "lake root" in err
    (target / keys.tenant_id / "stray.txt").write_text("x")
    code, out, _ = run(capsys, "tenant", "verify-export", "--json", str(target))
    assert code == EXIT_FINDINGS
    assert json.loads(out)["findings"] == [f"{tenant_id}/stray.txt: not listed in the manifest"]

    acts.depart(conn, keys, at=dt.datetime.now(dt.UTC) - dt.timedelta(days=8))
    for command in ("doctor", "erasure-evidence"):
        code, out, _ = run(capsys, command)
        assert code == EXIT_FINDINGS and f"BREACH: departed tenant {tenant_id}" in out, command
    code, out, _ = run(capsys, "doctor", "--json")
    lines = [json.loads(line) for line in out.splitlines()]
    overdue = [line for line in lines if "departure" in line]
    assert code == EXIT_FINDINGS and [line["tenant_id"] for line in overdue] == [tenant_id]
    assert overdue[0]["ok"] is False and overdue[0]["departure"]["purge_state"] is None
    code, out, _ = run(capsys, "tenant", "purge", "--tenant", tenant_id, "--by", "ops")
    assert code == EXIT_OK
    made = json.loads(out)
    assert made["requested_by"] == "ops" and made["listing_after"] == []
    assert files_holding(Path(lake.root), erased) == []
    code, out, _ = run(capsys, "tenant", "receipt", "--tenant", tenant_id)
    assert code == EXIT_OK and json.loads(out) == made
    code, _, err = run(
        capsys, "tenant", "export", "--tenant", tenant_id, "--to", str(tmp_path / "late")
    )
    assert code == EXIT_USAGE and "nothing of its lake is left" in err
    code, out, _ = run(capsys, "doctor")
    assert code == EXIT_OK and tenant_id not in out


# --- Dagster ----------------------------------------------------------------------------------


def test_the_dagster_jobs_export_and_purge_and_the_partition_is_gone(
    conn, dsn, lake, tmp_path, defs, instance
):
    keys, _, _ = populated(conn, lake)
    tenant_id = keys.tenant_id
    other = producer.create_tenant(conn)
    make_tree(conn, other)
    materialize_partition(defs, instance, "lake_writer_job", tenant_id)
    materialize_partition(defs, instance, "lake_writer_job", other.tenant_id)
    target = tmp_path / "export"
    exported = defs.resolve_job_def("tenant_export_job").execute_in_process(
        partition_key=tenant_id,
        instance=instance,
        run_config={"ops": {"export_tenant": {"config": {"to": str(target)}}}},
    )
    assert exported.success and export.verify_export(Lake(str(target))).ok

    refused = defs.resolve_job_def("tenant_purge_job").execute_in_process(
        partition_key=tenant_id, instance=instance, raise_on_error=False
    )
    assert not refused.success and (Path(lake.root) / tenant_id).exists()

    acts.depart(conn, keys, at=dt.datetime.now(dt.UTC) - dt.timedelta(days=3))
    sensor = defs.get_sensor_def("departure_sensor")
    with build_sensor_context(
        instance_ref=instance.get_ref(), definitions=defs, resources=build_resources()
    ) as context:
        data = sensor.evaluate_tick(context)
    assert [r.partition_key for r in data.run_requests] == [tenant_id]
    request = data.run_requests[0]

    purged = defs.resolve_job_def("tenant_purge_job").execute_in_process(
        partition_key=tenant_id, instance=instance, run_config=request.run_config
    )
    assert purged.success
    assert not (Path(lake.root) / tenant_id).exists()
    assert (Path(lake.root) / other.tenant_id).exists()
    partitions = instance.get_dynamic_partitions(TENANT_PARTITIONS_NAME)
    assert tenant_id not in partitions and other.tenant_id in partitions
    left = instance.get_run_records(RunsFilter(tags={"dagster/partition": tenant_id}))
    # Its purge runs stay (the refused one and the one that purged), every other run is gone.
    assert {r.dagster_run.run_id for r in left} == {refused.run_id, purged.run_id}
    assert instance.get_run_records(RunsFilter(tags={"dagster/partition": other.tenant_id}))
    made = purge.receipt(conn, tenant_id)
    assert made is not None and purged.run_id in made["requested_by"]
    assert made["requested_by"].startswith("departure_sensor")


def test_simulate_depart_marks_tenants_departed_with_a_chained_event(conn, dsn, lake, capsys):
    code, out, _ = run(
        capsys,
        *("simulate", "--tenants", "2", "--claims", "5", "--depart", "1", "--verify"),
        "--no-progress",
    )
    assert code == EXIT_OK, out
    gone = [d.tenant_id for d in purge.departures(conn)]
    assert len(gone) == 1 and f"departed tenant {gone[0]}" in out
    drain_all(conn, lake)
    bronze = lake.open(lake.table_uri(gone[0], BRONZE_EVENTS))
    last = max(read_rows(bronze, BRONZE_EVENTS), key=lambda r: r["journal_seq"])
    assert last["event_type"] == "tenant.departed"
    made = purge.purge_tenant(conn, lake, gone[0], by="test")
    assert made["listing_after"] == [] and made["writer_rows"]["lake_frontier"] >= 4


segment = st.text(alphabet="abcdefghij0123456789-_.", min_size=1, max_size=8).filter(
    lambda s: s not in (".", "..")
)


@settings(max_examples=200, deadline=None)
@given(
    root=st.lists(segment, min_size=1, max_size=3),
    below=st.lists(segment, min_size=0, max_size=3),
    suffix=segment,
    s3=st.booleans(),
)
def test_a_target_under_the_lake_root_is_refused_and_a_sibling_sharing_its_name_is_not(
    root, below, suffix, s3
):
    base = "s3://bucket/" if s3 else "/srv/"
    lake = Lake(base + "/".join(root))
    with pytest.raises(ExportTargetRefused):
        export.refuse_inside_lake(lake, "/".join([lake.root, *below]))
    # A path that extends the root's last name as a string is beside it, not under it.
    export.refuse_inside_lake(lake, lake.root + suffix)
    if s3:
        export.refuse_inside_lake(lake, f"s3://other-bucket/{'/'.join(root)}")
